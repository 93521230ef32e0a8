#!/usr/bin/env python3
"""Offline validation of deploy/kubernetes/ (the deploy_manifests ctest).

For every overlay, and each overlay with the model-volume component (and the
lws and statefulset overlays with the tls component, given a Secret made here
with openssl, its mount path mapped to those files for --check-flags; every
tandem container must then have --tls-* under the mount, every scheduler
--https-* too and HTTP probes with scheme HTTPS):
  1. `kubectl kustomize` builds it;
  2. every object is validated strictly (unknown fields and wrong types fail)
     against the Kubernetes 1.32 schemas (PyPI kubernetes-validate), and a
     LeaderWorkerSet against the openAPIV3Schema of the vendored LWS v0.9.0 CRD
     (deploy/kubernetes/schemas/), its two pod templates against 1.32's
     PodTemplateSpec;
  3. the wiring: references (ConfigMaps, Secrets, PVCs, Services) exist, every
     $(VAR) resolves, Service/PDB/NetworkPolicy selectors match a pod template and
     named ports exist, the workers cover the ranks with one world size equal to
     the scheduler's pipeline size (a StatefulSet's replicas), workers reach a
     scheduler on its workers' port (--worker-port when it sets one, else
     --port), which is a containerPort and which the NetworkPolicy admits from
     the workers' pods (--worker-port: from tandem's pods only), probes,
     requests equal to limits for workers, the grace period above
     --shutdown-grace, GPUs where --backend cuda runs;
  4. every tandem container's command line, with sample values for the
     variables, is accepted by the real flag parser (`--check-flags`).
Then deliberately broken copies of the manifests must each fail with a message
naming the problem.

Usage: check_manifests.py BIN_DIR DEPLOY_DIR WORK_DIR
Exit 0: all passed; 1: a failure; 77: skipped (kubectl or kubernetes-validate
missing, with the reason).
"""
import copy
import math
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
    import jsonschema
    import referencing
    from kubernetes_validate import utils as kv
except ImportError as e:  # pragma: no cover - the skip path
    print(f"SKIP: {e.name} is missing (tools/setup.sh installs kubernetes-validate into .venv)")
    sys.exit(77)

K8S_VERSION = "1.32.0"
OVERLAYS = ["single-node", "lws", "lws-gpu", "statefulset"]
WITH_COMPONENT = ["single-node", "lws", "statefulset"]  # lws-gpu has it already
WITH_TLS = ["lws", "statefulset"]  # single-node's processes share a pod
TLS_MOUNT = "/etc/tandem/tls/"  # components/tls; --check-flags reads TLS_FILES instead
TLS_FILES = {}  # set by main: the directory of the test's certificates
LWS_CRD = "schemas/leaderworkerset-crd-v0.9.0.yaml"
LWS_VARS = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
VAR = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class BuildError(Exception):
    pass


def kustomize(directory):
    r = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise BuildError(f"kubectl kustomize {directory} failed: {r.stderr.strip()}")
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def name_of(obj):
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


# --- schemas ----------------------------------------------------------------

def strict(schema):
    """The CRD schema as a server with strict field validation applies it:
    unknown fields fail (kubectl's default since 1.27)."""
    if isinstance(schema, dict):
        if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


