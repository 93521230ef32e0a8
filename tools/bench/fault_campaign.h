// The fault campaign (issue 11, item 7): a real tandem-scheduler and its
// tandem-workers (LocalCluster) under a steady load of streaming requests,
// struck again and again by a worker fault, each cycle:
//
//   1. the load starts (FaultLoad: `in_flight` requests at all times) and
//      the fault waits until requests run;
//   2. one worker (a random rank) is killed (SIGKILL), or hung (SIGSTOP) and
//      then resumed (SIGCONT: it must notice it was dropped and exit) or
//      killed; the scheduler must report the group not ready;
//   3. the worker is restarted and the group must be ready again (recovery
//      time: from the fault to ready);
//   4. requests sent after the recovery must complete;
//   5. the load stops; once idle, KV usage on /metrics must be back to 0.
//
// Every wait is bounded; a state not reached in time is a problem in the
// report, not a hang. The caller owns the cluster's options (the tiny model
// of `tandem make-model` keeps a cycle to seconds).
#ifndef TANDEM_TOOLS_BENCH_FAULT_CAMPAIGN_H_
#define TANDEM_TOOLS_BENCH_FAULT_CAMPAIGN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/fault_load.h"
#include "tools/cluster/local_cluster.h"

namespace tandem::tools {

enum class FaultKind { kKill, kHangResume, kHangKill };
const char* FaultKindName(FaultKind kind);

struct FaultCampaignOptions {
  LocalClusterOptions cluster;
  int32_t cycles = 20;
  int32_t in_flight = 64;
  double request_deadline_s = 120;  // a request not ended by then is lost
  double wait_s = 60;               // the bound on every wait for a state
  uint64_t seed = 1;
  std::function<void(const std::string&)> log;  // one line per cycle; may be empty
};

struct FaultCycle {
  FaultKind kind = FaultKind::kKill;
  int32_t rank = 0;
  double detection_s = 0;  // fault -> the scheduler reports not ready
  double recovery_s = 0;   // fault -> ready again with the restarted worker
};

struct FaultCampaignReport {
  RequestTally requests;
  std::vector<FaultCycle> cycles;
  int64_t preemptions = 0;  // over the campaign: the KV pool was under pressure
  // Every property that did not hold, in words (empty: the campaign passed,
  // given requests.lost == 0 and requests.mismatched == 0, which ok() checks).
  std::vector<std::string> problems;
  bool ok() const;
};

// Requests of mixed prompt and output lengths, a third sharing a prefix
// (prefix caching across faults) and some ending on a stop token, with the
// outputs of a fault-free greedy run of the in-process engine (one stage,
// synchronous) on `model_path`.
absl::StatusOr<std::vector<FaultRequest>> MakeFaultWorkload(const std::string& model_path, int32_t count,
                                                            uint64_t seed);

// Starts the cluster, runs the cycles, stops it.
absl::StatusOr<FaultCampaignReport> RunFaultCampaign(const FaultCampaignOptions& options,
                                                     const std::vector<FaultRequest>& workload);

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_BENCH_FAULT_CAMPAIGN_H_
