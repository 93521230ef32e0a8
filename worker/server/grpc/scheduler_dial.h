// AwaitScheduler: before the worker opens its control stream (which waits
// for the scheduler for ever, wait_for_ready), one unary call at a time
// without wait_for_ready tells a scheduler that is not up yet (wait and try
// again) from one this worker can never talk to: a failed TLS handshake
// (the scheduler refused this worker's certificate, or the scheduler's is
// not signed by --tls-ca or does not name the host dialed). The call is the
// scheduler's grpc.health.v1 Check; any answer means the link works.
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_WORKER_SERVER_GRPC_SCHEDULER_DIAL_H_
#define TANDEM_WORKER_SERVER_GRPC_SCHEDULER_DIAL_H_

#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/status.h"

namespace tandem::worker {

// OK once the scheduler answers; Unavailable naming TLS when a handshake
// fails, or (a plaintext worker) when the scheduler closes every connection,
// as one that requires TLS does: a few seconds, not for ever. A scheduler
// that is not up yet (connection refused) is waited for.
absl::Status AwaitScheduler(const std::shared_ptr<grpc::Channel>& channel, const std::string& target, bool tls);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_SCHEDULER_DIAL_H_
