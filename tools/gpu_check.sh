#!/usr/bin/env bash
# The GPU check: build here, measure on a machine with a GPU.
#
#   tools/gpu_check.sh prepare   (here, on a machine with the CUDA toolkit; no GPU needed)
#       Configures and builds the CUDA targets in $BUILD_DIR (default build-gpu):
#       the GPU tests, gpu_bench, tandem, tandem-worker, tandem-scheduler. Packs
#       them, debug info stripped, with every shared library they need except the
#       system's basics (glibc, libstdc++, libgcc) and the CUDA driver, runtime,
#       cuBLAS and NCCL (the GPU machine has those) into gpu-pack/ (git-ignored),
#       which must stay under 64 MiB, with a copy of this script.
#
#   tools/gpu_check.sh run       (on the GPU machine, from the repository root, gpu-pack/ beside it)
#       At most 6 minutes, every step under `timeout`. Fails fast, with one clear
#       line, when there is no CUDA device or a library is missing. Records
#       nvidia-smi, the driver, CUDA, cuBLAS and NCCL versions; runs the GPU
#       tests; makes the SmolLM2-shaped random model (30 layers, hidden 576,
#       9 heads, 3 KV heads, intermediate 1536, vocabulary 49152) with `tandem
#       make-model`; runs gpu_bench (decode at batch 1, 64, 256 with 128-token
#       contexts, a 512-token prefill, the GPU busy fraction in async mode, each
#       as a fraction of the H200's roofline), then again with --enforce-eager
#       (no CUDA graphs); checks `tandem generate` on the GPU against the CPU,
#       with graphs against without, and in-process PP=2 on the one GPU; serves one
#       request through `tandem serve --backend cuda` with two worker processes
#       on the one GPU. Every figure and log goes to files under $OUT (default
#       ./gpu-out): summary.txt, system.txt, tests.txt, bench.txt, bench.json,
#       bench_eager.txt (the benchmark with --enforce-eager, then ncu's time of
#       each kernel of batch-1 decode steps, where the image has ncu), e2e.txt,
#       serve.txt.
#
# With the device tool: prepare here, then run with gpu-pack carried:
#   run(command="tools/gpu_check.sh run", carry=["gpu-pack"], timeout_s=420)
set -uo pipefail
cd "$(dirname "$0")/.."

PACK=${GPU_PACK:-gpu-pack}
BUILD_DIR=${BUILD_DIR:-build-gpu}
PACK_LIMIT=$((64 * 1024 * 1024))
BINARIES=(tandem tandem-worker tandem-scheduler gpu_bench cuda_backend_test nccl_test worker_server_test)

die() {
  echo "gpu_check: $*" >&2
  [ -n "${SUMMARY:-}" ] && echo "gpu_check: $*" >>"$SUMMARY"
  exit 1
}

# --- prepare ---------------------------------------------------------------

# Libraries the GPU machine provides itself: the C/C++ runtime and the CUDA
# driver, runtime, cuBLAS and NCCL.
is_provided() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | \
      libresolv.so* | libutil.so* | libstdc++.so* | libgcc_s.so* | libcuda.so* | libcudart.so* | \
      libcublas.so* | libcublasLt.so* | libnccl.so* | libnvidia*.so*) return 0 ;;
    *) return 1 ;;
  esac
}

