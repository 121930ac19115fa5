"""Starts real gdn-server processes on loopback for the tests.

GDN_SERVER_BIN names the binary (default target/debug/gdn-server); the
server runs the embedded demo model on the CPU executor.
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package itself uses
import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("GDN_SERVER_BIN", ROOT / "target" / "debug" / "gdn-server"))
MODEL = "gdn-demo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra_args, log_name="server"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = ROOT / "target" / f"gdn-server-test-{log_name}-{self.port}.log"
        self.log = open(self.log_path, "w")
        args = [str(BINARY), "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", *extra_args]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gdn-server exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"gdn-server not healthy in 120 s: {self.log_path.read_text()}")
            time.sleep(0.2)

    def metrics(self):
        """Prometheus text -> {series (name plus labels): value}."""
        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                out[series] = float(value)
        return out

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--max-model-len", "1024", "--max-request-bytes", "65536", log_name="main")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
