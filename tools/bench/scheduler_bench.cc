// scheduler_bench: the CPU cost of one engine step on the scheduler side.
//
// One iteration = Schedule() of step N+1 plus UpdateFromOutput() of step N,
// as the async engine loop does them, with R running decode requests (block
// size 16, prefix caching on). Requests are 128-token prompts generating up
// to 1024 tokens; each one that finishes is replaced by a new one, so the
// batch stays at R and the cost includes the steady trickle of admissions,
// block allocation, block hashing and prefix-cache registration. The model's
// answer is synthesized (one token per sampling row).
//
//   build/bin/scheduler_bench --benchmark_filter=ScheduleUpdate
#include <deque>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kPromptTokens = 128;
constexpr int32_t kMaxTokens = 1024;

class Workload {
 public:
  explicit Workload(int32_t num_running) {
    EngineConfig config;
    config.block_size = 16;
    config.enable_prefix_caching = true;
    config.async_scheduling = true;
    config.max_num_seqs = num_running;
    config.max_num_batched_tokens = 8192;
    config.max_model_len = 2048;
    config.num_kv_blocks = num_running * ((kPromptTokens + kMaxTokens) / 16 + 2) + 16;
    auto created = Scheduler::Create(config);
    TANDEM_CHECK_OK(created.status());
    scheduler_ = std::move(created).value();
    for (int32_t i = 0; i < num_running; ++i) AddRequest();
    // Warm up until every request decodes: prefills are done and the queue
    // holds one step in flight.
    in_flight_.push_back(scheduler_->Schedule());
    for (int i = 0; i < 64; ++i) Cycle();
  }

  // One engine iteration: plan step N+1, then reconcile step N.
  void Cycle() {
    SchedulerOutput next = scheduler_->Schedule();
    if (!next.empty()) in_flight_.push_back(std::move(next));
    const SchedulerOutput& step = in_flight_.front();
    result_.step_seq = step.step_seq;
    result_.request_ids.clear();
    result_.sampled_token_ids.clear();
    result_.sampled_offsets.assign(1, 0);
    for (const ScheduledRequest& row : step.scheduled) {
      const TokenId token = static_cast<TokenId>((row.id * 7919 + step.step_seq) % 32000);
      result_.AddRow(row.id, row.samples ? absl::MakeConstSpan(&token, 1) : absl::Span<const TokenId>());
    }
    outputs_.clear();
    scheduler_->UpdateFromOutput(step, result_, &outputs_);
    scheduler_->Recycle(std::move(in_flight_.front()));
    in_flight_.pop_front();
    for (const RequestOutput& out : outputs_) {
      if (out.finished()) AddRequest();
    }
  }

  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  void AddRequest() {
    RequestSpec spec;
    spec.id = next_id_++;
    spec.prompt_token_ids.resize(kPromptTokens);
    for (int32_t i = 0; i < kPromptTokens; ++i) {
      spec.prompt_token_ids[i] = static_cast<TokenId>((spec.id * 131 + i) % 32000);
    }
    spec.sampling.max_tokens = kMaxTokens;
    TANDEM_CHECK_OK(scheduler_->AddRequest(std::move(spec)));
  }

  std::unique_ptr<Scheduler> scheduler_;
  std::deque<SchedulerOutput> in_flight_;
  ModelRunnerOutput result_;
  std::vector<RequestOutput> outputs_;
  RequestId next_id_ = 0;
};

void BM_ScheduleUpdate(benchmark::State& state) {
  const auto num_running = static_cast<int32_t>(state.range(0));
  Workload workload(num_running);
  for (auto _ : state) workload.Cycle();
  state.counters["running"] = static_cast<double>(workload.scheduler().num_running());
  // Requests handled per second: one schedule + update of every running request.
  state.SetItemsProcessed(state.iterations() * num_running);
}
BENCHMARK(BM_ScheduleUpdate)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::scheduler

BENCHMARK_MAIN();
