#!/usr/bin/env bash
# Fuzzes the OpenAI request parser and the chat template reader/renderer with
# libFuzzer under ASan and UBSan (clang; not part of ctest, which runs the
# bounded openai_mutation_test instead). Each target starts from its seed
# corpus and dictionary in scheduler/server/openai/fuzz/, keeps what it learns
# in BUILD/fuzz-corpus/, and saves a failing input in BUILD/fuzz-crashes/.
#
# Usage: tools/fuzz.sh [SECONDS_PER_TARGET=300] [BUILD_DIR=build-fuzz]
# Prints, per target, the inputs executed and whether it found anything;
# exits non-zero if a target failed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
dir=${2:-build-fuzz}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_SANITIZE=address,undefined -DTANDEM_FUZZ=ON \
  -DTANDEM_BUILD_TESTS=OFF -DTANDEM_ENABLE_CUDA=OFF "${launcher[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target request_fuzzer chat_template_fuzzer

status=0
for target in request chat_template; do
  corpus="$dir/fuzz-corpus/$target"
  crashes="$dir/fuzz-crashes/$target/"
  mkdir -p "$corpus" "$crashes"
  log="$dir/fuzz-$target.log"
  echo "fuzz: $target for $seconds s (log: $log)"
  rc=0
  "$dir/bin/${target}_fuzzer" -max_total_time="$seconds" -print_final_stats=1 \
    -dict="scheduler/server/openai/fuzz/$target.dict" -artifact_prefix="$crashes" \
    "$corpus" "scheduler/server/openai/fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if ((rc == 0)); then
    echo "fuzz: $target: $runs inputs executed, $cov, nothing found; corpus $(ls "$corpus" | wc -l) inputs"
  else
    echo "fuzz: $target: FAILED (exit $rc) after $runs inputs; input saved in $crashes:"
    grep -E 'ERROR|runtime error|_fuzzer: ' "$log" | head -5
    status=1
  fi
done
exit $status