class Validators:
    def __init__(self, deploy_dir):
        with open(os.path.join(deploy_dir, LWS_CRD)) as f:
            crd = yaml.safe_load(f)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        self.lws = jsonschema.Draft7Validator(strict(copy.deepcopy(version["schema"]["openAPIV3Schema"])))
        self.lws_group = crd["spec"]["group"]
        defs = kv.schema_contents(f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json",
                                  K8S_VERSION)
        registry = referencing.Registry().with_resource(
            defs["$id"], referencing.Resource.from_contents(defs))
        self.pod_template = jsonschema.Draft202012Validator(
            {"$ref": defs["$id"] + "#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}, registry=registry)

    def check(self, obj):
        """Problems of one object, each naming the field."""
        if obj.get("kind") == "LeaderWorkerSet":
            if obj.get("apiVersion") != f"{self.lws_group}/v1":
                return [f"{name_of(obj)}: apiVersion must be {self.lws_group}/v1"]
            problems = [f"{name_of(obj)}: {'.'.join(map(str, e.path))}: {e.message}"
                        for e in self.lws.iter_errors(obj)]
            for role, template in lws_templates(obj):
                problems += [f"{name_of(obj)}: {role}: {'.'.join(map(str, e.path))}: {e.message}"
                             for e in self.pod_template.iter_errors(template)]
            return problems
        try:
            kv.validate(obj, K8S_VERSION, strict=True)
        except kv.ValidationError as e:
            return [f"{name_of(obj)}: {'.'.join(map(str, e.path))}: {e.message}"]
        except kv.SchemaNotFoundError as e:
            return [f"{name_of(obj)}: {e.message}"]
        return []


# --- pods and their containers ---------------------------------------------

def lws_templates(lws):
    t = lws.get("spec", {}).get("leaderWorkerTemplate", {})
    worker = t.get("workerTemplate", {})
    return [("leaderTemplate", t.get("leaderTemplate", worker)), ("workerTemplate", worker)]


class Pod:
    """One pod template and the sample values of what Kubernetes injects."""

    def __init__(self, owner, role, template, injected, index):
        self.owner, self.role, self.template = owner, role, template
        self.injected = injected  # variables LWS injects, with sample values
        self.index = index        # a sample pod index (StatefulSet, LWS worker)
        self.where = f"{name_of(owner)}" + (f" {role}" if role else "")

    @property
    def labels(self):
        return self.template.get("metadata", {}).get("labels", {}) or {}

    @property
    def spec(self):
        return self.template.get("spec", {}) or {}

    def containers(self):
        return self.spec.get("containers", []) or []


def pods_of(objects):
    pods = []
    for obj in objects:
        kind = obj.get("kind")
        if kind in ("Deployment", "StatefulSet"):
            replicas = obj["spec"].get("replicas", 1)
            pods.append(Pod(obj, "", obj["spec"].get("template", {}), {}, max(replicas - 1, 0)))
        elif kind == "LeaderWorkerSet":
            size = obj["spec"].get("leaderWorkerTemplate", {}).get("size", 1)
            for role, template in lws_templates(obj):
                index = 0 if role == "leaderTemplate" else max(size - 1, 1)
                injected = {"LWS_LEADER_ADDRESS": f"{obj['metadata']['name']}-0.{obj['metadata']['name']}.default",
                            "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}
                pods.append(Pod(obj, role, template, injected, index))
    return pods


def cpu_count(quantity):
    q = str(quantity)
    return math.ceil(int(q[:-1]) / 1000) if q.endswith("m") else math.ceil(float(q))


def container_env(pod, c, by_name, problems):
    """Name -> sample value of every variable the container can expand."""
    env = dict(pod.injected)
    for source in c.get("envFrom", []) or []:
        ref = source.get("configMapRef") or source.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        target = by_name.get((kind, ref.get("name")))
        if target is None:
            if not ref.get("optional"):
                problems.append(f"{pod.where}: container {c['name']}: envFrom {kind} {ref.get('name')} does not exist")
            continue
        for key, value in (target.get("data") or {}).items():
            env[source.get("prefix", "") + key] = str(value)
    for e in c.get("env", []) or []:
        value_from = e.get("valueFrom")
        if value_from is None:
            # A value may itself use earlier variables.
            env[e["name"]] = VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(e.get("value", "")))
        elif "fieldRef" in value_from:
            path = value_from["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                env[e["name"]] = "10.0.0.7"
            elif path == "metadata.labels['apps.kubernetes.io/pod-index']":
                if pod.owner.get("kind") != "StatefulSet":
                    problems.append(f"{pod.where}: container {c['name']}: {e['name']} reads the pod-index label, "
                                    "which only StatefulSet pods have")
                env[e["name"]] = str(pod.index)
            else:
                env[e["name"]] = "sample"
        elif "resourceFieldRef" in value_from:
            ref = value_from["resourceFieldRef"]
            limit = (c.get("resources", {}).get("limits", {}) or {}).get("cpu")
            if ref.get("resource") == "limits.cpu" and limit is None:
                problems.append(f"{pod.where}: container {c['name']}: {e['name']} reads limits.cpu, which is not set")
            env[e["name"]] = str(cpu_count(limit) if limit is not None else 1)
        elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
            kind = "ConfigMap" if "configMapKeyRef" in value_from else "Secret"
            ref = value_from.get("configMapKeyRef") or value_from.get("secretKeyRef")
            target = by_name.get((kind, ref.get("name")))
            if target is None or ref.get("key") not in (target.get("data") or {}):
                problems.append(f"{pod.where}: container {c['name']}: {e['name']} refers to {kind} "
                                f"{ref.get('name')} key {ref.get('key')}, which does not exist")
            env[e["name"]] = str((target or {}).get("data", {}).get(ref.get("key"), "sample"))
    return env


def flags_of(args):
    """--name=value and --name value forms -> {name: value} (a bare flag: "")."""
    flags, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            name, value = a[2:].split("=", 1)
            flags[name] = value
        elif a.startswith("--"):
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[a[2:]] = args[i + 1]
                i += 1
            else:
                flags[a[2:]] = ""
        i += 1
    return flags


def program(c):
    command = c.get("command") or []
    return os.path.basename(command[0]) if command else ""


class Tandem:
    """A tandem container: its raw flags and the flags with sample values."""

    def __init__(self, pod, c, env, problems):
        self.pod, self.c, self.program = pod, c, program(c)
        args = list(c.get("command", [])[1:]) + list(c.get("args", []) or [])
        for a in args:
            for var in VAR.findall(a):
                if var not in env:
                    problems.append(f"{pod.where}: container {c['name']}: $({var}) in '{a}' is not defined "
                                    "(no env, envFrom or injected variable of that name)")
        self.raw = flags_of(args)
        self.args = [VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in args]
        self.flags = flags_of(self.args)

    def int_flag(self, name, default):
        """The flag's value as a number; None when it is not one (an unresolved variable, reported already)."""
        try:
            value = float(self.flags.get(name, default))
        except ValueError:
            return None
        return int(value) if value == int(value) else value


# --- wiring -----------------------------------------------------------------

def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_wiring(overlay, objects, problems):
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    pods = pods_of(objects)
    tandems = []
    for pod in pods:
        for c in pod.containers():
            env = container_env(pod, c, by_name, problems)
            if program(c) in ("tandem-scheduler", "tandem-worker"):
                tandems.append(Tandem(pod, c, env, problems))
        for v in pod.spec.get("volumes", []) or []:
            for key, kind, field in (("configMap", "ConfigMap", "name"), ("secret", "Secret", "secretName"),
                                     ("persistentVolumeClaim", "PersistentVolumeClaim", "claimName")):
                if key in v and (kind, v[key].get(field)) not in by_name:
                    problems.append(f"{pod.where}: volume {v['name']}: {kind} {v[key].get(field)} does not exist")
        mounts = {m["name"] for c in pod.containers() for m in c.get("volumeMounts", []) or []}
        for name in mounts - {v["name"] for v in pod.spec.get("volumes", []) or []}:
            problems.append(f"{pod.where}: volumeMount {name} has no volume")
    check_selectors(objects, pods, problems)
    check_group(overlay, objects, pods, tandems, by_name, problems)
    return tandems


def check_selectors(objects, pods, problems):
    for obj in objects:
        kind = obj["kind"]
        if kind == "Service":
            selector = obj["spec"].get("selector")
            matched = [p for p in pods if matches(selector, p.labels)]
            if not matched:
                problems.append(f"{name_of(obj)}: selector {selector} matches no pod template")
            for port in obj["spec"].get("ports", []):
                target = port.get("targetPort", port["port"])
                ok = any(cp.get("name") == target or cp.get("containerPort") == target
                         for p in matched for c in p.containers() for cp in c.get("ports", []) or [])
                if matched and not ok:
                    problems.append(f"{name_of(obj)}: targetPort {target} is no port of the pods it selects")
        elif kind in ("PodDisruptionBudget", "NetworkPolicy"):
            spec = obj["spec"]
            selector = (spec.get("selector") or spec.get("podSelector") or {}).get("matchLabels")
            if not any(matches(selector, p.labels) for p in pods):
                problems.append(f"{name_of(obj)}: selector {selector} matches no pod template")
        elif kind in ("Deployment", "StatefulSet"):
            selector = obj["spec"]["selector"].get("matchLabels")
            if not matches(selector, obj["spec"]["template"].get("metadata", {}).get("labels", {})):
                problems.append(f"{name_of(obj)}: selector {selector} does not match its own pod template")
        elif kind == "LeaderWorkerSet" and ("Service", obj["metadata"]["name"]) in {
                (o["kind"], o["metadata"]["name"]) for o in objects}:
            problems.append(f"{name_of(obj)}: a Service has the LeaderWorkerSet's name, which LWS takes for its "
                            "headless Service")


def scheduler_for(worker, tandems, by_name, problems):
    """The scheduler container this worker's --scheduler reaches, or None."""
    raw = worker.raw.get("scheduler", "")
    target = worker.flags.get("scheduler", "")
    host, _, port = target.rpartition(":")
    schedulers = [t for t in tandems if t.program == "tandem-scheduler"]
    where = f"{worker.pod.where}: container {worker.c['name']}"
    if host in ("127.0.0.1", "localhost"):
        found = [s for s in schedulers if s.pod is worker.pod]
        if not found:
            problems.append(f"{where}: --scheduler={raw} but no scheduler runs in the same pod")
    elif raw.startswith("$(LWS_LEADER_ADDRESS)"):
        found = [s for s in schedulers if s.pod.owner is worker.pod.owner and s.pod.role == "leaderTemplate"]
        if not found:
            problems.append(f"{where}: --scheduler={raw} but the leader pod runs no scheduler")
    else:
        service = by_name.get(("Service", host.split(".")[0]))
        if service is None:
            problems.append(f"{where}: --scheduler={raw}: no Service {host.split('.')[0]} (a dangling reference)")
            return None
        found = [s for s in schedulers if matches(service["spec"].get("selector"), s.pod.labels)]
        if not found:
            problems.append(f"{where}: --scheduler={raw}: Service {host} selects no scheduler")
        if not service["spec"].get("publishNotReadyAddresses"):
            problems.append(f"{where}: --scheduler={raw}: Service {host} must set publishNotReadyAddresses "
                            "(the scheduler is Ready only once every worker has joined)")
        if str(port) not in {str(p["port"]) for p in service["spec"].get("ports", [])}:
            problems.append(f"{where}: --scheduler={raw}: Service {host} has no port {port}")
    for s in found:
        expected, flag = workers_port(s)
        if expected is not None and str(expected) != str(port):
            problems.append(f"{where}: --scheduler={raw} but the scheduler listens for workers on port {expected} "
                            f"(its --{flag})")
        if expected is not None and host not in ("127.0.0.1", "localhost"):
            check_admitted(s, expected, worker.pod, by_name, problems, where=f"{where} (--scheduler={raw})")
    return found[0] if found else None


def workers_port(scheduler):
    """(the port the scheduler's workers must dial, the flag that sets it): --worker-port when it sets one
    (tandem-scheduler serves the workers there and nowhere else), else --port. (None, ...) if unresolved."""
    if scheduler.int_flag("worker-port", -1) is None:
        return None, "worker-port"
    if scheduler.int_flag("worker-port", -1) >= 0:
        return scheduler.int_flag("worker-port", -1), "worker-port"
    return scheduler.int_flag("port", 50051), "port"


def ingress_rules(pod, by_name):
    """The ingress rules of the NetworkPolicies that select the pod; None when none does (all admitted)."""
    policies = [o for o in by_name.values() if o["kind"] == "NetworkPolicy"
                and matches((o["spec"].get("podSelector") or {}).get("matchLabels"), pod.labels)
                and "Ingress" in o["spec"].get("policyTypes", ["Ingress"])]
    if not policies:
        return None
    return [rule for o in policies for rule in o["spec"].get("ingress", []) or []]


def rule_ports(rule, container, number):
    """Whether the rule's ports include TCP `number` of the container (by number or by its port's name)."""
    names = {cp.get("name") for cp in container.get("ports", []) or [] if cp.get("containerPort") == number}
    for p in rule.get("ports") or [{}]:  # none listed: every port
        if p.get("protocol", "TCP") != "TCP":
            continue
        port = p.get("port")
        if port is None or port == number or port in names or (
                isinstance(port, int) and port <= number <= p.get("endPort", port)):
            return True
    return False


def tandem_peer(peer, pods):
    """A `from` entry that admits only pods of this deployment (a podSelector in the policy's namespace)."""
    selector = (peer.get("podSelector") or {}).get("matchLabels")
    return set(peer) == {"podSelector"} and bool(selector) and any(matches(selector, p.labels) for p in pods)


def check_admitted(scheduler, port, worker_pod, by_name, problems, where):
    """The NetworkPolicies that select the scheduler's pod admit the worker's pod on `port`."""
    rules = ingress_rules(scheduler.pod, by_name)
    if rules is None:
        return
    for rule in rules:
        peers = rule.get("from") or []
        if rule_ports(rule, scheduler.c, port) and (not peers or any(
                matches((peer.get("podSelector") or {}).get("matchLabels"), worker_pod.labels)
                and "ipBlock" not in peer for peer in peers)):
            return
    problems.append(f"{where}: no NetworkPolicy rule admits the worker's pod {worker_pod.where} to the "
                    f"scheduler's port {port}")


def check_scheduler_ports(t, where, pods, by_name, problems):
    """--port and --worker-port are containerPorts, distinct; the workers' port admits tandem's pods only."""
    numbers = {cp.get("containerPort") for cp in t.c.get("ports", []) or []}
    port, worker_port = t.int_flag("port", 50051), t.int_flag("worker-port", -1)
    for flag, n in (("port", port), ("worker-port", worker_port)):
        if n is not None and n > 0 and n not in numbers:
            problems.append(f"{where}: --{flag}={n} but the container declares no containerPort {n}")
    if worker_port is None or worker_port < 0:
        return
    if worker_port == 0:
        problems.append(f"{where}: --worker-port=0 (any free port) in a manifest: the workers could not know it")
    if worker_port == port:
        problems.append(f"{where}: --worker-port and --port are both {port}: they must differ (gRPC's "
                        "SO_REUSEPORT would share one port's connections between the two servers)")
    for rule in ingress_rules(t.pod, by_name) or []:
        if rule_ports(rule, t.c, worker_port) and not all(tandem_peer(p, pods) for p in rule.get("from") or [{}]):
            problems.append(f"{where}: a NetworkPolicy rule admits the workers' port {worker_port} from outside "
                            f"tandem's pods (from: {rule.get('from', 'anywhere')})")


def check_group(overlay, objects, pods, tandems, by_name, problems):
    workers = [t for t in tandems if t.program == "tandem-worker"]
    for t in tandems:
        where = f"{t.pod.where}: container {t.c['name']}"
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in t.c:
                problems.append(f"{where}: no {probe}")
        check_probe_ports(t, where, problems)
        if t.program == "tandem-scheduler":
            check_scheduler_ports(t, where, pods, by_name, problems)
            grace = t.int_flag("shutdown-grace", 30)  # unresolved: reported above
            if grace is not None and t.pod.spec.get("terminationGracePeriodSeconds", 30) <= grace:
                problems.append(f"{where}: terminationGracePeriodSeconds must exceed --shutdown-grace ({grace:g})")
            annotations = t.pod.template.get("metadata", {}).get("annotations", {}) or {}
            if annotations.get("prometheus.io/scrape") != "true" or \
                    annotations.get("prometheus.io/port") != str(t.flags.get("http-port", 8000)):
                problems.append(f"{where}: the pod needs prometheus.io/scrape and prometheus.io/port annotations "
                                "for /metrics")
            continue
        for flag in ("rank", "world-size", "scheduler", "comm-host", "comm-port", "health-port"):
            if flag not in t.raw:
                problems.append(f"{where}: the worker has no --{flag}")
        resources = t.c.get("resources", {})
        if resources.get("requests") != resources.get("limits") or not resources.get("limits"):
            problems.append(f"{where}: a worker's requests must equal its limits (Guaranteed QoS)")
        gpu = int((resources.get("limits") or {}).get("nvidia.com/gpu", 0))
        if t.flags.get("backend") == "cuda" and gpu < 1:
            problems.append(f"{where}: --backend=cuda without an nvidia.com/gpu limit")
        if "gpu" in overlay and (t.flags.get("backend") != "cuda" or gpu < 1):
            problems.append(f"{where}: a GPU overlay's worker needs --backend=cuda and nvidia.com/gpu")
        scheduler = scheduler_for(t, tandems, by_name, problems)
        if scheduler is not None and t.int_flag("world-size", 1) != scheduler.int_flag("pipeline-parallel-size", 1):
            problems.append(f"{where}: --world-size {t.flags.get('world-size')} differs from the scheduler's "
                            f"--pipeline-parallel-size {scheduler.flags.get('pipeline-parallel-size')}")
    check_ranks(workers, problems)


def check_probe_ports(t, where, problems):
    names = {p.get("name") for p in t.c.get("ports", []) or []}
    numbers = {p.get("containerPort") for p in t.c.get("ports", []) or []}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        spec = t.c.get(probe) or {}
        if "grpc" in spec:
            port = spec["grpc"]["port"]
            serving = t.int_flag("health-port", -1) if t.program == "tandem-worker" else t.int_flag("port", 50051)
            if port != serving:
                problems.append(f"{where}: {probe} asks gRPC health on port {port}, the process serves it on "
                                f"{serving}")
        for kind in ("httpGet", "tcpSocket"):
            if kind in spec:
                port = spec[kind]["port"]
                if port not in names and port not in numbers:
                    problems.append(f"{where}: {probe} port {port} is no port of the container")


def check_ranks(workers, problems):
    """Every group's ranks 0..W-1, once each."""
    by_owner = {}
    for w in workers:
        by_owner.setdefault(id(w.pod.owner), []).append(w)
    for group in by_owner.values():
        owner = group[0].pod.owner
        kind = owner["kind"]
        if kind == "LeaderWorkerSet":
            size = owner["spec"]["leaderWorkerTemplate"].get("size", 1)
            for w in group:
                if "rank" in w.raw and w.raw["rank"] != "$(LWS_WORKER_INDEX)":
                    problems.append(f"{w.pod.where}: --rank must be $(LWS_WORKER_INDEX), got {w.raw['rank']}")
                if w.raw.get("world-size") not in ("$(LWS_GROUP_SIZE)", str(size)):
                    problems.append(f"{w.pod.where}: --world-size must be $(LWS_GROUP_SIZE) (size {size})")
            roles = {w.pod.role for w in group}
            if size > 1 and roles != {"leaderTemplate", "workerTemplate"}:
                problems.append(f"{name_of(owner)}: rank 0 runs in the leader pod and ranks 1..size-1 in the "
                                f"worker pods; found workers only in {sorted(roles)}")
        elif kind == "StatefulSet":
            replicas = owner["spec"].get("replicas", 1)
            for w in group:
                if w.int_flag("world-size", 1) != replicas:
                    problems.append(f"{w.pod.where}: --world-size {w.flags.get('world-size')} differs from the "
                                    f"StatefulSet's replicas {replicas}")
                if "rank" in w.raw and w.flags.get("rank") != str(w.pod.index):
                    problems.append(f"{w.pod.where}: --rank must come from the pod-index label, got "
                                    f"{w.raw['rank']}")
        else:
            replicas = owner["spec"].get("replicas", 1)
            ranks = sorted(w.int_flag("rank", 0) for w in group)
            size = group[0].int_flag("world-size", 1)
            if replicas != 1 or ranks != list(range(size or 0)):
                problems.append(f"{name_of(owner)}: ranks {ranks} of world size {size} in {replicas} replica(s): "
                                "each rank must run exactly once")


def check_command_lines(bin_dir, tandems, problems):
    accepted = 0
    for t in tandems:
        args = [a.replace(TLS_MOUNT, TLS_FILES.get("dir", TLS_MOUNT)) for a in t.args]
        r = subprocess.run([os.path.join(bin_dir, t.program), "--check-flags"] + args,
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            problems.append(f"{t.pod.where}: container {t.c['name']}: {t.program} refuses its arguments: "
                            f"{r.stderr.strip()}")
        else:
            accepted += 1
    return accepted


# --- driver -----------------------------------------------------------------

def check_build(directory, overlay, bin_dir, validators):
    """Problems of one kustomization; a summary line when there are none."""
    try:
        objects = kustomize(directory)
    except BuildError as e:
        return [str(e)], ""
    problems = []
    for obj in objects:
        problems += validators.check(obj)
    if problems:
        return problems, ""  # the wiring checks read fields of the types the schemas promise
    tandems = check_wiring(overlay, objects, problems)
    if overlay.endswith("+tls"):
        for t in tandems:
            missing = [f for f in ("tls-cert", "tls-key", "tls-ca") if not t.flags.get(f, "").startswith(TLS_MOUNT)]
            if missing:
                problems.append(f"{t.pod.where}: container {t.c['name']}: no --{', --'.join(missing)} under {TLS_MOUNT}")
            if t.program != "tandem-scheduler":
                continue
            # HTTPS on the API: the flags, and the kubelet's HTTP probes must speak it.
            missing = [f for f in ("https-cert", "https-key") if not t.flags.get(f, "").startswith(TLS_MOUNT)]
            if missing:
                problems.append(f"{t.pod.where}: container {t.c['name']}: no --{', --'.join(missing)} under {TLS_MOUNT}")
            for probe in ("readinessProbe", "livenessProbe"):
                get = t.c.get(probe, {}).get("httpGet")
                if get is not None and get.get("scheme") != "HTTPS":
                    problems.append(f"{t.pod.where}: container {t.c['name']}: {probe} must use scheme HTTPS "
                                    "with --https-cert")
    accepted = check_command_lines(bin_dir, tandems, problems)
    kinds = sorted({o["kind"] for o in objects})
    return problems, (f"{len(objects)} objects ({', '.join(kinds)}) valid and wired; "
                      f"{accepted} command lines accepted")


def with_component(work, deploy_dir, overlay):
    d = os.path.join(work, f"{overlay}+model-volume")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kustomization.yaml"), "w") as f:
        yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                        "resources": [os.path.relpath(os.path.join(deploy_dir, "overlays", overlay), d)],
                        "components": [os.path.relpath(os.path.join(deploy_dir, "components", "model-volume"), d)]},
                       f)
    return d


def make_tls_files(work):
    """A CA and one certificate signed by it (what a user puts in the Secret tandem-tls)."""
    d = os.path.join(work, "tls") + "/"
    os.makedirs(d, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (["req", "-x509", *ec, "-keyout", d + "ca.key", "-out", d + "ca.crt", "-days", "2", "-subj", "/CN=ca"],
                 ["req", "-x509", *ec, "-keyout", d + "tls.key", "-out", d + "tls.crt", "-days", "2",
                  "-subj", "/CN=tandem", "-CA", d + "ca.crt", "-CAkey", d + "ca.key",
                  "-addext", "subjectAltName=DNS:tandem-scheduler-internal,IP:127.0.0.1"]):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)
    TLS_FILES["dir"] = d


def with_tls(work, deploy_dir, overlay):
    d = os.path.join(work, f"{overlay}+tls")
    os.makedirs(d, exist_ok=True)
    for n in ("tls.crt", "tls.key", "ca.crt"):  # kustomize reads files only below the kustomization
        shutil.copy(os.path.join(TLS_FILES["dir"], n), d)
    with open(os.path.join(d, "kustomization.yaml"), "w") as f:
        yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                        "resources": [os.path.relpath(os.path.join(deploy_dir, "overlays", overlay), d)],
                        "components": [os.path.relpath(os.path.join(deploy_dir, "components", "tls"), d)],
                        # The name as a user's Secret has it (kustomize would not rename it in a LeaderWorkerSet).
                        "generatorOptions": {"disableNameSuffixHash": True},
                        "secretGenerator": [{"name": "tandem-tls", "files": ["tls.crt", "tls.key", "ca.crt"]}]},
                       f)
    return d


