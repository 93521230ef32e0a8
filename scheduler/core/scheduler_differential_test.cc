// Randomized differential test of the scheduler and engine loop
// (scheduler/README.md §10): random arrivals, prompt lengths (some sharing
// prefixes), budgets, KV pools small enough to force preemption, stop
// tokens, priorities and aborts. For each workload, the synchronous engine,
// async at queue depths 2 and 3, async with a pipeline cadence, and the
// synchronous scheduler behind a batch queue must give every request the same
// tokens and finish reason; aborted requests a prefix of them. The invariant
// checker runs at every step boundary and the pool must be full at the end.
//
// The fake executor's tokens depend only on a request's context read back
// through its block table, so any scheduling or KV-accounting error that
// matters shows up as a token difference.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using testing::Arrival;
using testing::RequestResult;
using testing::RunWorkload;
using testing::WorkloadRun;

constexpr int32_t kVocab = 64;  // small, so stop tokens come up naturally
constexpr TokenId kEos = 0;

struct Workload {
  EngineConfig config;
  std::vector<Arrival> arrivals;
  std::map<int64_t, std::vector<RequestId>> aborts;
  std::string description;
};

std::vector<Arrival> CopyArrivals(const std::vector<Arrival>& arrivals) {
  std::vector<Arrival> copy;
  for (const Arrival& a : arrivals) {
    Arrival c;
    c.at_iteration = a.at_iteration;
    c.spec.id = a.spec.id;
    c.spec.prompt_token_ids = a.spec.prompt_token_ids;
    c.spec.sampling = a.spec.sampling;
    c.spec.priority = a.spec.priority;
    copy.push_back(std::move(c));
  }
  return copy;
}

Workload MakeWorkload(uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Workload w;
  EngineConfig& c = w.config;
  c.block_size = 1 << uniform(2, 4);
  c.max_model_len = uniform(24, 96);
  const int32_t blocks_per_request = (c.max_model_len + c.block_size - 1) / c.block_size;
  // Often barely one request's worth of blocks: preemption is the norm.
  c.num_kv_blocks = 1 + blocks_per_request + uniform(0, 2 * blocks_per_request);
  c.max_num_batched_tokens = uniform(4, 80);
  c.max_num_seqs = uniform(1, 8);
  c.enable_prefix_caching = uniform(0, 1) == 1;
  c.policy = uniform(0, 3) == 0 ? SchedulingPolicy::kPriority : SchedulingPolicy::kFcfs;
  c.long_prefill_token_threshold = uniform(0, 2) == 0 ? uniform(1, 24) : 0;
  if (uniform(0, 5) == 0) {
    c.enable_chunked_prefill = false;
    c.max_num_batched_tokens = c.max_model_len + uniform(0, 16);
  }
  c.vocab_size = kVocab;

  const int num_requests = uniform(1, 10);
  std::vector<TokenId> shared_prefix(uniform(1, c.max_model_len - 1));
  for (TokenId& t : shared_prefix) t = uniform(1, kVocab - 1);
  for (int i = 0; i < num_requests; ++i) {
    Arrival a;
    a.at_iteration = uniform(0, 1) == 0 ? 0 : uniform(0, 30);
    a.spec.id = 100 + i;
    const int32_t prompt_len = uniform(0, 2) == 0 ? uniform(1, c.max_model_len - 1) : uniform(1, 20);
    for (int32_t p = 0; p < prompt_len; ++p) {
      // A third of the prompts start with the shared prefix (prefix-cache hits).
      const bool shared = i % 3 == 0 && p < static_cast<int32_t>(shared_prefix.size());
      a.spec.prompt_token_ids.push_back(shared ? shared_prefix[p] : uniform(1, kVocab - 1));
    }
    SamplingParams& s = a.spec.sampling;
    s.max_tokens = uniform(1, 40);
    s.min_tokens = uniform(0, 2) == 0 ? uniform(0, s.max_tokens) : 0;
    s.eos_token_id = kEos;
    s.ignore_eos = uniform(0, 4) == 0;
    for (int k = uniform(0, 2); k > 0; --k) s.stop_token_ids.push_back(uniform(1, kVocab - 1));
    const int32_t priority = uniform(0, 3);  // drawn always, so a seed's other draws stay put
    if (c.policy == SchedulingPolicy::kPriority) a.spec.priority = priority;
    w.arrivals.push_back(std::move(a));
    if (uniform(0, 5) == 0) w.aborts[uniform(0, 60)].push_back(100 + i);
  }
  w.description = absl::StrCat("seed ", seed, ": B=", c.block_size, " L=", c.max_model_len, " blocks=",
                               c.num_kv_blocks, " budget=", c.max_num_batched_tokens, " seqs=", c.max_num_seqs,
                               " prefix_cache=", c.enable_prefix_caching, " priority=",
                               c.policy == SchedulingPolicy::kPriority, " requests=", num_requests);
  return w;
}

