"""Bad input, generated: schemathesis fuzzes the OpenAPI document the
server serves (valid and schema-violating bodies for every route), bounded
in time, with every check it has: no 5xx, responses as documented, invalid
requests refused, valid ones accepted. A mismatch between the document and
the server fails the run. The rules the document can only state in words
(the context length, the chat template's) are applied to the valid cases by
fuzz_hooks.py. The server must still be healthy afterwards."""

import os
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx

from conftest import ROOT, Server

ST = Path(sys.executable).parent / "st"
HERE = Path(__file__).resolve().parent


def test_schemathesis_finds_no_mismatch():
    s = Server(log_name="fuzz")
    try:
        report = ROOT / "target" / "schemathesis-junit.xml"
        cmd = [str(ST), "run", s.base + "/openapi.json", "--checks", "all",
               "--max-examples", "40", "--max-time", "120", "--seed", "20261130", "--workers", "1",
               "--request-timeout", "60", "--report", "junit", "--report-junit-path", str(report)]
        env = dict(os.environ, SCHEMATHESIS_HOOKS="fuzz_hooks", PYTHONPATH=str(HERE))
        # cwd=target/: schemathesis keeps a cache folder in its working directory.
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT / "target", env=env)
        print(run.stdout[-12000:])
        print(run.stderr[-3000:])
        assert run.returncode == 0, "schemathesis found failures (see output above)"
        # It really exercised the generation routes.
        text = report.read_text()
        assert "createChatCompletion" in text or "/v1/chat/completions" in text
        assert s.proc.poll() is None, "the server died during fuzzing"
        assert httpx.get(s.base + "/health").status_code == 200
        metrics = s.metrics()
        assert metrics.get('gdn:http_rejections_total{reason="internal_error"}', 0) == 0
    finally:
        s.stop()