# Broken copies: (overlay, file, text, replacement, what the failure must name);
# a list of (file, text, replacement) for several edits.
BROKEN = [
    ("lws", "overlays/lws/leaderworkerset.yaml", "            readinessProbe:", "            readinesProbe:",
     "'readinesProbe' was unexpected"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "    size: 2", "    size: two", "'two' is not of type 'integer'"),
    ("statefulset", "overlays/statefulset/workers.yaml", "  podManagementPolicy: Parallel",
     "  podManagementPolicy: Parallel\n  minReadySeconds: soon", "minReadySeconds"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "                  name: tandem-config",
     "                  name: tandem-settings", "ConfigMap tandem-settings does not exist"),
    ("statefulset", "overlays/statefulset/workers.yaml", "--scheduler=tandem-scheduler-internal:50053",
     "--scheduler=tandem-sched:50053", "no Service tandem-sched"),
    ("single-node", "base/service.yaml", "    app.kubernetes.io/component: scheduler\n  ports:",
     "    app.kubernetes.io/component: api\n  ports:", "matches no pod template"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "              - --rank=$(LWS_WORKER_INDEX)\n", "",
     "the worker has no --rank"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "--max-num-seqs=$(MAX_NUM_SEQS)", "--max-num-seqs=$(MAX_SEQS)",
     "$(MAX_SEQS) in '--max-num-seqs=$(MAX_SEQS)' is not defined"),
    ("statefulset", "overlays/statefulset/workers.yaml", "--world-size=WORLD_SIZE", "--world-size=2",
     "--world-size"),
    # replicas no longer copied into the workers' world size
    ("statefulset", [("overlays/statefulset/kustomization.yaml", "    count: 2", "    count: 3"),
                     ("overlays/statefulset/kustomization.yaml", "          name: tandem-worker\n        fieldPaths:",
                      "          name: tandem-workers\n        fieldPaths:"),
                     ("overlays/statefulset/workers.yaml", "--world-size=WORLD_SIZE", "--world-size=2")],
     None, None, "--world-size 2 differs from the StatefulSet's replicas 3"),
    ("lws-gpu", "overlays/lws-gpu/gpu-patch.yaml", "- op: add\n  path: /spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/resources/limits/nvidia.com~1gpu\n  value: 1\n", "",
     "nvidia.com/gpu"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "--comm-port=50100", "--comm-port=501000",
     "flag --comm-port must be in [0, 65535], got 501000"),
    ("lws", "overlays/lws/leaderworkerset.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 20",
     "terminationGracePeriodSeconds must exceed --shutdown-grace"),
    # The workers' own port (tandem-scheduler --worker-port): workers must dial it, not --port ...
    ("lws", "overlays/lws/leaderworkerset.yaml", "--scheduler=$(LWS_LEADER_ADDRESS):50053",
     "--scheduler=$(LWS_LEADER_ADDRESS):50051", "but the scheduler listens for workers on port 50053 (its --worker-port)"),
    ("single-node", "overlays/single-node/deployment.yaml", "--scheduler=127.0.0.1:50053", "--scheduler=127.0.0.1:50051",
     "but the scheduler listens for workers on port 50053 (its --worker-port)"),
    # ... and --port when the scheduler sets none
    ("statefulset", "overlays/statefulset/scheduler.yaml", "            - --worker-port=50053\n", "",
     "but the scheduler listens for workers on port 50051 (its --port)"),
    ("statefulset", "overlays/statefulset/scheduler.yaml",
     "            - name: workers\n              containerPort: 50053\n", "",
     "--worker-port=50053 but the container declares no containerPort 50053"),
    ("lws", "base/networkpolicy.yaml", "        - protocol: TCP\n          port: 50053\n", "",
     "no NetworkPolicy rule admits the worker's pod LeaderWorkerSet/tandem workerTemplate to the scheduler's port 50053"),
    ("statefulset", "base/networkpolicy.yaml", "          port: 8000\n",
     "          port: 8000\n        - protocol: TCP\n          port: 50053\n",
     "a NetworkPolicy rule admits the workers' port 50053 from outside tandem's pods"),
    ("single-node", "overlays/single-node/deployment.yaml", "- --worker-port=50053", "- --worker-port=50051",
     "--worker-port and --port are both 50051: they must differ"),
    ("single-node", "overlays/single-node/deployment.yaml", "- --worker-port=50053", "- --worker-port=0",
     "--worker-port=0 (any free port) in a manifest"),
]


