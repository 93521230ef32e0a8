#!/usr/bin/env bash
# Side by side: `tandem serve` and llama.cpp's `llama-server` on the same
# model, threads and workloads, one server at a time, measured by the same
# client (`tandem bench`). Prints one table: output tokens/s and mean TTFT of
# each, and tandem's ratio, per workload (min-max over the repeats).
#
# llama-server is built once from the llama.cpp sources vendored in PyPI's
# llama-cpp-python sdist (pinned below) into $PEER_CACHE (default
# ~/.cache/tandem/peer): a few minutes on 2 cores the first time. Not part of
# ctest; run it on a machine nothing else is using.
#
#   tools/bench/peer_bench.sh                      # every workload, 3 repeats
#   tools/bench/peer_bench.sh --quick              # concurrency 1, short prompts, 1 repeat
#   tools/bench/peer_bench.sh --concurrency "1 16" --repeats 2 --build build-q
#   tools/bench/peer_bench.sh --rounds 2           # half the prompts per client (shorter runs)
set -euo pipefail
cd "$(dirname "$0")/../.."

llama_cpp_python_version=0.3.36
build=build
threads=2
repeats=3
concurrencies="1 16 32 64"
shapes="32:128 512:128"  # input:output tokens; short and long prompts
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
servers="tandem llama"
rounds=4  # prompts per client: each bench sends rounds x concurrency prompts (at least 8)
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --concurrency) concurrencies=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --quick) concurrencies=1; shapes="32:32"; repeats=1; shift ;;
    --only) servers=$2; shift 2 ;;  # tandem or llama: one side (no table)
    *) echo "peer_bench.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
cache=${PEER_CACHE:-$HOME/.cache/tandem/peer}
out=${OUT:-bench-results/peer-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$cache" "$out"
[ -x "$build/bin/tandem" ] || { echo "peer_bench.sh: build $build/bin/tandem first" >&2; exit 1; }
[ -f "$model" ] || { echo "peer_bench.sh: no $model (run tools/setup.sh)" >&2; exit 1; }

# --- llama-server, built once ---------------------------------------------
server_bin=$cache/llama-cpp-python-$llama_cpp_python_version/llama-server
if [[ " $servers " == *" llama "* ]] && [ ! -x "$server_bin" ]; then
  echo "peer_bench.sh: building llama-server from llama-cpp-python $llama_cpp_python_version's sdist (once)"
  src=$cache/src-$llama_cpp_python_version
  rm -rf "$src" && mkdir -p "$src"
  # The sdist itself; its build backend (whose metadata pip prepares) may come as wheels.
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$src" "llama-cpp-python==$llama_cpp_python_version"
  tar -xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
  vendored=$(echo "$src"/llama_cpp_python-*/vendor/llama.cpp)
  cmake -S "$vendored" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON > "$src/cmake.log"
  ninja -C "$src/build" -j "$(nproc)" llama-server > "$src/build.log"
  mkdir -p "$(dirname "$server_bin")"
  cp "$src/build/bin/llama-server" "$server_bin"
fi

# On processors with AMX, llama.cpp moves Q4_1 weights into its AMX buffer,
# whose matmul segfaults in the first decode on some of them (seen on a 2-core
# Xeon VM on 2026-12-05; llama.cpp issue #20824, closed without a fix).
# --no-repack keeps the weights in ggml's own AVX-512/VNNI path instead. For
# Q4_1 on a processor without AMX the flag changes nothing: ggml repacks no
# Q4_1 weight for the CPU, so earlier tables stay comparable.
llama_extra=()
grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && llama_extra=(--no-repack)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits until URL answers 200, or the process PID has died.
wait_ready() {
  local url=$1 pid=$2 log=$3
  for _ in $(seq 1500); do
    curl -sf "$url" > /dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "peer_bench.sh: the server died:" >&2; tail -n 20 "$log" >&2; return 1; }
    sleep 0.2
  done
  echo "peer_bench.sh: $url not ready after 300 s" >&2
  return 1
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# cpu_times PID: "name pid cpu_seconds" for PID and every descendant (utime +
# stime from /proc), so a run can report which process spent the CPU.
cpu_times() {
  python3 - "$1" <<'PY'
import os, sys
ticks = os.sysconf("SC_CLK_TCK")
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        continue
    name = stat[stat.index("(") + 1:stat.rindex(")")]  # cut at 15 characters: prefer argv[0]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            name = os.path.basename(f.read().split(b"\0")[0].decode()) or name
    except OSError:
        pass
    fields = stat[stat.rindex(")") + 2:].split()
    procs[int(pid)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
tree, frontier = set(), {int(sys.argv[1])}
while frontier:
    tree |= frontier
    frontier = {p for p, (_, ppid, _) in procs.items() if ppid in frontier} - tree
for pid in sorted(tree & procs.keys()):
    print(procs[pid][0], pid, procs[pid][2])
PY
}

# run_one SERVER CONCURRENCY INPUT OUTPUT REPEAT: one server alone, one bench.
run_one() {
  local server=$1 c=$2 in=$3 outlen=$4 r=$5
  local port; port=$(free_port)
  local tag=$server-c$c-in$in-out$outlen-r$r
  local pid
  if [ "$server" = tandem ]; then
    "$build/bin/tandem" serve --model "$model" --port "$port" --grpc-port 0 --threads "$threads" \
      --max-num-seqs 64 > "$out/$tag.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port/ready" $pid "$out/$tag.log" || { stop $pid; return 1; }
  else
    # -np 64 slots, each with room for one request's prompt and output.
    "$server_bin" -m "$model" -t "$threads" -np 64 -c $((64 * (in + outlen + 16))) --host 127.0.0.1 \
      --port "$port" "${llama_extra[@]}" > "$out/$tag.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port/health" $pid "$out/$tag.log" || { stop $pid; return 1; }
  fi
  cpu_times $pid > "$out/$tag.cpu-before"
  "$build/bin/tandem" bench --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
    --num-prompts $((rounds * c > 8 ? rounds * c : 8)) --max-concurrency "$c" --random-input-len "$in" \
    --random-output-len "$outlen" --ignore-eos --num-warmups 1 --disable-progress-bar \
    --result-file "$out/$tag.json" > "$out/$tag.txt" 2>&1 || { stop $pid; cat "$out/$tag.txt" >&2; return 1; }
  cpu_times $pid > "$out/$tag.cpu-after"
  stop $pid
}

for shape in $shapes; do
  for c in $concurrencies; do
    for r in $(seq "$repeats"); do
      for server in $servers; do
        echo "peer_bench.sh: $server, concurrency $c, ${shape%%:*} in + ${shape##*:} out, run $r"
        run_one $server "$c" "${shape%%:*}" "${shape##*:}" "$r"
      done
    done
  done
done

[ "$servers" = "tandem llama" ] || { echo "peer_bench.sh: one side only; results in $out"; exit 0; }
python3 - "$out" "$shapes" "$concurrencies" "$repeats" "$threads" <<'PY'
import json, os, sys
out, shapes, concurrencies, repeats, threads = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4]), sys.argv[5]

