#!/usr/bin/env python3
"""The standard gRPC health service (grpc.health.v1) of a real tandem-scheduler
and tandem-worker, asked by a real gRPC health client (tandem-health-probe, the
call Kubernetes' grpc: probes make), on 127.0.0.1.

  worker before its scheduler is up: "" NOT_SERVING, "liveness" SERVING
  scheduler up, group formed:        worker "" SERVING; scheduler "" and "ready" SERVING
  scheduler draining (SIGTERM with a request in flight): "" and "ready" NOT_SERVING
  scheduler gone: the worker exits 1

Usage: health_test.py BIN_DIR WORK_DIR. Bounded: about 5 s; every wait has a deadline.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request

from polling import wait_for

BIN, WORK = sys.argv[1], sys.argv[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port, service=""):
    """SERVING, NOT_SERVING or NO_ANSWER."""
    r = subprocess.run([f"{BIN}/tandem-health-probe", f"--addr=127.0.0.1:{port}", f"--service={service}",
                        "--timeout=2"], capture_output=True, text=True, timeout=10)
    return {0: "SERVING", 1: "NOT_SERVING"}.get(r.returncode, "NO_ANSWER")




def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got}, expected {want}")
    print(f"ok: {what} is {want}")


def main():
    os.makedirs(WORK, exist_ok=True)
    model = f"{WORK}/tiny.gguf"
    subprocess.run([f"{BIN}/tandem", "make-model", f"--output={model}"], check=True, capture_output=True)
    grpc_port, health_port = free_port(), free_port()
    http_port_file = f"{WORK}/http_port"
    if os.path.exists(http_port_file):
        os.remove(http_port_file)
    procs = []
    try:
        worker = subprocess.Popen([f"{BIN}/tandem-worker", f"--model={model}", f"--scheduler=127.0.0.1:{grpc_port}",
                                   f"--health-port={health_port}", "--kv-cache-memory=64MiB", "--threads=1"],
                                  stderr=open(f"{WORK}/worker.log", "w"))
        procs.append(worker)
        wait_for("the worker's health port", lambda: probe(health_port, "liveness") == "SERVING")
        expect("worker '' before its scheduler is up", probe(health_port), "NOT_SERVING")

        scheduler = subprocess.Popen([f"{BIN}/tandem-scheduler", f"--model={model}", f"--port={grpc_port}",
                                      "--http-port=0", f"--http-port-file={http_port_file}", "--shutdown-grace=30"],
                                     stderr=open(f"{WORK}/scheduler.log", "w"))
        procs.append(scheduler)
        wait_for("the worker in a group", lambda: probe(health_port) == "SERVING")
        wait_for("the scheduler ready", lambda: probe(grpc_port, "ready") == "SERVING")
        expect("scheduler ''", probe(grpc_port), "SERVING")
        expect("scheduler 'ready'", probe(grpc_port, "ready"), "SERVING")

        # A request that cannot finish (its worker is stopped) keeps the drain going.
        http_port = int(open(http_port_file).read())
        worker.send_signal(signal.SIGSTOP)
        body = b'{"model": "tiny", "prompt": "a b c", "max_tokens": 8}'
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        threading.Thread(target=lambda: _ignore(lambda: urllib.request.urlopen(request, timeout=60)),
                         daemon=True).start()
        wait_for("the request in flight", lambda: _running(http_port) >= 1)
        scheduler.send_signal(signal.SIGTERM)
        wait_for("the drain", lambda: probe(grpc_port) == "NOT_SERVING")
        expect("scheduler '' while draining", probe(grpc_port), "NOT_SERVING")
        expect("scheduler 'ready' while draining", probe(grpc_port, "ready"), "NOT_SERVING")

        scheduler.kill()
        scheduler.wait(timeout=10)
        worker.send_signal(signal.SIGCONT)
        expect("the worker's exit status once its scheduler is gone", worker.wait(timeout=20), 1)
        print("1 passed, 0 failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


def _ignore(call):
    try:
        call()
    except Exception:
        pass


def _running(http_port):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2).read().decode()
    except Exception:
        return 0
    for line in text.splitlines():
        if line.startswith("tandem:num_requests_running"):
            return float(line.split()[-1])
    return 0


if __name__ == "__main__":
    main()
