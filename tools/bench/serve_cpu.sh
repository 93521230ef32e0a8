#!/usr/bin/env bash
# The scheduler process's CPU and context switches per generated token under
# `tandem serve` at concurrency 1 (README, Control plane: "Concurrency 1").
# Starts `tandem serve` on free ports, sends 2 warm-up requests, then reads
# every scheduler thread's utime+stime and voluntary switches
# (/proc/PID/task/*) around `tandem bench --max-concurrency 1` with
# --ignore-eos, and prints the figures per token with the served TPOT median.
# CPU time, not wall time: the VM is shared. Alternate builds to compare.
#
#   tools/bench/serve_cpu.sh                    # 8 requests x 128 tokens
#   PROMPTS=16 TOKENS=256 TANDEM_BIN_DIR=build-x/bin tools/bench/serve_cpu.sh [tandem serve flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${TANDEM_BIN_DIR:-build/bin}
prompts=${PROMPTS:-8}
tokens=${TOKENS:-128}
source tools/bench/serve_lib.sh
port=$(free_port)
log=$(mktemp)
result=$(mktemp)
start_serve "$bin" "$log" "$port" --grpc-port "$(free_port)" "$@"
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true; rm -f "$log" "$result"' EXIT
scheduler=$(pgrep -P $serve -f tandem-scheduler | head -1)
bench() { "$bin/tandem" bench --base-url "http://127.0.0.1:$port" --max-concurrency 1 --ignore-eos \
            --disable-progress-bar "$@"; }
bench --num-prompts 2 --random-output-len 16 > /dev/null
# Clock ticks and voluntary switches, summed over the threads alive now.
totals() {
  local ticks=0 switches=0
  for t in /proc/"$scheduler"/task/*; do
    ticks=$((ticks + $(awk '{print $14 + $15}' "$t/stat")))
    switches=$((switches + $(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status")))
  done
  echo "$ticks $switches"
}
read -r ticks0 switches0 < <(totals)
bench --num-prompts "$prompts" --random-output-len "$tokens" --result-file "$result" > /dev/null
read -r ticks1 switches1 < <(totals)
python3 - "$result" "$prompts" "$tokens" "$((ticks1 - ticks0))" "$((switches1 - switches0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
result, prompts, tokens, ticks, switches, hz = sys.argv[1], *map(int, sys.argv[2:])
n = prompts * tokens
tpot = json.load(open(result)).get("median_tpot_ms", 0)
print(f"scheduler CPU {ticks / hz / n * 1e6:.0f} us/token, {switches / n:.2f} voluntary switches/token, "
      f"median TPOT {tpot:.2f} ms ({n} tokens)")
PY
