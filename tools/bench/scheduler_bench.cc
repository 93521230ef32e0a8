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
//
// FullPool measures what the scheduler plans, not its time: a pool too small
// for the batch, with requests ending on EOS and aborts, so that under async
// scheduling blocks are nearly always on their way back behind a fence
// (scheduler/README.md §4.6) while running requests need new ones. It reports
// tokens and rows scheduled per step (issue 11, defect 3: a request waiting
// for fenced blocks used to end the running pass for every request after it).
//
//   build/bin/scheduler_bench --benchmark_filter=FullPool
#include <deque>
#include <memory>
#include <random>
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

// A full pool at queue depth 2 or 3 (third argument): `max_num_seqs` requests
// of 32-160 prompt tokens generating up to 64-448, block size 16, a pool with
// blocks for 30% or 20% (second argument) of what they would hold at their
// longest. Each sampled token is EOS with probability 1/128, and each step
// aborts a random running request with probability 1/16; a replacement
// arrives for every request that ends, so the waiting queue is never empty.
// Deterministic (fixed seed, fixed iterations).
class FullPoolWorkload {
 public:
  static constexpr TokenId kEos = 2;

  FullPoolWorkload(int32_t num_seqs, int32_t pool_percent, int32_t depth) : rng_(20261201), depth_(depth) {
    EngineConfig config;
    config.block_size = 16;
    config.enable_prefix_caching = true;
    config.async_scheduling = true;
    config.batch_queue_depth = depth;
    config.max_num_seqs = num_seqs;
    config.max_num_batched_tokens = 2048;
    config.max_model_len = 1024;
    config.num_kv_blocks = num_seqs * (160 + 448) / 16 * pool_percent / 100 + 1;
    auto created = Scheduler::Create(config);
    TANDEM_CHECK_OK(created.status());
    scheduler_ = std::move(created).value();
    for (int32_t i = 0; i < 2 * num_seqs; ++i) AddRequest();
  }

  // One engine iteration as EngineCore::Step does it: plan a step; collect
  // and reconcile the oldest once the queue is full or nothing was planned.
  void Cycle() {
    SchedulerOutput next = scheduler_->Schedule();
    const bool planned = !next.empty();
    if (planned) {
      ++steps_;
      tokens_ += next.total_num_scheduled_tokens;
      rows_ += static_cast<int64_t>(next.scheduled.size());
      in_flight_.push_back(std::move(next));
    }
    if (in_flight_.empty() || (planned && static_cast<int32_t>(in_flight_.size()) < depth_)) return;
    const SchedulerOutput& step = in_flight_.front();
    result_ = ModelRunnerOutput();
    result_.step_seq = step.step_seq;
    for (const ScheduledRequest& row : step.scheduled) {
      const TokenId token = Uniform(0, 127) == 0 ? kEos : static_cast<TokenId>(Uniform(3, 31999));
      result_.AddRow(row.id, row.samples ? absl::MakeConstSpan(&token, 1) : absl::Span<const TokenId>());
    }
    outputs_.clear();
    if (Uniform(0, 15) == 0 && scheduler_->num_running() > 0) {
      const RequestId victim = scheduler_->running()[Uniform(0, scheduler_->num_running() - 1)]->id();
      scheduler_->AbortRequests({victim}, &outputs_);
    }
    scheduler_->UpdateFromOutput(step, result_, &outputs_);
    in_flight_.pop_front();
    for (const RequestOutput& out : outputs_) {
      if (out.finished()) AddRequest();
    }
  }

  double TokensPerStep() const { return steps_ == 0 ? 0 : static_cast<double>(tokens_) / steps_; }
  double RowsPerStep() const { return steps_ == 0 ? 0 : static_cast<double>(rows_) / steps_; }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  int32_t Uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  void AddRequest() {
    RequestSpec spec;
    spec.id = next_id_++;
    spec.prompt_token_ids.resize(Uniform(32, 160));
    for (TokenId& t : spec.prompt_token_ids) t = static_cast<TokenId>(Uniform(3, 31999));
    spec.sampling.max_tokens = Uniform(64, 448);
    spec.sampling.eos_token_id = kEos;
    TANDEM_CHECK_OK(scheduler_->AddRequest(std::move(spec)));
  }

  std::mt19937 rng_;
  const int32_t depth_;
  std::unique_ptr<Scheduler> scheduler_;
  std::deque<SchedulerOutput> in_flight_;
  ModelRunnerOutput result_;
  std::vector<RequestOutput> outputs_;
  RequestId next_id_ = 0;
  int64_t steps_ = 0;
  int64_t tokens_ = 0;
  int64_t rows_ = 0;
};

void BM_FullPool(benchmark::State& state) {
  FullPoolWorkload workload(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
                            static_cast<int32_t>(state.range(2)));
  for (auto _ : state) workload.Cycle();
  const SchedulerStats& stats = workload.scheduler().stats();
  state.counters["tokens_per_step"] = workload.TokensPerStep();
  state.counters["rows_per_step"] = workload.RowsPerStep();
  state.counters["preemptions"] = static_cast<double>(stats.num_preemptions);
  state.counters["finished"] = static_cast<double>(stats.num_finished[static_cast<int>(FinishReason::kStop)] +
                                                   stats.num_finished[static_cast<int>(FinishReason::kLength)]);
}
BENCHMARK(BM_FullPool)
    ->ArgsProduct({{64, 256}, {30, 20}, {2, 3}})
    ->Iterations(20000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::scheduler

BENCHMARK_MAIN();
