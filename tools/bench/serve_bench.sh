#!/usr/bin/env bash
# Serving benchmark: starts `tandem serve` (SmolLM2 by default) on a free
# port, runs `tandem bench` against it, stops it. Arguments before `--` go to
# `tandem serve`, after it to `tandem bench`; results land in $OUT (default
# bench-results/).
#
#   tools/bench/serve_bench.sh -- --num-prompts 64 --max-concurrency 16
#   tools/bench/serve_bench.sh --no-async-scheduling -- --num-prompts 64 --max-concurrency 16
#   TANDEM_BIN_DIR=build-x/bin tools/bench/serve_bench.sh ...   (binaries of another build)
set -euo pipefail
cd "$(dirname "$0")/../.."
serve_args=()
while (($#)) && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=${OUT:-bench-results}
bin=${TANDEM_BIN_DIR:-build/bin}
mkdir -p "$out"
source tools/bench/serve_lib.sh
port=$(free_port)
name=$(date +%Y%m%d-%H%M%S)
start_serve "$bin" "$out/serve-$name.log" "$port" --grpc-port 0 "${serve_args[@]}"
echo "tandem serve ${serve_args[*]}"
"$bin/tandem" bench --base-url "http://127.0.0.1:$port" --result-file "$out/bench-$name.json" "$@"
# The workers' idle time over the run, from the scheduler's metrics.
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^tandem:worker_(idle|busy)_seconds_total|^tandem:scheduler_time_seconds_total|^tandem:engine_steps_total'
