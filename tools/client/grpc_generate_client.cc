#include "tools/client/grpc_generate_client.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "common/rpc/grpc_options.h"
#include "common/rpc/tls_credentials.h"
#include "scheduler/wire/step_codec.h"
#include "tandem/v1/generate_service.grpc.pb.h"

namespace tandem::tools {
namespace {

absl::StatusOr<std::unique_ptr<v1::Generate::Stub>> Connect(const std::string& target, const rpc::TlsFiles& tls) {
  auto credentials = rpc::MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  return v1::Generate::NewStub(rpc::MakeChannel(target, *credentials));
}

}  // namespace

absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const std::string& prompt,
                                                  const scheduler::SamplingParams& sampling,
                                                  const std::function<void(const std::string&)>& on_text,
                                                  const std::vector<TokenId>& prompt_token_ids,
                                                  const std::string& request_id, const rpc::TlsFiles& tls) {
  auto connected = Connect(target, tls);
  if (!connected.ok()) return connected.status();
  auto& stub = *connected;
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_request_id(request_id);
  request.mutable_prompt_token_ids()->Add(prompt_token_ids.begin(), prompt_token_ids.end());
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

RemoteStream StreamRemotely(const std::string& target, const std::vector<TokenId>& prompt_token_ids,
                            const scheduler::SamplingParams& sampling, double deadline_s,
                            const rpc::TlsFiles& tls) {
  RemoteStream out;
  auto connected = Connect(target, tls);
  if (!connected.ok()) {
    out.status = connected.status();
    return out;
  }
  auto& stub = *connected;
  v1::GenerateRequest request;
  request.mutable_prompt_token_ids()->Add(prompt_token_ids.begin(), prompt_token_ids.end());
  scheduler::EncodeSamplingParams(sampling, false, request.mutable_sampling());
  grpc::ClientContext context;
  const auto start = std::chrono::system_clock::now();
  context.set_deadline(start + std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::duration<double>(deadline_s)));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    if (!response.finish_reason().empty()) out.finish_reason = response.finish_reason();
  }
  out.status = rpc::ToAbsl(reader->Finish());
  out.seconds = std::chrono::duration<double>(std::chrono::system_clock::now() - start).count();
  return out;
}

absl::StatusOr<RemoteHealth> QueryHealth(const std::string& target, const rpc::TlsFiles& tls) {
  auto connected = Connect(target, tls);
  if (!connected.ok()) return connected.status();
  auto& stub = *connected;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthRequest request;
  v1::HealthResponse response;
  if (absl::Status s = rpc::ToAbsl(stub->Health(&context, request, &response)); !s.ok()) return s;
  RemoteHealth health;
  health.ready = response.ready();
  health.status = response.status();
  health.num_running = response.num_running();
  health.num_waiting = response.num_waiting();
  health.wasted_rows = response.wasted_rows();
  health.preemptions = response.preemptions();
  health.steps_in_flight = response.steps_in_flight();
  for (const v1::WorkerHealth& w : response.workers()) {
    health.workers.push_back({w.rank(), w.connected(), w.busy_seconds(), w.idle_seconds(), w.steps()});
  }
  return health;
}

absl::StatusOr<bool> AbortRemotely(const std::string& target, const std::string& request_id,
                                   const rpc::TlsFiles& tls) {
  auto connected = Connect(target, tls);
  if (!connected.ok()) return connected.status();
  auto& stub = *connected;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::AbortRequest request;
  request.set_request_id(request_id);
  v1::AbortResponse response;
  if (absl::Status s = rpc::ToAbsl(stub->Abort(&context, request, &response)); !s.ok()) return s;
  return response.found();
}

}  // namespace tandem::tools
