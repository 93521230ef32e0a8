// FaultLoad: the client side of the fault campaign (fault_campaign.h). A
// fixed number of client threads keep that many streaming Generate requests
// in flight against a tandem-scheduler, each drawn from a workload whose
// fault-free greedy outputs are known, and account for every one: completed
// with exactly the expected tokens, ended with an error that says what
// happened, or lost (no end within the client's deadline, or a stream that
// ended without a finish reason or an error message). Tokens streamed before
// an error must be a prefix of the expected ones.
//
// Thread-safe: Start, Stop, MarkFault, MarkRecovered and Tally are called by
// the campaign's thread while the client threads run.
#ifndef TANDEM_TOOLS_BENCH_FAULT_LOAD_H_
#define TANDEM_TOOLS_BENCH_FAULT_LOAD_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/core/sampling_params.h"

namespace tandem::tools {

// One request of the workload and what a fault-free greedy run gives it.
struct FaultRequest {
  std::vector<TokenId> prompt;
  scheduler::SamplingParams sampling;  // greedy
  std::vector<TokenId> expected_tokens;
  std::string expected_finish;  // "length" or "stop"
};

struct RequestTally {
  int64_t completed = 0;   // exactly the expected tokens and finish reason
  int64_t errored = 0;     // an error with a message; tokens so far a prefix of the expected
  int64_t lost = 0;        // no end by the deadline, or an end that says nothing
  int64_t mismatched = 0;  // tokens that differ from the fault-free run (completed or not)
  // Requests sent after a recovery (and before the next fault) that did not
  // complete: must be 0.
  int64_t failed_after_recovery = 0;
  std::map<std::string, int64_t> errors;  // "CODE: message" (truncated) -> count
  std::vector<std::string> examples;      // the first few lost or mismatched, in words
};

class FaultLoad {
 public:
  // `deadline_s`: a request not ended by then counts as lost.
  FaultLoad(std::string target, const std::vector<FaultRequest>* workload, int32_t clients, double deadline_s);
  ~FaultLoad();

  // Starts the client threads; each sends one request after another.
  void Start();
  // No new requests; waits for those in flight (each bounded by the deadline).
  void Stop();
  // Requests sent from now on may fail (a fault is coming) ...
  void MarkFault();
  // ... and from now on must complete.
  void MarkRecovered();
  // Requests sent since MarkRecovered that completed.
  int64_t completed_since_recovery() const { return completed_since_recovery_.load(); }
  RequestTally Tally() const;

 private:
  void Client();
  // One request, start to end, accounted for.
  void RunOne(const FaultRequest& request, bool after_recovery);
  // The first few lost or mismatched requests, in words.
  void AddExample(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string target_;
  const std::vector<FaultRequest>* workload_;
  const int32_t clients_;
  const double deadline_s_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> recovered_{true};
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> completed_since_recovery_{0};
  mutable absl::Mutex mu_;
  RequestTally tally_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_BENCH_FAULT_LOAD_H_
