// The differential comparison of scheduler/README.md §10: random workloads
// (arrivals, prompt lengths with shared prefixes, budgets, KV pools small
// enough to force preemption, stop tokens, stop strings, priorities, aborts)
// run synchronously at queue depth 1 as the reference and in every engine
// mode (sync and async scheduling, queue depths 2-4, pipeline cadences). With
// greedy sampling every request must get the same tokens and finish reason
// in every mode; a request aborted at a given iteration a prefix of them. The
// fake executor's tokens depend on the KV it reads, so a scheduling or
// KV-accounting error that matters shows as a token difference.
//
// Used by scheduler_differential_test (a sample, in CI),
// scheduler_fault_injection_test and tools/bench/scheduler_fuzz (the
// campaign). No gtest.
#ifndef TANDEM_SCHEDULER_TESTING_DIFFERENTIAL_H_
#define TANDEM_SCHEDULER_TESTING_DIFFERENTIAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/core/engine_config.h"
#include "scheduler/core/fault_injection.h"
#include "scheduler/testing/workload_runner.h"

namespace tandem::scheduler::testing {

struct RandomWorkload {
  uint32_t seed = 0;
  EngineConfig config;
  std::vector<Arrival> arrivals;
  std::map<int64_t, std::vector<RequestId>> aborts;  // engine iteration -> ids
  std::map<RequestId, TokenId> stop_tokens;          // stop strings (abort at a token)
  std::string description;
};

// The same seed gives the same workload on every platform (std::mt19937 and
// our own range mapping).
RandomWorkload MakeRandomWorkload(uint32_t seed);

struct EngineMode {
  const char* name;
  bool async_scheduling;
  int32_t batch_queue_depth;  // 0: derived from the pipeline
  int32_t pipeline_parallel_size;
};

// Sync scheduling behind batch queues of 2-4, async at depths 2-4, and async
// with pipeline cadences 2 and 3.
absl::Span<const EngineMode> DifferentialModes();

struct DifferentialOptions {
  // The InvariantChecker at every step boundary of every run.
  bool check_invariants = true;
  // Applied to every mode, never to the reference (test builds only).
  SchedulerFault fault = SchedulerFault::kNone;
};

// What the runs exercised, summed over workloads.
struct DifferentialTally {
  int64_t workloads = 0;
  int64_t runs = 0;           // engine runs, the references included
  int64_t steps_checked = 0;  // step boundaries the invariant checker passed
  int64_t mismatches = 0;     // runs that differ from their reference
  int64_t preemptions = 0;
  int64_t stale_tokens = 0;
  int64_t aborted = 0;        // requests finished by an abort (timed or stop string)
  int64_t stop_strings = 0;   // reference requests ended by their stop string
  int64_t stopped = 0;        // reference requests ended by EOS or a stop token
  int64_t wasted_rows = 0;
};

// Runs `w` as the reference and in every mode, without and (if it has any)
// with its timed aborts, and compares. Returns OK, or the first failure
// naming the seed, the mode and the request: DataLoss when what a request
// received (or the pool at the end) differs, Internal for an invariant
// violation or an engine error. Every failing run counts in
// tally->mismatches.
absl::Status RunDifferential(const RandomWorkload& w, const DifferentialOptions& options,
                             DifferentialTally* tally);

}  // namespace tandem::scheduler::testing

#endif  // TANDEM_SCHEDULER_TESTING_DIFFERENTIAL_H_
