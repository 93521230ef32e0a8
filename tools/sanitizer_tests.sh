#!/usr/bin/env bash
# The pure unit tests (common, gguf, tokenizer, scheduler core, OpenAI text
# and protocol, the Jinja interpreter, the HTTP server, the fuzz checks, the
# scheduler's gRPC worker sessions: real servers and threads) and the scheduler
# differential test, built with AddressSanitizer and UndefinedBehaviorSanitizer
# in a build directory of their own and run there. ctest runs this as
# asan_ubsan_tests (tests/CMakeLists.txt); README "Reliability" gives its time.
#
# Usage: tools/sanitizer_tests.sh [BUILD_DIR=build-sanitize]
# Uses ccache when it is installed; a report from either sanitizer fails the test that
# caused it.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=${1:-$src/build-sanitize}
targets=(common_test gguf_test tokenizer_test scheduler_unit_test scheduler_differential_test
         openai_text_test openai_protocol_test openai_mutation_test jinja_test http_server_test
         scheduler_grpc_test)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # One cache entry per source for every checkout's sanitizer build (paths
  # relative to the checkout, the build directory not hashed).
  export CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1
fi

start=$SECONDS
# -O1 -g1 (line tables only), not RelWithDebInfo: the sanitizers need no more
# to name the line of a report, and the cold build is what CI pays for.
cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1" \
  -DCMAKE_C_FLAGS_SANITIZE="-O1 -g1" -DTANDEM_SANITIZE=address,undefined \
  -DTANDEM_ENABLE_CUDA=OFF "${launcher[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
built=$SECONDS

# Not detect_stack_use_after_return: it makes the tests several times slower.
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
regex="^($(IFS='|'; echo "${targets[*]}"))\$"
ctest --test-dir "$dir" -R "$regex" --output-on-failure -j"$(nproc)"
echo "sanitizer tests: built in $((built - start)) s, ran in $((SECONDS - built)) s"
