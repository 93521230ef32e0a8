"""Fixtures: a real `tandem serve` (scheduler + worker processes) on SmolLM2.

The binaries come from TANDEM_BIN_DIR (ctest sets it), the model from
TANDEM_MODEL (default: the one tools/setup.sh fetches). Ports are picked free.
"""
import os
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TANDEM_BIN_DIR", os.path.join(ROOT, "build", "bin"))
MODEL = os.environ.get("TANDEM_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
SERVED_NAME = "smollm2"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, extra_args=(), log_name="serve.log", tmp_path=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tmp_path, log_name)
        self.log = open(self.log_path, "w")
        args = [os.path.join(BIN, "tandem"), "serve", "--model", MODEL, "--port", str(self.port),
                "--grpc-port", "0", "--kv-cache-memory", "256MiB", "--served-model-name", SERVED_NAME,
                *extra_args]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tandem serve exited {self.proc.returncode}: {self.logs()}")
            try:
                with urllib.request.urlopen(self.base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("tandem serve did not become ready: " + self.logs())

    def logs(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name):
        """The value of an unlabelled-or-model-labelled sample `name`."""
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _require_model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is missing (run tools/setup.sh)")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    _require_model()
    s = Server(tmp_path=str(tmp_path_factory.mktemp("serve")))
    yield s
    # The process must still be serving after everything the tests did.
    assert s.proc.poll() is None, s.logs()
    s.stop()
    assert s.proc.returncode == 0, s.logs()


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
