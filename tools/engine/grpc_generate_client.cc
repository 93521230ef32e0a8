#include "tools/engine/grpc_generate_client.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "common/rpc/grpc_options.h"
#include "scheduler/step_codec.h"
#include "tandem/v1/generate_service.grpc.pb.h"

namespace tandem::tools {

absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const std::string& prompt,
                                                  const scheduler::SamplingParams& sampling,
                                                  const std::function<void(const std::string&)>& on_text) {
  auto stub = v1::Generate::NewStub(rpc::MakeChannel(target));
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  scheduler::EncodeSamplingParams(sampling, false, request.mutable_sampling());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->Generate(&context, request);
  RemoteGeneration result;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    result.tokens.insert(result.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    result.text += response.text();
    if (response.num_prompt_tokens() > 0) result.num_prompt_tokens = response.num_prompt_tokens();
    if (!response.finish_reason().empty()) result.finish_reason = response.finish_reason();
    if (on_text && !response.text().empty()) on_text(response.text());
  }
  if (absl::Status status = rpc::ToAbsl(reader->Finish()); !status.ok()) return status;
  return result;
}

}  // namespace tandem::tools
