#!/usr/bin/env bash
# ThreadSanitizer run (off CI) of the threaded parts: the serving engine's
# thread over an in-memory group, the HTTP server, the TCP and loopback
# communicators (and the staged one over the CPU backend) and
# the tokenizer's concurrent Encode. README ("Sanitizers and fuzzing") reports the result.
#
# TSan must see absl::Mutex's synchronization, so abseil is built from source
# with -fsanitize=thread (Debian's libabsl is not instrumented: with it every
# field guarded by an absl::Mutex would be reported). It is built once into
# BUILD_DIR/absl, with Debian's absl/base/options.h so that its ABI choices
# are the ones our code is built against.
#
# Usage: tools/tsan.sh [BUILD_DIR=build-tsan]
#   ABSL_SOURCE=DIR  an abseil-cpp 20220623.1 source tree (default: cloned from GitHub)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=${1:-$src/build-tsan}
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
targets=(serving_engine_test http_server_test comm_test tokenizer_test)
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
compilers=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)

absl="$dir/absl"
if [ ! -f "$absl/lib/cmake/absl/abslConfig.cmake" ]; then
  rm -rf "$dir/absl-src"
  if [ -n "${ABSL_SOURCE:-}" ]; then
    cp -r "$ABSL_SOURCE" "$dir/absl-src"
  else
    git clone --quiet --depth 1 --branch 20220623.1 https://github.com/abseil/abseil-cpp "$dir/absl-src"
  fi
  cp /usr/include/absl/base/options.h "$dir/absl-src/absl/base/options.h"
  cmake -S "$dir/absl-src" -B "$dir/absl-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${compilers[@]}" \
    "${launcher[@]}" -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_TESTING=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
    -DCMAKE_INSTALL_PREFIX="$absl" >/dev/null
  cmake --build "$dir/absl-build" -j"$(nproc)"
  cmake --install "$dir/absl-build" >/dev/null
fi

cmake -S "$src" -B "$dir/tandem" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${compilers[@]}" "${launcher[@]}" \
  -DTANDEM_SANITIZE=thread -DTANDEM_ENABLE_CUDA=OFF -Dabsl_DIR="$absl/lib/cmake/absl" >/dev/null
cmake --build "$dir/tandem" -j"$(nproc)" --target "${targets[@]}"

# Every report is printed and counted; the run fails if there is any.
export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 log_path=$dir/tsan"
rm -f "$dir"/tsan.*
status=0
ctest --test-dir "$dir/tandem" -R "^($(IFS='|'; echo "${targets[*]}"))\$" --output-on-failure || status=1
reports=$(cat "$dir"/tsan.* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
echo "tsan: ${#targets[@]} test programs, $reports report(s) (logs: $dir/tsan.*)"
if ((reports > 0)); then
  grep -h -A12 "WARNING: ThreadSanitizer" "$dir"/tsan.* | head -60
  status=1
fi
exit $status
