#!/usr/bin/env bash
# Enforces the dependency rules of ARCHITECTURE §9:
#  * scheduler/ and worker/ never include each other;
#  * common/ includes neither, nor any generated tandem proto;
#  * only gRPC adapters (files named *grpc*, *_service.*, *rpc*) include grpcpp.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
report() { echo "layering: $1"; status=1; }

while IFS= read -r hit; do report "scheduler/ includes worker/: $hit"; done \
  < <(grep -rnE '#include\s+"worker/' scheduler/ 2>/dev/null)
while IFS= read -r hit; do report "worker/ includes scheduler/: $hit"; done \
  < <(grep -rnE '#include\s+"scheduler/' worker/ 2>/dev/null)
while IFS= read -r hit; do report "common/ depends on a tandem component: $hit"; done \
  < <(grep -rnE '#include\s+"(scheduler|worker|tools)/|#include\s+"tandem/v1/' common/ 2>/dev/null)
while IFS= read -r hit; do
  file=${hit%%:*}
  case "$(basename "$file")" in *grpc*|*_service.*|*rpc*) ;; *) report "grpcpp outside an adapter: $hit" ;; esac
done < <(grep -rnE '#include\s+<grpcpp/' common/ scheduler/ worker/ tools/ 2>/dev/null)

[ $status -eq 0 ] && echo "layering: ok"
exit $status
