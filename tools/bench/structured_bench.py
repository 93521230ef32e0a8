#!/usr/bin/env python3
"""Structured-output throughput: `tandem serve` on SmolLM2 with 0%, 25% and 100%
of requests constrained by a JSON schema of five fields, 32 in flight, async
scheduling on and off; then structured_mask_bench for the engine thread's mask
cost per step. Not a ctest entry (README "Structured output" has the figures).

  .venv/bin/python3 tools/bench/structured_bench.py [--requests 96] [--concurrency 32] [--max-tokens 64]

Throughput is output tokens over wall time (the machine's load shows in it);
the scheduler's and workers' CPU seconds per output token come from /proc and
do not depend on the load.
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TANDEM_BIN_DIR", os.path.join(ROOT, "build", "bin"))
MODEL = os.environ.get("TANDEM_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "maxLength": 40},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "email", "active"],
}
PROMPTS = ["A customer record as JSON:", "Here is a person:", "User profile:", "Describe someone who lives in Paris:",
           "Employee data:", "Next entry:", "Write a short story about a cat.", "The weather today is"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system seconds of `pid` and its children that are still running."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def post(base, body):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(args, async_on, fraction):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.out, f"serve-{'async' if async_on else 'sync'}-{fraction}.log"), "w")
    proc = subprocess.Popen([os.path.join(BIN, "tandem"), "serve", "--model", MODEL, "--port", str(port), "--grpc-port", "0",
                             "--async-scheduling" if async_on else "--no-async-scheduling",
                             "--max-num-seqs", str(args.concurrency)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            try:
                if urllib.request.urlopen(base + "/ready", timeout=2).status == 200:
                    break
            except Exception:
                time.sleep(0.2)
        structured_every = {0.0: 0, 0.25: 4, 1.0: 1}[fraction]

        def one(i):
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens, "temperature": 0.7,
                    "seed": i}
            if structured_every and i % structured_every == 0:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
            r = post(base, body)
            return r["usage"]["completion_tokens"], "response_format" in body, r["choices"][0]["text"]

        post(base, {"prompt": "warm up", "max_tokens": 4,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}})
        cpu0, t0 = cpu_seconds(proc.pid), time.time()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, range(args.requests)))
        wall, cpu = time.time() - t0, cpu_seconds(proc.pid) - cpu0
        tokens = sum(r[0] for r in results)
        valid = sum(1 for n, s, text in results if s and _valid(text))
        return {"async": async_on, "structured": fraction, "output_tokens": tokens, "wall_s": round(wall, 2),
                "tok_per_s": round(tokens / wall, 1), "cpu_ms_per_token": round(1e3 * cpu / tokens, 2),
                "structured_valid": f"{valid}/{sum(1 for r in results if r[1])}"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _valid(text):
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and set(obj) == set(SCHEMA["required"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=os.path.join(ROOT, "bench-results"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for async_on in (True, False):
        for fraction in (0.0, 0.25, 1.0):
            rows.append(run(args, async_on, fraction))
            print(json.dumps(rows[-1]), flush=True)
    mask = subprocess.run([os.path.join(BIN, "structured_mask_bench"), MODEL, "--json"], capture_output=True, text=True)
    print("mask:", mask.stdout.strip() or mask.stderr.strip())
    print(f"\n| async | structured | output tok/s | CPU ms / output token | valid |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['async'] else 'off'} | {int(100 * r['structured'])}% | {r['tok_per_s']} | "
              f"{r['cpu_ms_per_token']} | {r['structured_valid']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
