#!/usr/bin/env python3
"""Multi-host test: one tandem group across Linux network namespaces, run with the
arguments of deploy/kubernetes/overlays/lws (ctest label multihost).

Layout (every address lives only inside namespaces this test creates; the root
namespace gets none, and every client call runs through `ip netns exec`):

  switch   a bridge; one veth pair per node below, their other ends in the node
  leader   10.77.0.1  the LWS leader pod: tandem-scheduler + tandem-worker rank 0
  worker1  10.77.0.2  tandem-worker rank 1
  worker2  10.77.0.3  tandem-worker rank 2
  client   10.77.0.9  the HTTP client (the cluster's Service traffic)
  solo     lo only    single-host `tandem serve` on the same model, the reference

The containers' command lines come from `kubectl kustomize overlays/lws` with
size 3 and LWS's variables set as LWS sets them (the leader's address, the pod
IP, the group size, the worker index); so the workers dial the scheduler's own
workers' port (--worker-port 50053), as the overlay has them. The test plays
the kubelet: a worker that exits is started again (restartPolicy Always; the
LWS restartPolicy is None).

Checks: greedy completions through the group's HTTP API equal `tandem serve`'s;
with worker2's link down a streaming request in flight fails with an error that
says why and /ready answers 503; with the link back the group forms again
(/ready 200, the leader's worker and worker1 never restarted) and the same
requests give the same text. Namespaces and processes are removed on every exit
path (normal, failure, SIGTERM from ctest's timeout).

With --tls (ctest multihost_tls_test) the lws overlay is built with
components/tls, the Secret's files are a CA and one certificate made here by
openssl (naming the leader's address), and the whole group runs with mutual TLS
on the gRPC streams and the worker-to-worker channel and serves HTTPS (the
client trusts the CA); the greedy completions must still equal plaintext
`tandem serve`'s, and the partition and its recovery
behave the same (the group re-forms over new TLS connections).

Usage: multihost_test.py BIN_DIR DEPLOY_DIR WORK_DIR [--tls]. Exit 77 (skipped)
when not root, without `ip netns`, or without kubectl (or openssl, with --tls).
Bounded: about 15 s each.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from polling import wait_for

SUBNET = "10.77.0"
NODES = {"leader": 1, "worker1": 2, "worker2": 3, "client": 9}
PROMPTS = ["The capital of France is", "1 2 3 4", "tandem runs on"]
GRPC, HTTP = 50051, 8000


# --- the client mode: runs inside a namespace --------------------------------

def client(argv):
    """--client METHOD URL [BODY] [--stream]: prints the status, then the body."""
    import ssl
    import urllib.error
    import urllib.request
    method, url = argv[0], argv[1]
    # HTTPS (--tls): trust the test's CA, which the parent names.
    context = ssl.create_default_context(cafile=os.environ["TANDEM_TEST_CA"]) if url.startswith("https") else None
    body = argv[2].encode() if len(argv) > 2 and argv[2] != "--stream" else None
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as r:
            print(r.status, flush=True)
            for line in r:
                print(line.decode().rstrip("\n"), flush=True)
    except urllib.error.HTTPError as e:
        print(e.code)
        print(e.read().decode())
    except Exception as e:  # the connection itself failed
        print(0)
        print(f"{type(e).__name__}: {e}")


# --- namespaces ---------------------------------------------------------------

def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


class Net:
    def __init__(self, tag):
        self.tag = tag
        self.made = []

    def ns(self, name):
        return f"{self.tag}-{name}"

    def veth(self, name):
        return f"{self.tag[-6:]}{name[0]}{name[-1]}"  # <= 15 characters

    def up(self):
        for name in ["switch", "solo", *NODES]:
            sh("ip", "netns", "add", self.ns(name))
            self.made.append(self.ns(name))
            sh("ip", "-n", self.ns(name), "link", "set", "lo", "up")
        sw = self.ns("switch")
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for name, host in NODES.items():
            outer = self.veth(name)
            # Made inside the switch namespace, so not even for a moment in the root one.
            sh("ip", "-n", sw, "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", self.ns(name))
            sh("ip", "-n", sw, "link", "set", outer, "master", "br0", "up")
            sh("ip", "-n", self.ns(name), "addr", "add", f"{SUBNET}.{host}/24", "dev", "eth0")
            sh("ip", "-n", self.ns(name), "link", "set", "eth0", "up")

    def link(self, name, state):
        sh("ip", "-n", self.ns("switch"), "link", "set", self.veth(name), state)

    def down(self):
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made = []


# --- the group ----------------------------------------------------------------

TLS_MOUNT = "/etc/tandem/tls/"  # where components/tls mounts the Secret tandem-tls


def make_tls_files(work):
    """What a user puts in the Secret: a CA and one certificate for every pod
    (serverAuth and clientAuth; it names the leader's address and 127.0.0.1)."""
    d = os.path.join(work, "tls") + "/"
    os.makedirs(d, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (["req", "-x509", *ec, "-keyout", d + "ca.key", "-out", d + "ca.crt", "-days", "2", "-subj", "/CN=ca"],
                 ["req", "-x509", *ec, "-keyout", d + "tls.key", "-out", d + "tls.crt", "-days", "2",
                  "-subj", "/CN=tandem", "-CA", d + "ca.crt", "-CAkey", d + "ca.key",
                  "-addext", f"subjectAltName=IP:{SUBNET}.{NODES['leader']},IP:127.0.0.1",
                  "-addext", "extendedKeyUsage=serverAuth,clientAuth"]):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)
    return d


def lws_commands(deploy_dir, work, tls):
    """(leader containers, worker container): (program, args) with $(VAR) kept;
    with `tls`, the overlay with components/tls and its mount made the test's
    certificate directory."""
    import yaml
    target = os.path.join(deploy_dir, "overlays", "lws")
    if tls:
        target = os.path.join(work, "lws+tls")
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "kustomization.yaml"), "w") as f:
            yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "resources": [os.path.relpath(os.path.join(deploy_dir, "overlays", "lws"), target)],
                            "components": [os.path.relpath(os.path.join(deploy_dir, "components", "tls"), target)]},
                           f)
    r = subprocess.run(["kubectl", "kustomize", target], capture_output=True, text=True, timeout=60, check=True)
    if tls:
        r.stdout = r.stdout.replace(TLS_MOUNT, make_tls_files(work))
        os.environ["TANDEM_TEST_CA"] = os.path.join(work, "tls", "ca.crt")  # for the client mode
    objects = [o for o in yaml.safe_load_all(r.stdout) if o]
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    def of(template):
        return [(c["command"][0], c.get("args", [])) for c in template["spec"]["containers"]]
    return config, of(lws["leaderTemplate"]), of(lws["workerTemplate"])[0]


