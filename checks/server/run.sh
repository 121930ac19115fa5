#!/usr/bin/env bash
# gdn-server end to end, no GPU: real server processes on loopback (the
# embedded demo on the CPU executor) driven by the official openai client
# (test_openai_client.py), structured outputs and forced tool calls
# through the openai client and langchain (test_structured.py), the
# Messages API through the anthropic client (test_anthropic_client.py), a
# schemathesis fuzz of the served OpenAPI document (test_fuzz.py) and a
# load/disconnect-storm run (test_load.py).
# Extra arguments go to pytest (e.g. -k stop).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
checks/server/setup_venv.sh
cargo build -q -p gdn-server
GDN_SERVER_BIN=target/debug/gdn-server target/server-venv/bin/pytest -q -p no:cacheprovider checks/server "$@"
