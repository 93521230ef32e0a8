#!/usr/bin/env python3
"""Mutual TLS between a real tandem-scheduler and tandem-worker on 127.0.0.1, with
a CA and certificates made here by openssl (what a Kubernetes Secret would mount):

  --tls-* flags: all three or none, each a readable file, refused naming the flag
  a worker whose certificate another CA signed: refused by the scheduler (its log
      says the handshake failed), the worker exits 1 naming TLS
  a worker that does not trust the scheduler's CA: exits 1 naming the TLS handshake
  a plaintext worker (no --tls-*): exits 1 within seconds saying the scheduler
      requires TLS, instead of waiting for ever
  the scheduler stays up and a worker with a good certificate forms the group:
      /ready answers 200 and a completion comes back
  HTTPS on the API port (--https-cert/--https-key): the completion above goes
      over HTTPS, checked against the test CA by Python's ssl; a plaintext
      request to that port gets a clear 400 and the server serves on; a client
      that does not trust the CA fails its handshake
  tandem serve with the same --tls-* for all its processes, --https-* and 2
      pipeline stages (so the worker-to-worker channel is TLS too): ready; `tandem
      generate --connect` with a client certificate gets the greedy ids of the
      plaintext in-process engine, and without one fails within seconds

Usage: tls_test.py BIN_DIR WORK_DIR. Bounded: about 15 s; every wait has a deadline.
"""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

from polling import wait_for

BIN, WORK = sys.argv[1], sys.argv[2]


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def make_ca(name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{WORK}/{name}.key", "-out", f"{WORK}/{name}.crt", "-days", "2", "-subj", f"/CN={name}")


def make_leaf(name, ca, san):
    base = f"{WORK}/{name}"
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{base}.key",
            "-out", f"{base}.csr", "-subj", f"/CN={name}")
    with open(f"{base}.ext", "w") as f:
        f.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{base}.csr", "-CA", f"{WORK}/{ca}.crt", "-CAkey", f"{WORK}/{ca}.key",
            "-CAcreateserial", "-out", f"{base}.crt", "-days", "2", "-extfile", f"{base}.ext")


def tls_flags(leaf, ca):
    return [f"--tls-cert={WORK}/{leaf}.crt", f"--tls-key={WORK}/{leaf}.key", f"--tls-ca={WORK}/{ca}.crt"]




def check(what, condition, detail=""):
    if not condition:
        raise AssertionError(f"{what}: {detail}")
    print(f"ok: {what}")


def check_flags():
    """--check-flags with broken --tls-* sets: exit 2 naming the flag."""
    cert, key, ca = f"{WORK}/worker.crt", f"{WORK}/worker.key", f"{WORK}/ca.crt"
    cases = [
        ("no --tls-ca", [f"--tls-cert={cert}", f"--tls-key={key}"], "--tls-ca"),
        ("no --tls-key", [f"--tls-cert={cert}", f"--tls-ca={ca}"], "--tls-key"),
        ("a missing CA file", [f"--tls-cert={cert}", f"--tls-key={key}", f"--tls-ca={WORK}/absent.crt"], "--tls-ca"),
        ("an unresolved $(CERT)", ["--tls-cert=$(CERT)", f"--tls-key={key}", f"--tls-ca={ca}"], "--tls-cert"),
    ]
    # The worker starts slower (its backends): one case there; worker_flags_test has the rest.
    for binary, binary_cases in (("tandem-scheduler", cases), ("tandem-worker", cases[2:3])):
        for why, args, flag in binary_cases:
            r = subprocess.run([f"{BIN}/{binary}", "--check-flags", *args], capture_output=True, text=True, timeout=30)
            check(f"{binary} refuses {why}, naming {flag}",
                  r.returncode == 2 and flag in r.stderr, f"rc {r.returncode}, {r.stderr!r}")
        r = subprocess.run([f"{BIN}/{binary}", "--check-flags", *tls_flags("worker", "ca")], capture_output=True,
                           text=True, timeout=30)
        check(f"{binary} accepts all three", r.returncode == 0, r.stderr)


HTTPS = None  # ssl.SSLContext trusting the test CA, set by main


def ready(http_port):
    try:
        return urllib.request.urlopen(f"https://127.0.0.1:{http_port}/ready", timeout=2,
                                      context=HTTPS).status == 200
    except Exception:
        return False