def expand(args, values):
    out = []
    for a in args:
        def sub(m):
            if m.group(1) not in values:
                raise KeyError(f"$({m.group(1)}) in {a} has no value in this test")
            return values[m.group(1)]
        out.append(re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, a))
    return out


class Group:
    """The processes, each started with `ip netns exec`, restarted like a kubelet would."""

    def __init__(self, bin_dir, work, net):
        self.bin_dir, self.work, self.net = bin_dir, work, net
        self.procs = {}      # name -> Popen
        self.argv = {}       # name -> argv
        self.starts = {}     # name -> times started
        self.restart = set()  # names restarted when they exit
        self.lock = threading.Lock()
        self.stopping = False

    def start(self, name, ns, argv, restart=False):
        with self.lock:
            self.argv[name] = (ns, argv)
            self.starts[name] = self.starts.get(name, 0) + 1
            log = open(os.path.join(self.work, f"{name}.log"), "a")
            self.procs[name] = subprocess.Popen(["ip", "netns", "exec", self.net.ns(ns), *argv],
                                                stdout=log, stderr=log, start_new_session=True)
            if restart:
                self.restart.add(name)

    def supervise(self):
        while not self.stopping:
            for name in list(self.restart):
                p = self.procs[name]
                if p.poll() is not None and not self.stopping:
                    self.start(name, *self.argv[name])
            time.sleep(0.1)

    def stop(self):
        self.stopping = True
        with self.lock:
            # Everything in our namespaces is ours (tandem serve's children
            # too, which run in process groups of their own).
            for ns in self.net.made:
                for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in self.procs.values():
                p.wait()


