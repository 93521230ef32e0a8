#include "tools/bench/fault_campaign.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/client/grpc_generate_client.h"
#include "tools/in_process/in_process_engine.h"

namespace tandem::tools {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Polls `done` every 20 ms for at most `seconds`; whether it became true.
bool PollUntil(double seconds, const std::function<bool()>& done) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

absl::StatusOr<std::map<RequestId, Generation>> RunReference(const std::string& model_path,
                                                              const std::vector<FaultRequest>& requests) {
  InProcessEngineOptions options;
  options.model_path = model_path;
  options.async_scheduling = false;
  options.threads = 1;
  options.kv_cache_bytes = int64_t{64} << 20;
  auto engine = InProcessEngine::Create(options);
  if (!engine.ok()) return engine.status();
  std::vector<scheduler::RequestSpec> specs;
  for (size_t i = 0; i < requests.size(); ++i) {
    scheduler::RequestSpec spec;
    spec.id = static_cast<RequestId>(i);
    spec.prompt_token_ids = requests[i].prompt;
    spec.sampling = requests[i].sampling;
    specs.push_back(std::move(spec));
  }
  return (*engine)->Run(std::move(specs));
}

class Campaign {
 public:
  Campaign(const FaultCampaignOptions& options, LocalCluster* cluster, FaultLoad* load)
      : options_(options), cluster_(*cluster), load_(*load), rng_(options.seed) {}

  void RunCycle(int32_t index, FaultCampaignReport* report);

 private:
  void Problem(int32_t index, const std::string& what) {
    report_->problems.push_back(absl::StrCat("cycle ", index + 1, ": ", what));
  }
  // Strikes `rank`; returns once the struck process is gone (reaped).
  void Strike(int32_t index, FaultKind kind, int32_t rank, FaultCycle* cycle);
  void RestartExitedWorkers(int32_t index, int32_t struck);
  void CheckIdleAndKvFreed(int32_t index);

  const FaultCampaignOptions& options_;
  LocalCluster& cluster_;
  FaultLoad& load_;
  std::mt19937_64 rng_;
  FaultCampaignReport* report_ = nullptr;
};

void Campaign::RunCycle(int32_t index, FaultCampaignReport* report) {
  report_ = report;
  const auto kind = static_cast<FaultKind>(index % 3);
  const int32_t stages = static_cast<int32_t>(options_.cluster.scheduler.pipeline_parallel_size);
  // Each rank meets each kind of fault: ranks change every three cycles.
  FaultCycle cycle{kind, (index / 3) % stages, 0, 0};
  load_.MarkFault();
  load_.Start();
  // A small KV pool (preemption) bounds how many run at once: a few running
  // is enough to strike.
  const int64_t busy = std::clamp<int64_t>(
      std::min<int64_t>(options_.in_flight, options_.cluster.scheduler.max_num_seqs) / 4, 1, 8);
  if (!PollUntil(options_.wait_s, [&] {
        auto health = QueryHealth(cluster_.target());
        return health.ok() && health->num_running >= busy;
      })) {
    Problem(index, absl::StrCat("fewer than ", busy, " requests running before the fault"));
  }
  // Strike at a random point of a step rather than right after admission.
  std::this_thread::sleep_for(std::chrono::milliseconds(rng_() % 400));
  const auto struck_at = Clock::now();
  Strike(index, kind, cycle.rank, &cycle);
  RestartExitedWorkers(index, cycle.rank);
  if (absl::Status s = cluster_.StartWorker(cycle.rank); !s.ok()) Problem(index, s.ToString());
  if (absl::Status s = cluster_.WaitReady(true, options_.wait_s); !s.ok()) Problem(index, s.ToString());
  cycle.recovery_s = SecondsSince(struck_at);
  load_.MarkRecovered();
  if (!PollUntil(options_.wait_s, [&] { return load_.completed_since_recovery() >= options_.in_flight; })) {
    Problem(index, absl::StrCat("only ", load_.completed_since_recovery(), " requests completed in ", options_.wait_s,
                                " s after the recovery"));
  }
  load_.Stop();
  CheckIdleAndKvFreed(index);
  report->cycles.push_back(cycle);
  if (options_.log) {
    options_.log(absl::StrFormat("cycle %d: %s rank %d, detected in %.2f s, ready again in %.2f s", index + 1,
                                 FaultKindName(kind), cycle.rank, cycle.detection_s, cycle.recovery_s));
  }
}

void Campaign::Strike(int32_t index, FaultKind kind, int32_t rank, FaultCycle* cycle) {
  const auto struck_at = Clock::now();
  cluster_.SignalWorker(rank, kind == FaultKind::kKill ? SIGKILL : SIGSTOP);
  if (absl::Status s = cluster_.WaitReady(false, options_.wait_s); !s.ok()) {
    Problem(index, absl::StrCat(FaultKindName(kind), ": ", s.ToString()));
  }
  cycle->detection_s = SecondsSince(struck_at);
  if (kind == FaultKind::kHangKill) cluster_.SignalWorker(rank, SIGKILL);
  if (kind != FaultKind::kHangResume) return;
  // Resumed, the worker finds its stream closed by the scheduler and exits
  // (a supervisor restarts it); one that stays would be a zombie member.
  cluster_.SignalWorker(rank, SIGCONT);
  auto exited = cluster_.WaitWorkerExit(rank, options_.wait_s);
  if (!exited.ok()) {
    Problem(index, absl::StrCat("a resumed worker stayed: ", exited.status().ToString()));
    cluster_.SignalWorker(rank, SIGKILL);
  }
}

void Campaign::RestartExitedWorkers(int32_t index, int32_t struck) {
  for (const auto& [rank, how] : cluster_.ReapExitedWorkers()) {
    if (rank == struck) continue;
    Problem(index, absl::StrCat(how, " (not the struck one); restarted"));
    if (absl::Status s = cluster_.StartWorker(rank); !s.ok()) Problem(index, s.ToString());
  }
}

void Campaign::CheckIdleAndKvFreed(int32_t index) {
  std::string last = "no answer";
  if (!PollUntil(options_.wait_s, [&] {
        auto health = QueryHealth(cluster_.target());
        if (!health.ok()) return false;
        last = absl::StrCat(health->num_running, " running, ", health->num_waiting, " waiting, ",
                            health->steps_in_flight, " steps in flight");
        return health->num_running == 0 && health->num_waiting == 0 && health->steps_in_flight == 0;
      })) {
    Problem(index, "not idle after the load stopped: " + last);
  }
  // The gauge is the scheduler's own count, updated as blocks return.
  double usage = -1;
  if (!PollUntil(5, [&] {
        auto text = cluster_.FetchMetrics();
        if (!text.ok()) return false;
        auto value = MetricValue(*text, "tandem:kv_cache_usage_perc");
        usage = value.ok() ? *value : -1;
        return usage == 0;
      })) {
    Problem(index, absl::StrCat("KV usage ", usage, " when idle (must be 0)"));
  }
}

}  // namespace

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill:
      return "kill";
    case FaultKind::kHangResume:
      return "hang+resume";
    case FaultKind::kHangKill:
      return "hang+kill";
  }
  return "?";
}

