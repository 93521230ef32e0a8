#!/usr/bin/env python3
"""Load test of `tandem serve` (issue 11, item 9): many concurrent streaming
clients for a while, then checks that nothing was lost or leaked.

  tools/bench/serve_load.py --clients 1000 --seconds 60

It makes a tiny random model (`tandem make-model`), starts `tandem serve` on
it, and runs --clients asyncio clients, each sending one streaming
/v1/completions request after another (a new connection each) until
--seconds have passed; every --disconnect-every-th request is dropped by its
client after its first chunk. Then:

  * errors: requests without `data: [DONE]`, with an error event, or a non-200
    answer (dropped ones excepted) -- must be 0;
  * the scheduler's RSS and open file descriptors (/proc) before the load,
    after the first 10 s and once idle after it: descriptors must be back to
    where they started, RSS must not grow past --rss-slack-mib after warm-up;
  * disconnect: --drop clients stream long requests, all hang up at once
    mid-stream; each must be aborted (request_success_total with
    finished_reason "abort" on /metrics), and kv_cache_usage_perc and
    num_requests_running must reach 0 within --free-within seconds.

Prints the figures (also as JSON with --json FILE); exit status 1 when a
check fails. Only the standard library; raises its open-file limit (the
clients' sockets) as the tests do, and `tandem serve` inherits it.
"""
import argparse
import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def http_get(base, path, timeout=5):
    with urllib.request.urlopen(base + path, timeout=timeout) as r:
        return r.status, r.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def aborted(text):
    """tandem:request_success_total{finished_reason="abort"}: requests aborted so far."""
    for line in text.splitlines():
        if line.startswith("tandem:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out.append((int(entry), f.read().split(b"\0")[0].decode()))
        except (OSError, ValueError):
            pass
    return out


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Server:
    """`tandem serve` on the tiny model, ready; stop() ends it."""

    def __init__(self, bin_dir, model, workdir, extra):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(workdir, "serve.log")
        self.log = open(self.log_path, "w")
        args = [os.path.join(bin_dir, "tandem"), "serve", "--model", model, "--port", str(self.port),
                "--grpc-port", "0", "--served-model-name", "tiny", *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"tandem serve exited {self.proc.returncode}; see {self.log_path}")
            try:
                if http_get(self.base, "/ready", timeout=2)[0] == 200:
                    break
            except Exception:
                pass
            time.sleep(0.2)
        else:
            self.stop()
            sys.exit(f"tandem serve did not become ready; see {self.log_path}")
        self.scheduler = next(pid for pid, exe in children(self.proc.pid) if exe.endswith("tandem-scheduler"))

    def metrics(self):
        return http_get(self.base, "/metrics")[1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request_bytes(port, index, max_tokens):
    # Byte-level tokenizer: a short varied text is a prompt of a few dozen tokens.
    prompt = f"request {index}: " + "abcdefghij"[index % 10] * (index % 23 + 5)
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()


async def read_chunks(reader):
    """The chunked body's pieces as they arrive."""
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionError("connection closed inside the body")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def one_request(port, index, max_tokens, drop_after_first):
    """('ok' | 'dropped' | 'error: ...', chunks with text)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_bytes(port, index, max_tokens))
        await writer.drain()
        status = await reader.readline()
        head = b""
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            head += line
        if b" 200 " not in status:
            return f"error: {status.decode().strip()}", 0
        if b"chunked" not in head.lower():
            return "error: the stream is not chunked", 0
        buffer, texts, done = b"", 0, False
        async for piece in read_chunks(reader):
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event[len(b"data: "):] if event.startswith(b"data: ") else b""
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    return f"error: event {chunk['error'].get('message', '')[:80]}", texts
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    texts += 1
                    if drop_after_first:
                        return "dropped", texts
        return ("ok" if done else "error: no [DONE]"), texts
    finally:
        writer.close()


class Load:
    def __init__(self, port, seconds, max_tokens, disconnect_every):
        self.port, self.seconds, self.max_tokens, self.every = port, seconds, max_tokens, disconnect_every
        self.ok = self.dropped = self.chunks = 0
        self.errors = {}
        self.sent = 0

    async def client(self, stop_at):
        while time.monotonic() < stop_at:
            index = self.sent
            self.sent += 1
            drop = self.every > 0 and index % self.every == self.every - 1
            try:
                outcome, chunks = await asyncio.wait_for(
                    one_request(self.port, index, self.max_tokens, drop), timeout=self.seconds + 120)
            except Exception as e:  # a connection error or a hang past the bound
                outcome, chunks = f"error: {type(e).__name__} {e}"[:100], 0
            self.chunks += chunks
            if outcome == "ok":
                self.ok += 1
            elif outcome == "dropped":
                self.dropped += 1
            else:
                self.errors[outcome] = self.errors.get(outcome, 0) + 1


async def run_load(load, clients, on_tick):
    stop_at = time.monotonic() + load.seconds
    tasks = [asyncio.create_task(load.client(stop_at)) for _ in range(clients)]
    started = time.monotonic()
    ticked = False
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        if not ticked and time.monotonic() - started >= 10:
            ticked = True
            on_tick()
    await asyncio.gather(*tasks)


def wait_idle(server, seconds=60):
    """Polls /metrics until nothing runs or waits and KV usage is 0; the time it took, or None."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        text = server.metrics()
        if (metric(text, "tandem:num_requests_running") == 0 and metric(text, "tandem:num_requests_waiting") == 0
                and metric(text, "tandem:kv_cache_usage_perc") == 0):
            return time.monotonic() - start
        time.sleep(0.005)
    return None


async def drop_all_mid_stream(server, count, max_tokens):
    """`count` long streams, all cut at once after each has text; the time until KV usage is 0."""
    opened = []
    for i in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request_bytes(server.port, i, max_tokens))
        opened.append((reader, writer))
    for reader, _ in opened:  # each has its head and a first piece of text
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        while b'"text":""' in (piece := await reader.readline()) or b'"text"' not in piece:
            if not piece:
                break
    text = server.metrics()
    usage_before = metric(text, "tandem:kv_cache_usage_perc")
    running_before = metric(text, "tandem:num_requests_running")
    aborted_before = aborted(text)
    for _, writer in opened:
        writer.transport.abort()  # a reset, as a killed client's kernel sends
    freed_in = await asyncio.to_thread(wait_idle, server, 30)
    # Freed because they were aborted, not because they ran to their end.
    return usage_before, running_before, freed_in, aborted(server.metrics()) - aborted_before


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="load phases of --seconds, each ending idle")
    parser.add_argument("--disconnect-every", type=int, default=10, help="every n-th request is dropped mid-stream")
    parser.add_argument("--drop", type=int, default=100, help="streams cut at once in the disconnect check")
    parser.add_argument("--free-within", type=float, default=1.0)
    parser.add_argument("--rss-slack-mib", type=float, default=16.0)
    parser.add_argument("--kv-cache-memory", default="16MiB",
                        help="the workers' KV cache (small, so that KV usage on /metrics is well above 0)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("serve_args", nargs="*", help="more `tandem serve` flags (after --)")
    args = parser.parse_args()
    limit = raise_file_limit()
    if limit < args.clients + 200:
        sys.exit(f"the open-file limit is {limit}; {args.clients} clients need more")
    with tempfile.TemporaryDirectory(prefix="serve_load_") as workdir:
        model = os.path.join(workdir, "tiny.gguf")
        subprocess.run([os.path.join(args.bin_dir, "tandem"), "make-model", "--output", model, "--context", "512"],
                       check=True, stdout=subprocess.DEVNULL)
        server = Server(args.bin_dir, model, workdir, ["--kv-cache-memory", args.kv_cache_memory, *args.serve_args])
        try:
            return measure(server, args)
        finally:
            server.stop()


def measure(server, args):
    pid = server.scheduler
    figures = {"clients": args.clients, "seconds": args.seconds, "max_tokens": args.max_tokens,
               "rss_mib_start": rss_mib(pid), "fds_start": open_fds(pid)}
    load = Load(server.port, args.seconds, args.max_tokens, args.disconnect_every)

    def tick():
        if "rss_mib_warm" not in figures:
            figures["rss_mib_warm"] = rss_mib(pid)
            figures["fds_under_load"] = open_fds(pid)
    started = time.monotonic()
    # Each round ends idle; RSS after each shows whether memory grows with
    # the requests served (a leak) or stays at its warm level.
    figures["rss_mib_after_round"] = []
    for _ in range(args.rounds):
        asyncio.run(run_load(load, args.clients, tick))
        idle_after = wait_idle(server)
        figures["rss_mib_after_round"].append(rss_mib(pid))
    figures["load_wall_s"] = round(time.monotonic() - started, 1)
    figures["idle_after_load_s"] = idle_after
    usage, running, freed_in, aborts = asyncio.run(drop_all_mid_stream(server, args.drop, 400))
    figures.update({"drop_streams": args.drop, "drop_running_before": running, "drop_kv_usage_before": usage,
                    "drop_freed_in_s": freed_in, "drop_aborted": aborts})
    text = server.metrics()
    # The descriptors of the last dropped connections close as the server
    # notices each; wait for the count to settle before comparing.
    deadline = time.monotonic() + 10
    while open_fds(pid) > figures["fds_start"] and time.monotonic() < deadline:
        time.sleep(0.05)
    figures.update({"requests_ok": load.ok, "requests_dropped": load.dropped, "errors": sum(load.errors.values()),
                    "error_kinds": load.errors, "chunks_with_text": load.chunks,
                    "rss_mib_end": rss_mib(pid), "fds_end": open_fds(pid),
                    "kv_cache_usage_perc_end": metric(text, "tandem:kv_cache_usage_perc"),
                    "http_5xx": sum(float(v) for v in re.findall(r'http_responses_total\{[^}]*code="5\d\d"[^}]*\} (\S+)', text))})
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    failures = []
    if figures["errors"]:
        failures.append(f"{figures['errors']} requests failed: {load.errors}")
    if load.ok == 0:
        failures.append("no request completed")
    if figures["fds_end"] > figures["fds_start"]:
        failures.append(f"file descriptors {figures['fds_start']} -> {figures['fds_end']}")
    if figures["rss_mib_end"] > figures.get("rss_mib_warm", figures["rss_mib_start"]) + args.rss_slack_mib:
        failures.append(f"RSS grew from {figures.get('rss_mib_warm')} to {figures['rss_mib_end']} MiB")
    if idle_after is None:
        failures.append("not idle with KV usage 0 after the load")
    if freed_in is None or freed_in > args.free_within:
        failures.append(f"dropped streams freed their KV in {freed_in} s (bound {args.free_within} s)")
    if aborts != args.drop:
        failures.append(f"{aborts} of the {args.drop} dropped streams were aborted")
    if running < args.drop * 0.5:
        failures.append(f"only {running} of {args.drop} dropped streams were running")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
