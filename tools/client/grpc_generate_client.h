// GenerateRemotely: one request through a tandem-scheduler's Generate API,
// as `tandem generate --connect` and the benchmarks use it.
//
// `tls`: a scheduler with --tls-* requires a client certificate on its gRPC
// port from every client, these too: the same three files (tls_files.h),
// this client's certificate signed by the scheduler's --tls-ca, and the CA
// that signed the scheduler's (which must name the host of `target`). None:
// plaintext. Unreadable files: InvalidArgument naming the flag.
#ifndef TANDEM_TOOLS_CLIENT_GRPC_GENERATE_CLIENT_H_
#define TANDEM_TOOLS_CLIENT_GRPC_GENERATE_CLIENT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/tls_files.h"
#include "scheduler/core/sampling_params.h"

namespace tandem::tools {

struct RemoteGeneration {
  std::vector<TokenId> tokens;
  std::string text;
  std::string finish_reason;
  int32_t num_prompt_tokens = 0;
};

// `on_text`, if set, receives each piece of text as it arrives. With
// `prompt_token_ids` non-empty, those are the prompt and `prompt` is ignored.
absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const std::string& prompt,
                                                  const scheduler::SamplingParams& sampling,
                                                  const std::function<void(const std::string&)>& on_text = nullptr,
                                                  const std::vector<TokenId>& prompt_token_ids = {},
                                                  const std::string& request_id = "",
                                                  const rpc::TlsFiles& tls = {});

// One Generate stream of prompt token ids, bounded by `deadline_s`, reported
// whatever its end (the fault campaign accounts for every request): the
// tokens streamed, the finish reason if one came, the call's status and how
// long it took.
struct RemoteStream {
  std::vector<TokenId> tokens;
  std::string finish_reason;
  absl::Status status;
  double seconds = 0;
};
RemoteStream StreamRemotely(const std::string& target, const std::vector<TokenId>& prompt_token_ids,
                            const scheduler::SamplingParams& sampling, double deadline_s,
                            const rpc::TlsFiles& tls = {});

struct RemoteHealth {
  bool ready = false;
  std::string status;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t wasted_rows = 0;
  int64_t preemptions = 0;
  int64_t steps_in_flight = 0;
  struct Worker {
    int32_t rank = 0;
    bool connected = false;
    double busy_seconds = 0;
    double idle_seconds = 0;
    int64_t steps = 0;
  };
  std::vector<Worker> workers;
};

absl::StatusOr<RemoteHealth> QueryHealth(const std::string& target, const rpc::TlsFiles& tls = {});
// Aborts a request by the id it was submitted with; false if unknown.
absl::StatusOr<bool> AbortRemotely(const std::string& target, const std::string& request_id,
                                   const rpc::TlsFiles& tls = {});

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_CLIENT_GRPC_GENERATE_CLIENT_H_