def call(net, ns, method, url, body=None):
    argv = ["ip", "netns", "exec", net.ns(ns), sys.executable, __file__, "--client", method, url]
    if body is not None:
        argv.append(json.dumps(body))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    status, _, text = r.stdout.partition("\n")
    return int(status or 0), text




def completions(net, ns, base):
    texts = []
    for prompt in PROMPTS:
        status, text = call(net, ns, "POST", f"{base}/v1/completions",
                            {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0})
        if status != 200:
            raise AssertionError(f"completion at {base}: {status} {text}")
        texts.append(json.loads(text)["choices"][0]["text"])
    return texts


def run(bin_dir, deploy_dir, work, net, group, tls):
    model = os.path.join(work, "tiny.gguf")
    subprocess.run([f"{bin_dir}/tandem", "make-model", f"--output={model}", "--layers=3", "--context=4096",
                    "--weight-scale=0.2"],
                   check=True, capture_output=True)
    config, leader, worker = lws_commands(deploy_dir, work, tls)
    # The overlay puts the workers on the scheduler's own workers' port (--worker-port; health_test and
    # tls_test keep the workers on --port): every worker must dial it.
    scheduler_args = next(args for program, args in leader if program.endswith("scheduler"))
    worker_port = next((a.split("=", 1)[1] for a in scheduler_args if a.startswith("--worker-port=")), None)
    dials = [a for _, args in [*leader, worker] for a in args if a.startswith("--scheduler=")]
    assert worker_port and len(dials) == 2 and all(a.endswith(f":{worker_port}") for a in dials), \
        f"the lws overlay's workers do not dial the scheduler's --worker-port ({worker_port}): {dials}"
    if tls:
        assert all("--tls-ca=" in " ".join(args) for _, args in [*leader, worker]), "components/tls added no flags"
    config = dict(config, MODEL_PATH=model, KV_CACHE_MEMORY="64MiB")
    leader_ip = f"{SUBNET}.{NODES['leader']}"
    def values(node, index):
        return dict(config, LWS_LEADER_ADDRESS=leader_ip, LWS_GROUP_SIZE="3", LWS_WORKER_INDEX=str(index),
                    POD_IP=f"{SUBNET}.{NODES[node]}", CPU_LIMIT="1")
    for program, args in leader:
        group.start(f"leader-{os.path.basename(program)}", "leader",
                    [f"{bin_dir}/{os.path.basename(program)}", *expand(args, values("leader", 0))],
                    restart=program.endswith("worker"))
    for index, node in ((1, "worker1"), (2, "worker2")):
        group.start(node, node, [f"{bin_dir}/{os.path.basename(worker[0])}", *expand(worker[1], values(node, index))],
                    restart=True)
    # The single-host reference, on its own loopback.
    group.start("solo", "solo", [f"{bin_dir}/tandem", "serve", f"--model={model}", "--port=8000", "--grpc-port=50051",
                                 "--kv-cache-memory=64MiB", "--threads=1"])
    threading.Thread(target=group.supervise, daemon=True).start()

    base = f"{'https' if tls else 'http'}://{leader_ip}:{HTTP}"
    wait_for("the group ready (/ready 200 from the client namespace)",
             lambda: call(net, "client", "GET", f"{base}/ready")[0] == 200, 30)
    wait_for("tandem serve ready", lambda: call(net, "solo", "GET", "http://127.0.0.1:8000/ready")[0] == 200, 30)
    with open(os.path.join(work, "leader-tandem-scheduler.log")) as f:  # appended to by earlier runs: the last
        listening = ([l.strip() for l in f if "listening on" in l] or [""])[-1]
    assert f"on port {worker_port};" in listening, f"the scheduler does not serve its workers on {worker_port}: {listening}"
    print(f"ok: {listening}")
    reference = completions(net, "solo", "http://127.0.0.1:8000")
    got = completions(net, "client", base)
    assert got == reference, f"multi-host {got} != single-host {reference}"
    print(f"ok: 3 greedy completions across 3 namespaces{' over TLS' if tls else ''} equal tandem serve's: {got}")
    if tls:
        for log in ("leader-tandem-worker", "worker1", "worker2"):
            with open(os.path.join(work, f"{log}.log")) as f:
                text = f.read()
            assert "worker channel: mutual TLS" in text, f"{log} does not use TLS between workers: {text[-500:]}"
        print("ok: every worker's channel to the others is mutual TLS")

    # A partition with a request in flight.
    stream = subprocess.Popen(
        ["ip", "netns", "exec", net.ns("client"), sys.executable, __file__, "--client", "POST",
         f"{base}/v1/completions", json.dumps({"model": "tiny", "prompt": "a", "max_tokens": 4000, "stream": True,
                                               "ignore_eos": True, "temperature": 0}), "--stream"],
        stdout=subprocess.PIPE, text=True)
    lines = [stream.stdout.readline(), stream.stdout.readline()]  # the status, the first event
    assert lines[0].strip() == "200" and lines[1].startswith("data:"), f"the stream did not start: {lines}"
    net.link("worker2", "down")
    try:
        rest, _ = stream.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        stream.kill()
        raise AssertionError("the request in flight neither failed nor ended within 30 s of the partition")
    events = [l for l in rest.splitlines() if l.startswith("data:")]
    errors = [l for l in events if '"error"' in l]
    assert errors and "worker rank 2" in errors[0], f"the request did not fail clearly: {events[-3:]}"
    print(f"ok: the request in flight failed: {errors[0][:200]}")
    status, text = call(net, "client", "GET", f"{base}/ready")
    wait_for("/ready 503", lambda: call(net, "client", "GET", f"{base}/ready")[0] == 503, 20)
    print(f"ok: /ready is 503 during the partition: {call(net, 'client', 'GET', f'{base}/ready')[1].strip()[:200]}")

    net.link("worker2", "up")
    wait_for("the group ready again", lambda: call(net, "client", "GET", f"{base}/ready")[0] == 200, 40)
    got = completions(net, "client", base)
    assert got == reference, f"after the partition {got} != {reference}"
    survivors = {n: group.starts[n] for n in ("leader-tandem-worker", "worker1")}
    assert all(v == 1 for v in survivors.values()), f"a survivor restarted: {survivors}"
    print(f"ok: link restored: /ready 200, the same completions; worker2 started {group.starts['worker2']} "
          f"time(s), the others once")