def check_https(http_port):
    """A plaintext request to the HTTPS port, and a client distrusting the CA."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=10)
        check("plaintext HTTP to the HTTPS port is refused", False, "it was answered 2xx")
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        check("plaintext HTTP to the HTTPS port gets 400 naming HTTPS",
              e.code == 400 and "HTTPS" in body and '"error"' in body, f"{e.code} {body!r}")
    # Garbage that is neither TLS nor HTTP: the connection just closes.
    with socket.create_connection(("127.0.0.1", http_port), timeout=10) as sock:
        sock.sendall(b"\x00" * 64)
        sock.settimeout(10)
        while sock.recv(4096):
            pass
    distrustful = ssl.create_default_context()  # the system's CAs, not ours
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{http_port}/ready", timeout=10, context=distrustful)
        check("a client that does not trust the CA fails", False, "it connected")
    except urllib.error.URLError as e:
        check("a client that does not trust the CA fails its handshake",
              isinstance(e.reason, ssl.SSLCertVerificationError), repr(e))
    check("the HTTPS API still serves after them", ready(http_port))


def check_serve(model):
    """tandem serve with TLS everywhere and PP=2; tandem generate --connect with and without a certificate."""
    log_path = f"{WORK}/serve.log"
    serve = subprocess.Popen([f"{BIN}/tandem", "serve", f"--model={model}", "--port=0", "--grpc-port=0",
                              "--pipeline-parallel-size=2", "--kv-cache-memory=64MiB", "--threads=1",
                              *tls_flags("scheduler", "ca"), f"--https-cert={WORK}/scheduler.crt",
                              f"--https-key={WORK}/scheduler.key"],
                             stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), start_new_session=True)
    try:
        def ready_line():
            text = open(log_path).read()
            return "ready: OpenAI API on" in text or serve.poll() is not None
        wait_for("tandem serve ready with TLS", ready_line, 60)
        text = open(log_path).read()
        check("tandem serve forms a TLS group of 2 stages", serve.poll() is None and "mutual TLS" in text, text)
        target = text.split("gRPC on ")[1].split()[0]
        check("its workers' channel is TLS", text.count("worker channel: mutual TLS") == 2, text)
        generate = [f"{BIN}/tandem", "generate", "--prompt=a b c", "--max-tokens=8", "--ignore-eos", "--json"]
        remote = subprocess.run([*generate, f"--connect={target}", *tls_flags("worker", "ca")],
                                capture_output=True, text=True, timeout=60)
        check("tandem generate --connect with a client certificate", remote.returncode == 0, remote.stderr)
        local = subprocess.run([*generate, f"--model={model}", "--pipeline-parallel-size=2", "--threads=1",
                                "--kv-cache-memory=64MiB"], capture_output=True, text=True, timeout=60, check=True)
        ids = [json.loads(r.stdout.strip().splitlines()[-1])["ids"] for r in (remote, local)]
        check("its greedy ids equal the plaintext in-process engine's", ids[0] == ids[1] and len(ids[0]) == 8, ids)
        bare = subprocess.run([*generate, f"--connect={target}"], capture_output=True, text=True, timeout=30)
        check("tandem generate --connect without a certificate fails", bare.returncode != 0, bare.stderr)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    model = f"{WORK}/tiny.gguf"
    subprocess.run([f"{BIN}/tandem", "make-model", f"--output={model}"], check=True, capture_output=True)
    make_ca("ca")
    make_ca("other")
    make_leaf("scheduler", "ca", "IP:127.0.0.1")
    make_leaf("worker", "ca", "DNS:worker")
    make_leaf("rogue", "other", "DNS:worker")
    check_flags()
    global HTTPS
    HTTPS = ssl.create_default_context(cafile=f"{WORK}/ca.crt")

    port_file, http_port_file = f"{WORK}/port", f"{WORK}/http_port"
    procs = []

    def worker(name, leaf, ca):
        p = subprocess.Popen([f"{BIN}/tandem-worker", f"--model={model}", f"--scheduler=127.0.0.1:{grpc_port}",
                              "--kv-cache-memory=64MiB", "--threads=1", *(tls_flags(leaf, ca) if leaf else [])],
                             stderr=open(f"{WORK}/{name}.log", "w"))
        procs.append(p)
        return p

    try:
        scheduler = subprocess.Popen([f"{BIN}/tandem-scheduler", f"--model={model}", "--port=0",
                                      f"--port-file={port_file}", "--http-port=0",
                                      f"--http-port-file={http_port_file}", *tls_flags("scheduler", "ca"),
                                      f"--https-cert={WORK}/scheduler.crt", f"--https-key={WORK}/scheduler.key"],
                                     stderr=open(f"{WORK}/scheduler.log", "w"))
        procs.append(scheduler)
        wait_for("the scheduler's ports", lambda: os.path.exists(http_port_file) and os.path.getsize(http_port_file))
        grpc_port = int(open(port_file).read())
        http_port = int(open(http_port_file).read())

        # The refusals at once: each takes a few of gRPC's reconnect attempts.
        rogue = worker("rogue", "rogue", "ca")
        distrustful = worker("distrustful", "worker", "other")
        plaintext = worker("plaintext", None, None)
        for name, p in (("rogue", rogue), ("distrustful", distrustful), ("plaintext", plaintext)):
            code = p.wait(timeout=30)
            log = open(f"{WORK}/{name}.log").read()
            check(f"the {name} worker exits 1 naming TLS", code == 1 and "TLS" in log, f"rc {code}, log {log!r}")
        check("the distrustful worker names the failed handshake",
              "TLS handshake" in open(f"{WORK}/distrustful.log").read())
        check("the plaintext worker says the scheduler requires TLS",
              "requires TLS" in open(f"{WORK}/plaintext.log").read())
        scheduler_log = open(f"{WORK}/scheduler.log").read()
        check("the scheduler's log says it refused a handshake", "Handshake failed" in scheduler_log, scheduler_log)
        check("the scheduler is still up and not ready", scheduler.poll() is None and not ready(http_port))

        good = worker("good", "worker", "ca")
        wait_for("the group formed over TLS", lambda: ready(http_port) or good.poll() is not None)
        check("a worker with a good certificate forms the group", ready(http_port),
              open(f"{WORK}/good.log").read())
        # ignore_eos: the tiny random model samples its EOS now and then, which is
        # not what this checks (it failed about one run in ten on a busy machine).
        body = json.dumps({"model": "tiny", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True}).encode()
        request = urllib.request.Request(f"https://127.0.0.1:{http_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=30, context=HTTPS))
        check("a generation over TLS, asked over HTTPS", answer["usage"]["completion_tokens"] == 4, answer)
        check_https(http_port)
        answer = json.load(urllib.request.urlopen(request, timeout=30, context=HTTPS))
        check("another completion over HTTPS after them", answer["usage"]["completion_tokens"] == 4, answer)
        check_serve(model)
        print("1 passed, 0 failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
