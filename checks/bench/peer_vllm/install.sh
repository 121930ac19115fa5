#!/usr/bin/env bash
# Copied from ../shared/peer-vllm/install.sh (2026-12-03, outside this
# repository); changed: the parts are checked against parts.sha256 first, and
# pip replaces what an interrupted install left (--upgrade).
# Called by checks/bench/peer_vllm.sh's install phase.
# On the H200: the parts of fetch.sh already copied to $STASH (default /tmp/peerstash).
# Installs vLLM and its carried dependencies into /tmp/site without touching the machine's torch.
set -euo pipefail
PY=${PY:-python3}; STASH=${STASH:-/tmp/peerstash}
(cd "$STASH" && sha256sum -c --quiet parts.sha256)
mkdir -p /tmp/peer /tmp/site
cat "$STASH"/part?? | tar -xf - -C /tmp/peer
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/peer/whl/*.whl
for d in torch triton numpy transformers tokenizers; do rm -rf "/tmp/site/$d"; done  # keep the machine's own
cd /tmp && PYTHONPATH=/tmp/site "$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
cd /tmp && PYTHONPATH=/tmp/site "$PY" -c 'import vllm.entrypoints.openai.api_server; print("vllm api_server imports")'