def remove_stale_namespaces():
    """What an earlier run killed with SIGKILL (a ctest timeout) could not remove:
    namespaces named by this test whose process is gone, and what runs in them."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(tdm(\d+)-[a-z0-9]+)", line)
        if not m:
            continue
        try:
            with open(f"/proc/{m.group(2)}/cmdline", "rb") as f:
                if b"multihost_test" in f.read():
                    continue  # a run in progress
        except OSError:
            pass
        for pid in sh("ip", "netns", "pids", m.group(1), check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        sh("ip", "netns", "del", m.group(1), check=False)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2:])
        return 0
    bin_dir, deploy_dir, work = (os.path.abspath(a) for a in sys.argv[1:4])
    tls = "--tls" in sys.argv[4:]
    if os.geteuid() != 0:
        print("SKIP: network namespaces need root")
        return 77
    if subprocess.run(["which", "kubectl"], capture_output=True).returncode != 0:
        print("SKIP: kubectl is not installed (the test runs the arguments of the built lws overlay)")
        return 77
    if tls and subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        print("SKIP: openssl is not installed (it makes the test's certificates)")
        return 77
    os.makedirs(work, exist_ok=True)
    remove_stale_namespaces()
    net = Net(f"tdm{os.getpid() % 100000}")
    probe = f"{net.tag}-probe"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        print("SKIP: cannot create a network namespace here (ip netns add failed)")
        return 77
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    group = Group(bin_dir, work, net)
    # ctest's timeout sends SIGTERM: clean up on it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        net.up()
        started = time.monotonic()
        run(bin_dir, deploy_dir, work, net, group, tls)
        print(f"1 passed, 0 failed ({time.monotonic() - started:.1f} s)")
        return 0
    except AssertionError as e:
        print(f"FAIL: {e}")
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name)) as f:
                    print(f"--- {name} (last lines)\n" + "".join(f.readlines()[-8:]))
        print("0 passed, 1 failed")
        return 1
    finally:
        group.stop()
        net.down()


if __name__ == "__main__":
    sys.exit(main())
