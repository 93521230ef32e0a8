#include "scheduler/testing/workload_runner.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/testing/invariant_checker.h"

namespace tandem::scheduler::testing {
namespace {

// Far more than any test workload needs: beyond it the engine is livelocked.
constexpr int64_t kMaxIterations = 100000;

// Adds one iteration's outputs to `run`; queues a stop-string abort for the
// requests that just received their stop token.
void Collect(const std::vector<RequestOutput>& outputs, const WorkloadOptions& options, WorkloadRun* run,
             std::vector<RequestId>* stop_aborts) {
  for (const RequestOutput& out : outputs) {
    RequestResult& r = run->results[out.id];
    r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    if (!out.new_token_ids.empty()) ++r.num_outputs;
    if (out.finished()) {
      if (r.finish != FinishReason::kNone && run->status.ok()) {
        run->status = absl::InternalError(absl::StrCat("request ", out.id, " finished twice"));
      }
      r.finish = out.finish_reason;
      continue;
    }
    auto stop = options.stop_tokens.find(out.id);
    if (stop != options.stop_tokens.end() &&
        std::find(out.new_token_ids.begin(), out.new_token_ids.end(), stop->second) != out.new_token_ids.end()) {
      stop_aborts->push_back(out.id);
    }
  }
}

}  // namespace

WorkloadRun RunEngineWorkload(const EngineConfig& config, std::vector<Arrival> arrivals,
                              FakeExecutorOptions executor_options, const WorkloadOptions& options) {
  WorkloadRun run;
  auto created = Scheduler::Create(config);
  if (!created.ok()) {
    run.status = created.status();
    return run;
  }
  std::unique_ptr<Scheduler> scheduler = std::move(created).value();
  scheduler->InjectFaultForTest(options.fault);
  executor_options.num_blocks = config.num_kv_blocks;
  executor_options.block_size = config.block_size;
  FakeExecutor executor(std::move(executor_options));
  EngineCore engine(scheduler.get(), &executor);
  InvariantChecker checker(InvariantChecker::OnViolation::kRecord);
  if (options.check_invariants) engine.AddObserver(&checker);

  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.at_iteration < b.at_iteration; });
  size_t next = 0;
  int64_t idle = 0;
  std::vector<RequestId> stop_aborts;
  for (int64_t it = 0; next < arrivals.size() || engine.HasWork(); ++it) {
    while (next < arrivals.size() && arrivals[next].at_iteration <= it) {
      RequestSpec& spec = arrivals[next].spec;
      const RequestId id = spec.id;
      run.results[id];
      if (absl::Status added = engine.AddRequest(std::move(spec)); !added.ok()) {
        run.status = absl::InternalError(absl::StrCat("request ", id, " rejected: ", added.ToString()));
        return run;
      }
      ++next;
    }
    for (RequestId id : stop_aborts) engine.Abort(id);
    stop_aborts.clear();
    if (auto a = options.aborts.find(it); a != options.aborts.end()) {
      for (RequestId id : a->second) engine.Abort(id);
    }
    auto result = engine.Step();
    run.steps_checked = checker.num_checks();
    if (!checker.violation().ok()) {
      run.status = checker.violation();
      return run;
    }
    if (!result.ok()) {
      run.status = absl::InternalError(absl::StrCat("engine step failed: ", result.status().ToString()));
      return run;
    }
    Collect(result->outputs, options, &run, &stop_aborts);
    if (!run.status.ok()) return run;
    // An iteration that neither launches nor completes a step makes no
    // progress; a few in a row (waiting for arrivals aside) is a stall.
    idle = (result->executed || result->updated || next < arrivals.size()) ? 0 : idle + 1;
    if (idle > 3 || it > kMaxIterations) {
      run.status = absl::InternalError(absl::StrCat("engine stalled with ", scheduler->num_requests(),
                                                    " requests after ", it, " iterations (",
                                                    scheduler->stats().num_preemptions, " preemptions)"));
      return run;
    }
    run.iterations = it + 1;
  }
  run.stats = scheduler->stats();
  run.free_blocks_at_end = scheduler->kv_cache().pool().num_free_blocks();
  run.usable_blocks = config.num_kv_blocks - 1;
  return run;
}

std::vector<Arrival> CopyArrivals(const std::vector<Arrival>& arrivals) {
  std::vector<Arrival> copy;
  copy.reserve(arrivals.size());
  for (const Arrival& a : arrivals) {
    Arrival& c = copy.emplace_back();
    c.at_iteration = a.at_iteration;
    c.spec.id = a.spec.id;
    c.spec.prompt_token_ids = a.spec.prompt_token_ids;
    c.spec.sampling = a.spec.sampling;
    c.spec.priority = a.spec.priority;
    c.spec.cache_salt = a.spec.cache_salt;
  }
  return copy;
}

}  // namespace tandem::scheduler::testing