def break_copy(deploy_dir, work, i, case):
    overlay, rel, text, replacement, _ = case
    edits = rel if isinstance(rel, list) else [(rel, text, replacement)]
    d = os.path.join(work, f"broken-{i}")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(deploy_dir, d)
    for rel, text, replacement in edits:
        path = os.path.join(d, rel)
        with open(path) as f:
            content = f.read()
        if text not in content:
            raise AssertionError(f"broken copy {i}: '{text[:60]}' is not in {rel} (update BROKEN)")
        content = content.replace(text, replacement, 1)  # the first occurrence only
        with open(path, "w") as f:
            f.write(content)
    return d


def main():
    bin_dir, deploy_dir, work = (os.path.abspath(a) for a in sys.argv[1:4])
    if shutil.which("kubectl") is None:
        print("SKIP: kubectl is not installed (its kustomize v5 builds the overlays)")
        return 77
    os.makedirs(work, exist_ok=True)
    validators = Validators(deploy_dir)
    passed = failed = 0
    builds = [(os.path.join(deploy_dir, "overlays", o), o) for o in OVERLAYS]
    builds += [(with_component(work, deploy_dir, o), o + "+model-volume") for o in WITH_COMPONENT]
    if shutil.which("openssl"):
        make_tls_files(work)
        builds += [(with_tls(work, deploy_dir, o), o + "+tls") for o in WITH_TLS]
    else:
        print("note: openssl is not installed: the tls component is not checked")
    for directory, overlay in builds:
        problems, summary = check_build(directory, overlay, bin_dir, validators)
        if problems:
            failed += 1
            print(f"FAIL: {overlay}:\n  " + "\n  ".join(problems))
        else:
            passed += 1
            print(f"ok: {overlay}: {summary}")
    for i, case in enumerate(BROKEN):
        overlay, rel, _, _, expected = case
        rel = rel if isinstance(rel, str) else ", ".join(sorted({e[0] for e in rel}))
        copy_dir = break_copy(deploy_dir, work, i, case)
        problems, _ = check_build(os.path.join(copy_dir, "overlays", overlay), overlay, bin_dir, validators)
        named = [p for p in problems if expected in p]
        if named:
            passed += 1
            print(f"ok: broken copy {i} ({rel}) fails: {named[0]}")
        else:
            failed += 1
            print(f"FAIL: broken copy {i} ({rel}) should fail naming '{expected}'; problems: {problems}")
        shutil.rmtree(copy_dir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
