#!/usr/bin/env bash
# Enforces what may include what (README "Layout"; scheduler/README.md):
#
#  1. scheduler/ and worker/ never include each other; common/ includes
#     neither, nor tools/, nor a generated tandem proto.
#  2. scheduler/core/ includes only common/ and itself (its tests also
#     scheduler/testing/): no protobuf, gRPC, Boost or JSON.
#     scheduler/testing/ includes only common/, core/ and itself.
#     scheduler/wire/ includes nothing from scheduler/server/.
#  3. Generated protobuf (tandem/v1/*.pb.h, google/protobuf) only in the wire:
#     scheduler/wire/, the gRPC adapters, worker/runner/ (the ModelRunner
#     consumes the step protocol), worker/server/, tools/ and tests/.
#  4. grpcpp and the generated gRPC stubs (*.grpc.pb.h) only in adapters:
#     scheduler/server/grpc/, worker/server/grpc/, common/rpc/, tools/client/,
#     and tools/bench/grpc_hop_bench.cc (it measures gRPC itself).
#  5. Boost only in scheduler/server/http/ and tools/bench/; nlohmann/json
#     only in scheduler/server/openai/ and tools/.
#  6. worker/backends/, worker/model/ and worker/comm/ include nothing from
#     worker/runner/ or worker/server/.
#  7. No product code includes a testing/ folder; tests and tools/ may.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0

# Source files under the given folders, one per line.
sources() { find "$@" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort; }
is_test() { case "$1" in *_test.cc|*/testing/*|tests/*) return 0 ;; *) return 1 ;; esac; }

# forbid RULE PATTERN FOLDER... : no file under the folders includes PATTERN.
# Tests are checked too unless RULE ends in "(product code)".
forbid() {
  local rule=$1 pattern=$2
  shift 2
  local file hit
  while IFS= read -r file; do
    case "$rule" in *"(product code)") is_test "$file" && continue ;; esac
    while IFS= read -r hit; do
      echo "layering: $rule: $file:$hit"
      status=1
    done < <(grep -nE "^\s*#\s*include\s+[\"<]($pattern)" "$file")
  done < <(sources "$@")
}

# only_in RULE PATTERN ALLOWED... : PATTERN is included only under the
# allowed folders (every source folder is searched).
only_in() {
  local rule=$1 pattern=$2
  shift 2
  local file allowed ok hit
  while IFS= read -r file; do
    ok=0
    for allowed in "$@"; do case "$file" in "$allowed"*) ok=1 ;; esac; done
    [ $ok -eq 1 ] && continue
    while IFS= read -r hit; do
      echo "layering: $rule: $file:$hit"
      status=1
    done < <(grep -nE "^\s*#\s*include\s+[\"<]($pattern)" "$file")
  done < <(sources common scheduler worker tools tests)
}

# 1
forbid "scheduler/ includes worker/" 'worker/' scheduler
forbid "worker/ includes scheduler/" 'scheduler/' worker
forbid "common/ depends on a tandem component" 'scheduler/|worker/|tools/|tandem/v1/' common
# 2
forbid "the scheduler core includes outside core/ and common/" \
  'scheduler/(wire|server)/|tandem/v1/|google/protobuf|grpc|boost/|nlohmann/' scheduler/core
forbid "the scheduler core includes its test doubles (product code)" 'scheduler/testing/' scheduler/core
forbid "scheduler/testing/ includes the wire or the server" \
  'scheduler/(wire|server)/|tandem/v1/|google/protobuf|grpc|boost/|nlohmann/' scheduler/testing
forbid "the wire includes the server" 'scheduler/server/|boost/|nlohmann/' scheduler/wire
# 3
only_in "generated protobuf outside the wire" 'tandem/v1/|google/protobuf' \
  scheduler/wire/ scheduler/server/grpc/ worker/runner/ worker/server/ tools/ tests/
# 4
only_in "gRPC outside an adapter" 'grpcpp/|grpc/|[^"]*\.grpc\.pb\.h' \
  scheduler/server/grpc/ worker/server/grpc/ common/rpc/ tools/client/ tools/bench/grpc_hop_bench.cc
# 5
only_in "Boost outside the HTTP server and the benchmark client" 'boost/' scheduler/server/http/ tools/bench/
only_in "JSON outside the OpenAI frontend and tools/" 'nlohmann/' scheduler/server/openai/ tools/
# 6
forbid "worker compute includes the runner or the server" 'worker/(runner|server)/' \
  worker/backends worker/model worker/comm
# 7
forbid "product code includes test doubles (product code)" '[a-z_/]*testing/' common scheduler worker

[ $status -eq 0 ] && echo "layering: ok"
exit $status