prepare() {
  command -v cmake >/dev/null || die "cmake is not installed"
  [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || die "no CUDA toolkit here (nvcc not found)"
  echo "gpu_check prepare: configuring $BUILD_DIR"
  # ccache only where it is installed (a launcher that is missing fails every compile).
  local launchers=()
  command -v ccache >/dev/null && launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_ENABLE_CUDA=ON \
    "${launchers[@]}" >"$BUILD_DIR.cmake.log" 2>&1 ||
    die "cmake failed; see $BUILD_DIR.cmake.log"
  grep -q "tandem: CUDA ON, NCCL ON" "$BUILD_DIR.cmake.log" ||
    die "the build found no CUDA or no NCCL: $(grep 'tandem: CUDA' "$BUILD_DIR.cmake.log")"
  rm -f "$BUILD_DIR.cmake.log"
  echo "gpu_check prepare: building ${BINARIES[*]}"
  ninja -C "$BUILD_DIR" -j"${JOBS:-2}" "${BINARIES[@]}" || die "the build failed"

  rm -rf "$PACK"
  mkdir -p "$PACK/bin" "$PACK/lib"
  for b in "${BINARIES[@]}"; do
    strip --strip-debug -o "$PACK/bin/$b" "$BUILD_DIR/bin/$b" || die "cannot strip $b"
  done
  # Every library the binaries need (ldd resolves the whole tree), except the
  # provided ones; copied as their soname, following links.
  local missing=""
  while read -r name path; do
    name=$(basename "$name")
    is_provided "$name" && continue
    if [ -z "$path" ] || [ "$path" = "not" ]; then
      missing="$missing $name"
      continue
    fi
    [ -e "$PACK/lib/$name" ] || cp -L "$path" "$PACK/lib/$name"
  done < <(for b in "${BINARIES[@]}"; do ldd "$BUILD_DIR/bin/$b"; done | awk '/=>/ {print $1, $3} !/=>/ {print $1, ""}' | sort -u)
  [ -z "$missing" ] || die "libraries not found here:$missing"
  strip --strip-debug "$PACK"/lib/*.so* 2>/dev/null
  cp tools/gpu_check.sh "$PACK/gpu_check.sh"
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
    echo "cuda $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
    (cd "$PACK" && find bin lib -type f -printf '%s %p\n' | sort -k2)
  } >"$PACK/MANIFEST"
  local bytes
  bytes=$(du -sb "$PACK" | cut -f1)
  echo "gpu_check prepare: $PACK holds $(ls "$PACK/bin" | wc -l) programs and $(ls "$PACK/lib" | wc -l) libraries, $((bytes / 1024 / 1024)) MiB"
  [ "$bytes" -lt "$PACK_LIMIT" ] || die "$PACK is $bytes bytes, over the 64 MiB a device call carries"
}

# --- run -------------------------------------------------------------------

OUT=${OUT:-$PWD/gpu-out}
SUMMARY=""
DEADLINE=345  # seconds after the start: every step ends by then (the check's budget is 6 minutes)

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME SECONDS LOG COMMAND...: runs COMMAND under timeout, its output
# appended to LOG; notes PASS, SKIP (exit 77) or FAIL with the time taken.
step() {
  local name=$1 seconds=$2 log=$3
  shift 3
  local t0=$SECONDS rc left=$((DEADLINE - SECONDS))
  if [ $left -lt 5 ]; then
    note "$(printf '%-28s SKIP (out of time)' "$name")"
    return 77
  fi
  [ "$seconds" -le $left ] || seconds=$left
  echo "=== $name: $*" >>"$log"
  timeout --kill-after=5 "$seconds" "$@" >>"$log" 2>&1
  rc=$?
  local verdict=FAIL
  if [ $rc -eq 0 ]; then verdict=PASS; elif [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -eq 124 ]; then verdict="FAIL (timed out after ${seconds}s)"; fi
  note "$(printf '%-28s %s (exit %d, %ds)' "$name" "$verdict" "$rc" $((SECONDS - t0)))"
  return $rc
}

# Adds to LD_LIBRARY_PATH the first folder holding each CUDA library the
# binaries need; fails naming the first one missing.
find_cuda_libraries() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
    /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 /usr/local/nvidia/lib)
  # The Python image's wheels (nvidia-nccl-cu13, nvidia-cublas, ...).
  local site
  for site in /opt/torch/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages; do
    [ -d "$site/nvidia" ] && dirs+=("$site"/nvidia/*/lib "$site"/nvidia/cu13/lib)
  done
  local lib dir found extra=""
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    ldconfig -p 2>/dev/null | grep -q "$lib " && found=system
    for dir in "${dirs[@]}"; do
      [ -n "$found" ] && break
      [ -e "$dir/$lib" ] && found=$dir && extra="$extra:$dir"
    done
    [ -n "$found" ] || die "missing library: $lib (looked in ldconfig and ${dirs[*]})"
    echo "$lib: $found" >>"$OUT/system.txt"
  done
  export LD_LIBRARY_PATH="$PWD/$PACK/lib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run() {
  mkdir -p "$OUT" || die "cannot write $OUT"
  SUMMARY="$OUT/summary.txt"
  : >"$SUMMARY"
  # No device: say so at once. nvidia-smi is the driver's own tool.
  command -v nvidia-smi >/dev/null 2>&1 || die "no CUDA device: nvidia-smi is not installed (no NVIDIA driver here)"
  local gpus
  gpus=$(timeout 20 nvidia-smi -L 2>&1) || die "no CUDA device: nvidia-smi -L failed: $gpus"
  echo "$gpus" | grep -q "^GPU " || die "no CUDA device: nvidia-smi lists none ($gpus)"
  [ -d "$PACK/bin" ] || die "no $PACK/: run tools/gpu_check.sh prepare first and carry $PACK"

  {
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -a)"
    cat "$PACK/MANIFEST"
    echo "# nvidia-smi"
    timeout 20 nvidia-smi
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
    echo "# libraries"
  } >"$OUT/system.txt" 2>&1
  find_cuda_libraries
  # Every binary's libraries resolve, with the versions it needs.
  local b problems
  for b in "$PACK"/bin/*; do
    problems=$(ldd "$b" 2>&1 | grep -E "not found|version .* not found")
    [ -z "$problems" ] || die "missing library for $(basename "$b"): $(echo "$problems" | head -3 | tr '\n' ' ')"
  done
  {
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$PACK/bin/tandem-worker" | grep -E "cuda|cublas|nccl"
    for lib in libcudart.so.13 libcublas.so.13 libnccl.so.2; do
      readlink -f "$(ldd "$PACK/bin/tandem-worker" | awk -v l="$lib" '$1 == l {print $3}')"
    done
    "$PACK/bin/tandem" version
  } >>"$OUT/system.txt" 2>&1
  note "gpu_check run on $(echo "$gpus" | head -1)"

  local bin="$PACK/bin"
  # GPU tests (each skips what it cannot do on one GPU, with the reason).
  step cuda_backend_test 150 "$OUT/tests.txt" "$bin/cuda_backend_test"
  step nccl_test 40 "$OUT/tests.txt" "$bin/nccl_test"
  step worker_server_test 40 "$OUT/tests.txt" "$bin/worker_server_test"
  # Each test that failed or skipped, once (gtest lists them again at the end).
  grep -E "^\[  (FAILED  |SKIPPED )\] [A-Za-z]" "$OUT/tests.txt" | grep -v " ms)$" | sort -u >>"$SUMMARY"
  # And the first lines of each failed assertion.
  grep -A4 -E ": Failure$" "$OUT/tests.txt" | head -60 >>"$SUMMARY"

  # The SmolLM2-shaped random model.
  local model=/tmp/tandem-smollm2-shaped.gguf
  step make_model 60 "$OUT/e2e.txt" "$bin/tandem" make-model --output "$model" --layers 30 --hidden 576 --heads 9 \
    --kv-heads 3 --intermediate 1536 --vocab 49152 --context 8192 --type bf16 --weight-scale 0.05 --seed 7 ||
    die "could not make the model; see $OUT/e2e.txt"

  step gpu_bench 150 "$OUT/bench.txt" "$bin/gpu_bench" --model "$model" --output "$OUT/bench.json"
  grep -E "_(tokens_per_s|fraction|busy_async|busy_sync|host_ms|device_ms) |^graphs " "$OUT/bench.txt" >>"$SUMMARY"
  # The same steps with every kernel launched from the host (no CUDA graphs),
  # for what the graphs save.
  step gpu_bench_eager 90 "$OUT/bench_eager.txt" "$bin/gpu_bench" --model "$model" --enforce-eager --repeats 2
  grep -E "_(tokens_per_s|host_ms|device_ms) " "$OUT/bench_eager.txt" | sed 's/^/eager /' >>"$SUMMARY"
  profile_kernels "$bin" "$model"

  # End to end in one process: the GPU against the CPU (greedy), and PP=2 on
  # the one GPU (staging copies between the stages) against PP=1.
  local prompt="The capital of France is"
  local args=(generate --model "$model" --prompt "$prompt" --max-tokens 32 --ignore-eos --json)
  step generate_cpu 60 "$OUT/e2e.txt" "$bin/tandem" "${args[@]}" --backend cpu
  step generate_cuda 60 "$OUT/e2e.txt" "$bin/tandem" "${args[@]}" --backend cuda
  step generate_cuda_eager 60 "$OUT/e2e.txt" "$bin/tandem" "${args[@]}" --backend cuda --enforce-eager
  step generate_cuda_pp2 60 "$OUT/e2e.txt" "$bin/tandem" "${args[@]}" --backend cuda --pipeline-parallel-size 2
  python3 - "$OUT/e2e.txt" >>"$SUMMARY" 2>&1 <<'PY'
import json, sys
ids = {}
name = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("=== "):
        name = line.split(":")[0][4:]
    elif line.startswith("{") and name:
        try:
            ids[name] = json.loads(line)["ids"]
        except Exception:
            pass
def same(a, b):
    if a not in ids or b not in ids:
        return f"{a} vs {b}: missing output"
    x, y = ids[a], ids[b]
    n = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), None)
    return f"{a} vs {b}: " + ("identical" if n is None and len(x) == len(y) else f"first difference at token {n}")
print(same("generate_cpu", "generate_cuda"))
print(same("generate_cuda", "generate_cuda_eager"))
print(same("generate_cuda", "generate_cuda_pp2"))
PY

  # Two worker processes on the one GPU behind `tandem serve`: the stages
  # fall back to TCP with pinned staging (NCCL refuses two ranks on one GPU).
  if [ $SECONDS -lt $((DEADLINE - 60)) ]; then
    serve_check "$bin" "$model"
  else
    note "serve                        SKIP (out of time)"
  fi
  note "total $((SECONDS))s"
  grep -q "FAIL" "$SUMMARY" && return 1
  return 0
}

# Where a batch-1 decode step's device time goes: ncu (when the image has
# it) times each kernel of about three replayed steps (caches flushed before
# each kernel, so these are cold figures), summed by kernel into
# $OUT/bench_eager.txt's end (a call returns at most 8 files).
profile_kernels() {
  local bin=$1 model=$2 ncu csv="$OUT/ncu.csv"
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    note "$(printf '%-28s SKIP (no ncu)' profile_b1)"
    return
  fi
  if [ $((DEADLINE - SECONDS)) -lt 130 ]; then
    note "$(printf '%-28s SKIP (out of time)' profile_b1)"
    return
  fi
  # A profile that cannot run (no counters under some runtimes) is noted,
  # not a failure of the check.
  local t0=$SECONDS rc
  echo "=== profile_b1: $ncu" >>"$OUT/bench_eager.txt"
  timeout --kill-after=5 60 "$ncu" --clock-control none --metrics gpu__time_duration.sum \
    --launch-skip 1000 --launch-count 1000 --csv --log-file "$csv" \
    "$bin/gpu_bench" --model "$model" --batches 1 --steps 4 --prefill-tokens 16 --repeats 1 \
    >>"$OUT/bench_eager.txt" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$csv" ]; then
    note "$(printf '%-28s not available (ncu exit %d, %ds; see bench_eager.txt)' profile_b1 $rc $((SECONDS - t0)))"
    rm -f "$csv"
    return
  fi
  note "$(printf '%-28s done (%ds; per kernel at the end of bench_eager.txt)' profile_b1 $((SECONDS - t0)))"
  python3 - "$csv" >>"$OUT/bench_eager.txt" 2>&1 <<'PY'
import collections, csv, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
total, count = collections.defaultdict(float), collections.Counter()
for row in csv.DictReader(lines[start:]) if start is not None else []:
    name = row["Kernel Name"].split("(")[0].split("::")[-1]
    total[name] += float(row["Metric Value"].replace(",", "")) / 1e3
    count[name] += 1
print("=== batch-1 decode kernels (ncu, cold caches): name, launches, total us, us each")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{name[:60]:60s} {count[name]:5d} {us:9.1f} {us / count[name]:7.2f}")
PY
  rm -f "$csv"
}

serve_check() {
  local bin=$1 model=$2 log="$OUT/serve.txt" port=18000 t0=$SECONDS
  "$bin/tandem" serve --model "$model" --backend cuda --pipeline-parallel-size 2 --gpu-memory-utilization 0.3 \
    --port $port --grpc-port 18051 >"$log" 2>&1 &
  local pid=$! ready=""
  for _ in $(seq 1 120); do
    grep -q "tandem serve: ready" "$log" && ready=1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if [ -n "$ready" ]; then
    {
      echo "=== completion"
      timeout 30 curl -sS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
      echo
      echo "=== metrics"
      timeout 10 curl -sS "http://127.0.0.1:$port/metrics" | grep -E "worker_info|worker_busy|worker_idle"
    } >>"$log" 2>&1
  fi
  kill -INT $pid 2>/dev/null
  for _ in $(seq 1 20); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  kill -KILL $pid 2>/dev/null
  wait $pid 2>/dev/null
  if grep -q '"text"' "$log" && grep -q 'backend="cuda"' "$log"; then
    note "$(printf '%-28s PASS (%ds)' serve $((SECONDS - t0)))"
  else
    note "$(printf '%-28s FAIL (%ds; see serve.txt)' serve $((SECONDS - t0)))"
  fi
  grep -E "connected over|KV cache" "$log" >>"$SUMMARY"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: tools/gpu_check.sh prepare|run   (see the top of this file)" >&2
    exit 2
    ;;
esac