bool FaultCampaignReport::ok() const {
  return problems.empty() && requests.lost == 0 && requests.mismatched == 0 && requests.failed_after_recovery == 0;
}

absl::StatusOr<std::vector<FaultRequest>> MakeFaultWorkload(const std::string& model_path, int32_t count,
                                                            uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<TokenId>> prefixes(2);
  for (auto& prefix : prefixes) {
    for (int t = 0; t < 32; ++t) prefix.push_back(static_cast<TokenId>(rng() % 256));  // two blocks
  }
  std::vector<FaultRequest> requests(static_cast<size_t>(count));
  for (size_t i = 0; i < requests.size(); ++i) {
    FaultRequest& r = requests[i];
    if (i % 3 == 0) r.prompt = prefixes[i % 2];
    const int length = 1 + static_cast<int>(rng() % 60);
    for (int t = 0; t < length; ++t) r.prompt.push_back(static_cast<TokenId>(rng() % 256));
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = 1 + static_cast<int32_t>(rng() % 48);
  }
  // A stop token the free run is known to produce, for every fourth.
  auto free_run = RunReference(model_path, requests);
  if (!free_run.ok()) return free_run.status();
  for (size_t i = 1; i < requests.size(); i += 4) {
    const auto& tokens = free_run->at(static_cast<RequestId>(i)).tokens;
    if (tokens.size() > 3) requests[i].sampling.stop_token_ids = {tokens[tokens.size() / 2]};
  }
  auto expected = RunReference(model_path, requests);
  if (!expected.ok()) return expected.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    const Generation& g = expected->at(static_cast<RequestId>(i));
    requests[i].expected_tokens = g.tokens;
    requests[i].expected_finish = scheduler::FinishReasonName(g.finish);
  }
  return requests;
}

absl::StatusOr<FaultCampaignReport> RunFaultCampaign(const FaultCampaignOptions& options,
                                                     const std::vector<FaultRequest>& workload) {
  auto cluster = LocalCluster::Start(options.cluster);
  if (!cluster.ok()) return cluster.status();
  FaultLoad load((*cluster)->target(), &workload, options.in_flight, options.request_deadline_s);
  Campaign campaign(options, cluster->get(), &load);
  FaultCampaignReport report;
  for (int32_t i = 0; i < options.cycles; ++i) campaign.RunCycle(i, &report);
  report.requests = load.Tally();
  if (auto health = QueryHealth((*cluster)->target()); health.ok()) report.preemptions = health->preemptions;
  return report;
}

}  // namespace tandem::tools
