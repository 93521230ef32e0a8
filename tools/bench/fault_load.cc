#include "tools/bench/fault_load.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/client/grpc_generate_client.h"

namespace tandem::tools {
namespace {

constexpr size_t kMaxExamples = 8;

bool IsPrefix(const std::vector<TokenId>& part, const std::vector<TokenId>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

// An error message without what differs from one fault to the next (a
// peer's address, a step's number), so that errors group by what they say.
std::string Grouped(std::string message) {
  if (const size_t at = message.find(" (ipv4:"); at != std::string::npos) {
    message.erase(at, message.find(')', at) + 1 - at);
  }
  if (const size_t at = message.find("step "); at != std::string::npos) {
    const size_t digits = message.find_first_not_of("0123456789", at + 5);
    message.replace(at + 5, digits == std::string::npos ? std::string::npos : digits - at - 5, "N");
  }
  return message.substr(0, 72);
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

void FaultLoad::AddExample(const std::string& what) {
  if (tally_.examples.size() < kMaxExamples) tally_.examples.push_back(what);
}

void FaultLoad::RunOne(const FaultRequest& request, bool after_recovery) {
  // A channel per request, as separate clients would have: a fault on one
  // connection cannot hold the others.
  const RemoteStream got = StreamRemotely(target_, request.prompt, request.sampling, deadline_s_);
  const bool prefix = IsPrefix(got.tokens, request.expected_tokens);
  const std::string code = absl::StatusCodeToString(got.status.code());
  absl::MutexLock lock(&mu_);
  if (got.status.ok() && got.finish_reason == request.expected_finish && got.tokens == request.expected_tokens) {
    ++tally_.completed;
    if (after_recovery) ++completed_since_recovery_;
    return;
  }
  if (after_recovery) ++tally_.failed_after_recovery;
  const bool client_deadline =
      got.status.code() == absl::StatusCode::kDeadlineExceeded && got.seconds >= deadline_s_ * 0.99;
  if (client_deadline || (got.status.ok() && got.finish_reason.empty()) ||
      (!got.status.ok() && got.status.message().empty())) {
    ++tally_.lost;
    AddExample(absl::StrCat("lost after ", got.seconds, " s with ", got.tokens.size(), " tokens: ", code, " '",
                         got.status.message(), "', finish '", got.finish_reason, "'"));
    return;
  }
  if (got.status.ok() || !prefix) {
    // Ended normally with other tokens or another finish, or failed after
    // streaming tokens a fault-free run does not give.
    ++tally_.mismatched;
    AddExample(absl::StrCat("mismatched: ", got.tokens.size(), " tokens (expected ", request.expected_tokens.size(),
                         "), finish '", got.finish_reason, "' (expected '", request.expected_finish, "'), ", code,
                         " '", got.status.message(), "'"));
    return;
  }
  ++tally_.errored;
  ++tally_.errors[absl::StrCat(code, ": ", Grouped(std::string(got.status.message())))];
}

}  // namespace tandem::tools
