"""Bad input, generated: schemathesis fuzzes the OpenAPI document the
server serves (valid and schema-violating bodies for every route), bounded
in time, and no response may be a 5xx; the server must still be healthy
afterwards. A small context keeps generated requests short on the CPU."""

import subprocess
import sys
from pathlib import Path

import httpx2 as httpx

from conftest import ROOT, Server

ST = Path(sys.executable).parent / "st"


def test_schemathesis_finds_no_server_error():
    s = Server("--max-model-len", "32", log_name="fuzz")
    try:
        report = ROOT / "target" / "schemathesis-junit.xml"
        cmd = [str(ST), "run", s.base + "/openapi.json", "--checks", "not_a_server_error",
               "--max-examples", "40", "--max-time", "90", "--seed", "20261130", "--workers", "1",
               "--request-timeout", "60", "--report", "junit", "--report-junit-path", str(report)]
        # cwd=target/: schemathesis keeps a cache folder in its working directory.
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT / "target")
        print(run.stdout[-6000:])
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
