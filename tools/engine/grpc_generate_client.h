// File: tools/engine/grpc_generate_client.h
//
// GenerateRemotely: one request through a tandem-scheduler's Generate API,
// as `tandem generate --connect` and the benchmarks use it.
#ifndef TANDEM_TOOLS_ENGINE_GRPC_GENERATE_CLIENT_H_
#define TANDEM_TOOLS_ENGINE_GRPC_GENERATE_CLIENT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/sampling_params.h"

namespace tandem::tools {

struct RemoteGeneration {
  std::vector<TokenId> tokens;
  std::string text;
  std::string finish_reason;
  int32_t num_prompt_tokens = 0;
};

// `on_text`, if set, receives each piece of text as it arrives.
absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const std::string& prompt,
                                                  const scheduler::SamplingParams& sampling,
                                                  const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_ENGINE_GRPC_GENERATE_CLIENT_H_