struct Mode {
  const char* name;
  bool async_scheduling;
  int32_t depth;
  int32_t pipeline_parallel_size;
};

constexpr Mode kModes[] = {
    {"async depth 2", true, 2, 1},
    {"async depth 3", true, 3, 1},
    {"async pp 2 (cadence 2, depth 3)", true, 0, 2},
    {"sync behind a batch queue of 2", false, 2, 1},
};

WorkloadRun RunMode(const Workload& w, const Mode& mode, bool with_aborts) {
  EngineConfig config = w.config;
  config.async_scheduling = mode.async_scheduling;
  config.batch_queue_depth = mode.depth;
  config.pipeline_parallel_size = mode.pipeline_parallel_size;
  FakeExecutorOptions options;
  options.vocab_size = kVocab;
  return RunWorkload(config, CopyArrivals(w.arrivals), options,
                     with_aborts ? w.aborts : std::map<int64_t, std::vector<RequestId>>{});
}

void ExpectPoolFull(const WorkloadRun& run, const std::string& where) {
  EXPECT_EQ(run.free_blocks_at_end, run.usable_blocks) << where << ": blocks leaked";
}

TEST(SchedulerDifferentialTest, EveryModeGivesTheSameTokens) {
  constexpr uint32_t kWorkloads = 5000;
  int64_t preemptions = 0, stale = 0, aborted = 0, stopped = 0, wasted = 0;
  for (uint32_t seed = 0; seed < kWorkloads; ++seed) {
    const Workload w = MakeWorkload(seed);
    SCOPED_TRACE(w.description);
    EngineConfig sync_config = w.config;
    sync_config.async_scheduling = false;
    sync_config.batch_queue_depth = 1;
    FakeExecutorOptions options;
    options.vocab_size = kVocab;
    const WorkloadRun reference = RunWorkload(sync_config, CopyArrivals(w.arrivals), options);
    ExpectPoolFull(reference, "sync");
    for (const auto& [id, result] : reference.results) {
      ASSERT_NE(result.finish, FinishReason::kNone) << "request " << id << " never finished";
      stopped += result.finish == FinishReason::kStop ? 1 : 0;
    }
    preemptions += reference.stats.num_preemptions;

    for (const Mode& mode : kModes) {
      for (bool with_aborts : {false, true}) {
        if (with_aborts && w.aborts.empty()) continue;
        const std::string where = absl::StrCat(mode.name, with_aborts ? ", with aborts" : "");
        const WorkloadRun run = RunMode(w, mode, with_aborts);
        ExpectPoolFull(run, where);
        preemptions += run.stats.num_preemptions;
        stale += run.stats.num_stale_tokens_delivered;
        wasted += run.stats.num_wasted_rows;
        for (const auto& [id, expected] : reference.results) {
          const RequestResult& got = run.results.at(id);
          if (got.finish == FinishReason::kAbort) {
            ++aborted;
            ASSERT_LE(got.tokens.size(), expected.tokens.size()) << where << " request " << id;
            EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), expected.tokens.begin()))
                << where << " request " << id << ": aborted output is not a prefix";
            continue;
          }
          EXPECT_EQ(got.tokens, expected.tokens) << where << " request " << id;
          EXPECT_EQ(got.finish, expected.finish) << where << " request " << id;
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
    if (::testing::Test::HasFailure()) return;
  }
  // The workloads must exercise what they claim to.
  EXPECT_GT(preemptions, 1000);
  EXPECT_GT(stale, 100);
  EXPECT_GT(aborted, 100);
  EXPECT_GT(stopped, 100);
  EXPECT_GT(wasted, 100);
  std::printf("%u workloads x %zu modes: %lld preemptions, %lld stale tokens delivered, %lld aborts, "
              "%lld stop finishes (sync), %lld wasted steps\n",
              kWorkloads, std::size(kModes) + 1, static_cast<long long>(preemptions), static_cast<long long>(stale),
              static_cast<long long>(aborted), static_cast<long long>(stopped), static_cast<long long>(wasted));
}

}  // namespace
}  // namespace tandem::scheduler
