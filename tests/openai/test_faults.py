"""The HTTP API while the worker group is not whole: a scheduler with no
worker is alive but not ready, and requests wait for the group; a worker
killed mid-request fails what it was running with a clear error (503, or an
error event that ends the stream) while the scheduler stays up; a restarted
worker restores service."""
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import BIN, MODEL, SERVED_NAME


def read_port(path, proc, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}")
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise TimeoutError(path)


def get(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(base, body, timeout=120):
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_status(base, path, status, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if get(base, path)[0] == status:
            return True
        time.sleep(0.1)
    return False


def metric(base, name):
    """The value of sample `name` (unlabelled or model-labelled) in /metrics."""
    for line in get(base, "/metrics")[1].decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_metric(base, name, value, seconds=60):
    """Polls /metrics until sample `name` equals `value`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if metric(base, name) == value:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def scheduler(tmp_path):
    if not os.path.exists(MODEL):
        pytest.skip("model missing")
    log = open(tmp_path / "scheduler.log", "w")
    proc = subprocess.Popen([os.path.join(BIN, "tandem-scheduler"), "--model", MODEL, "--port", "0",
                             "--port-file", str(tmp_path / "port"), "--http-port", "0",
                             "--http-port-file", str(tmp_path / "http_port"), "--served-model-name", SERVED_NAME,
                             "--step-timeout", "10"], stdout=log, stderr=subprocess.STDOUT)
    grpc_port = read_port(tmp_path / "port", proc)
    http_port = read_port(tmp_path / "http_port", proc)
    workers = []

    def start_worker():
        w = subprocess.Popen([os.path.join(BIN, "tandem-worker"), "--scheduler", f"127.0.0.1:{grpc_port}",
                              "--rank", "0", "--world-size", "1", "--model", MODEL, "--kv-cache-memory", "128MiB"],
                             stdout=log, stderr=subprocess.STDOUT)
        workers.append(w)
        return w

    yield f"http://127.0.0.1:{http_port}", start_worker, proc
    for w in workers:
        if w.poll() is None:
            w.kill()
        w.wait()
    assert proc.poll() is None, "the scheduler died"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    log.close()


def test_not_ready_until_the_workers_come_and_waiting_requests_then_run(scheduler):
    base, start_worker, _ = scheduler
    assert get(base, "/health")[0] == 200
    status, body = get(base, "/ready")
    assert status == 503 and json.loads(body)["ready"] is False and json.loads(body)["status"]
    assert "tandem:ready{" in get(base, "/metrics")[1].decode()
    result = {}
    waiting = threading.Thread(target=lambda: result.update(
        answer=post(base, {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})))
    waiting.start()
    # It waits for the group: the engine holds it as waiting, and no answer came.
    assert wait_metric(base, "tandem:num_requests_waiting", 1)
    assert waiting.is_alive()
    start_worker()
    waiting.join(timeout=120)
    status, body = result["answer"]
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 4
    assert get(base, "/ready")[0] == 200


def test_a_killed_worker_fails_its_requests_clearly_and_a_new_one_restores_service(scheduler):
    base, start_worker, scheduler_proc = scheduler
    worker = start_worker()
    assert wait_status(base, "/ready", 200)

    # A streamed and a whole request, both running when the worker dies.
    host, port = base[len("http://"):].split(":")
    import http.client
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    stream = conn.getresponse()
    assert stream.status == 200
    whole = {}
    t = threading.Thread(target=lambda: whole.update(answer=post(
        base, {"prompt": "Hello", "max_tokens": 2000, "ignore_eos": True})))
    t.start()
    first = stream.readline() + stream.readline()
    assert first.startswith(b"data: {")
    # Both must be running when the worker dies, or the test proves nothing
    # about requests in flight.
    assert wait_metric(base, "tandem:num_requests_running", 2)
    worker.kill()
    started = time.time()
    rest = stream.read().decode()  # the stream must end, not hang
    assert time.time() - started < 15
    events = [e for e in rest.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    errors = [json.loads(e[len("data: "):])["error"] for e in events if e.startswith('data: {"error"')]
    assert len(errors) == 1 and errors[0]["code"] == 503 and errors[0]["message"]
    t.join(timeout=15)
    status, body = whole["answer"]
    assert status == 503, body
    assert json.loads(body)["error"]["type"] == "server_error"
    assert scheduler_proc.poll() is None
    assert wait_status(base, "/ready", 503, seconds=10)

    start_worker()
    assert wait_status(base, "/ready", 200)
    status, body = post(base, {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert status == 200 and "Paris" in json.loads(body)["choices"][0]["text"]