def runs(server, c, i, o):
    result = []
    for r in range(1, repeats + 1):
        with open(os.path.join(out, f"{server}-c{c}-in{i}-out{o}-r{r}.json")) as f:
            result.append(json.load(f))
    return result

def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else (fmt + "-" + fmt).format(lo, hi)

print(f"\n{threads} threads each, {repeats} run(s) per cell (min-max); output tokens/s and mean TTFT\n")
print("| workload | tandem tok/s | llama.cpp tok/s | ratio | tandem TTFT ms | llama.cpp TTFT ms |")
print("|---|---|---|---|---|---|")
for shape in shapes:
    i, o = shape.split(":")
    for c in concurrencies:
        t, l = runs("tandem", c, i, o), runs("llama", c, i, o)
        tt = [x["output_throughput"] for x in t]
        lt = [x["output_throughput"] for x in l]
        ratios = [a / b for a, b in zip(tt, lt) if b > 0]
        failed = sum(x.get("failed", 0) for x in t + l)
        note = f" ({failed} failed)" if failed else ""
        print(f"| concurrency {c}, {i} in + {o} out{note} | {span(tt, '{:.1f}')} | {span(lt, '{:.1f}')} | "
              f"{span(ratios, '{:.2f}')}x | {span([x['mean_ttft_ms'] for x in t], '{:.0f}')} | "
              f"{span([x['mean_ttft_ms'] for x in l], '{:.0f}')} |")

def cpu_used(server, c, i, o, r):
    """CPU seconds each process of the server spent during run r, by name."""
    tag = os.path.join(out, f"{server}-c{c}-in{i}-out{o}-r{r}")
    def read(suffix):
        with open(f"{tag}.{suffix}") as f:
            return {(name, pid): float(t) for name, pid, t in (line.split() for line in f)}
    before, after = read("cpu-before"), read("cpu-after")
    used = {}
    for (name, pid), t in after.items():
        used[name] = used.get(name, 0.0) + t - before.get((name, pid), 0.0)
    return used

print("\nTPOT p99 and where the CPU went (first run of each cell): CPU seconds per process during the run "
      "(warm-up included), and CPU ms per output token over all of them\n")
print("| workload | tandem TPOT p99 ms | llama.cpp TPOT p99 ms | tandem CPU s by process | tandem CPU ms/token | "
      "llama.cpp CPU ms/token |")
print("|---|---|---|---|---|---|")
for shape in shapes:
    i, o = shape.split(":")
    for c in concurrencies:
        t, l = runs("tandem", c, i, o)[0], runs("llama", c, i, o)[0]
        tu, lu = cpu_used("tandem", c, i, o, 1), cpu_used("llama", c, i, o, 1)
        by_process = ", ".join(f"{name} {sec:.1f}" for name, sec in sorted(tu.items(), key=lambda kv: -kv[1]))
        per_token = lambda used, run: 1000 * sum(used.values()) / max(run["total_output_tokens"], 1)
        print(f"| concurrency {c}, {i} in + {o} out | {t['p99_tpot_ms']:.1f} | {l['p99_tpot_ms']:.1f} | {by_process} | "
              f"{per_token(tu, t):.1f} | {per_token(lu, l):.1f} |")
PY
echo "peer_bench.sh: logs and JSON in $out"
