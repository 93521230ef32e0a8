#include "tools/bench/fault_load.h"

#include <algorithm>
#include <chrono>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "scheduler/wire/step_codec.h"
#include "tandem/v1/generate_service.grpc.pb.h"

namespace tandem::tools {
namespace {

constexpr size_t kMaxExamples = 8;

// What one stream delivered.
struct Streamed {
  std::vector<TokenId> tokens;
  std::string finish;
  grpc::Status status;
  double seconds = 0;
};

Streamed Stream(v1::Generate::Stub& stub, const FaultRequest& request, double deadline_s) {
  v1::GenerateRequest message;
  message.mutable_prompt_token_ids()->Add(request.prompt.begin(), request.prompt.end());
  scheduler::EncodeSamplingParams(request.sampling, false, message.mutable_sampling());
  grpc::ClientContext context;
  const auto start = std::chrono::system_clock::now();
  context.set_deadline(start + std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::duration<double>(deadline_s)));
  Streamed out;
  auto reader = stub.Generate(&context, message);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    if (!response.finish_reason().empty()) out.finish = response.finish_reason();
  }
  out.status = reader->Finish();
  out.seconds = std::chrono::duration<double>(std::chrono::system_clock::now() - start).count();
  return out;
}

bool IsPrefix(const std::vector<TokenId>& part, const std::vector<TokenId>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

}  // namespace

FaultLoad::FaultLoad(std::string target, const std::vector<FaultRequest>* workload, int32_t clients,
                     double deadline_s)
    : target_(std::move(target)), workload_(workload), clients_(clients), deadline_s_(deadline_s) {}

FaultLoad::~FaultLoad() { Stop(); }

void FaultLoad::Start() {
  stop_ = false;
  for (int32_t i = 0; i < clients_; ++i) threads_.emplace_back([this] { Client(); });
}

void FaultLoad::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void FaultLoad::MarkFault() { recovered_ = false; }

void FaultLoad::MarkRecovered() {
  completed_since_recovery_ = 0;
  recovered_ = true;
}

RequestTally FaultLoad::Tally() const {
  absl::MutexLock lock(&mu_);
  return tally_;
}

void FaultLoad::Client() {
  while (!stop_) {
    const int64_t n = next_.fetch_add(1);
    RunOne((*workload_)[static_cast<size_t>(n) % workload_->size()], recovered_.load());
  }
}

void FaultLoad::RunOne(const FaultRequest& request, bool after_recovery) {
  // A channel per request, as separate clients would have: a fault on one
  // connection cannot hold the others.
  auto stub = v1::Generate::NewStub(rpc::MakeChannel(target_));
  const Streamed got = Stream(*stub, request, deadline_s_);
  const bool prefix = IsPrefix(got.tokens, request.expected_tokens);
  absl::MutexLock lock(&mu_);
  auto example = [&](const std::string& what) {
    if (tally_.examples.size() < kMaxExamples) tally_.examples.push_back(what);
  };
  if (got.status.ok() && got.finish == request.expected_finish && got.tokens == request.expected_tokens) {
    ++tally_.completed;
    if (after_recovery) ++completed_since_recovery_;
    return;
  }
  if (after_recovery) ++tally_.failed_after_recovery;
  const bool client_deadline = got.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                               got.seconds >= deadline_s_ * 0.99;
  if (client_deadline || (got.status.ok() && got.finish.empty()) ||
      (!got.status.ok() && got.status.error_message().empty())) {
    ++tally_.lost;
    example(absl::StrCat("lost after ", got.seconds, " s with ", got.tokens.size(), " tokens: status ",
                         static_cast<int>(got.status.error_code()), " '", got.status.error_message(), "' finish '", got.finish, "'"));
    return;
  }
  if (got.status.ok() || !prefix) {
    // Ended normally with other tokens or another finish, or failed after
    // streaming tokens a fault-free run does not give.
    ++tally_.mismatched;
    example(absl::StrCat("mismatched: ", got.tokens.size(), " tokens (expected ", request.expected_tokens.size(),
                         "), finish '", got.finish, "' (expected '", request.expected_finish, "'), status '",
                         got.status.error_message(), "'"));
    return;
  }
  ++tally_.errored;
  // Grouped by what they say: a peer's address differs from one fault to the next.
  std::string message = got.status.error_message();
  if (const size_t at = message.find(" (ipv4:"); at != std::string::npos) {
    message.erase(at, message.find(')', at) + 1 - at);
  }
  if (const size_t at = message.find("step "); at != std::string::npos) {
    const size_t digits = message.find_first_not_of("0123456789", at + 5);
    message.replace(at + 5, digits == std::string::npos ? std::string::npos : digits - at - 5, "N");
  }
  const auto code = static_cast<absl::StatusCode>(got.status.error_code());
  ++tally_.errors[absl::StrCat(absl::StatusCodeToString(code), ": ", message.substr(0, 72))];
}

}  // namespace tandem::tools
