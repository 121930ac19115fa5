#!/usr/bin/env bash
# Creates target/server-venv with the pinned client-side packages of the
# gdn-server tests (checks/server/requirements.txt): the official openai
# client, pytest, schemathesis. Reinstalls only when the pins change.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
venv=target/server-venv
stamp="$venv/.requirements.sha256"
want=$(sha256sum checks/server/requirements.txt | cut -d' ' -f1)
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r checks/server/requirements.txt
echo "$want" > "$stamp"
