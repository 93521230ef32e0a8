#include "scheduler/testing/differential.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::scheduler::testing {
namespace {

constexpr int32_t kVocab = 64;  // small, so stop tokens come up naturally
constexpr TokenId kEos = 0;

constexpr EngineMode kModes[] = {
    {"sync, batch queue 2", false, 2, 1},
    {"sync, batch queue 3", false, 3, 1},
    {"sync, batch queue 4", false, 4, 1},
    {"async depth 2", true, 2, 1},
    {"async depth 3", true, 3, 1},
    {"async depth 4", true, 4, 1},
    {"async pp 2 (cadence 2, depth 3)", true, 0, 2},
    {"async pp 3 (cadence 3, depth 4)", true, 0, 3},
};

// uniform_int_distribution is not the same on every standard library: map
// the generator's 32 bits ourselves so that a seed reproduces anywhere.
class Draw {
 public:
  explicit Draw(uint32_t seed) : rng_(seed) {}
  int operator()(int lo, int hi) {
    return lo + static_cast<int>(static_cast<uint64_t>(rng_()) * static_cast<uint64_t>(hi - lo + 1) >> 32);
  }

 private:
  std::mt19937 rng_;
};

EngineConfig RandomConfig(Draw& uniform) {
  EngineConfig c;
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
  return c;
}

std::string Tokens(const std::vector<TokenId>& tokens) { return absl::StrCat("[", absl::StrJoin(tokens, " "), "]"); }

// Compares one run with the reference; OK, the run's own failure (an engine
// error or an invariant violation: Internal), or the first difference in what
// the requests received or in the pool at the end (DataLoss).
absl::Status Compare(const WorkloadRun& reference, const WorkloadRun& run, bool with_aborts) {
  if (!run.status.ok()) return run.status;
  if (run.free_blocks_at_end != run.usable_blocks) {
    return absl::DataLossError(absl::StrCat("blocks leaked: ", run.free_blocks_at_end, " of ", run.usable_blocks,
                                            " free at the end"));
  }
  for (const auto& [id, expected] : reference.results) {
    auto it = run.results.find(id);
    if (it == run.results.end()) return absl::DataLossError(absl::StrCat("request ", id, " has no result"));
    const RequestResult& got = it->second;
    if (with_aborts && got.finish == FinishReason::kAbort) {
      if (got.tokens.size() > expected.tokens.size() ||
          !std::equal(got.tokens.begin(), got.tokens.end(), expected.tokens.begin())) {
        return absl::DataLossError(absl::StrCat("request ", id, ": aborted output ", Tokens(got.tokens),
                                                " is not a prefix of ", Tokens(expected.tokens)));
      }
      continue;
    }
    if (got.tokens != expected.tokens || got.finish != expected.finish) {
      return absl::DataLossError(absl::StrCat("request ", id, ": got ", Tokens(got.tokens), " finish ",
                                              static_cast<int>(got.finish), ", expected ", Tokens(expected.tokens),
                                              " finish ", static_cast<int>(expected.finish)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Span<const EngineMode> DifferentialModes() { return kModes; }

RandomWorkload MakeRandomWorkload(uint32_t seed) {
  Draw uniform(seed);
  RandomWorkload w;
  w.seed = seed;
  EngineConfig& c = w.config = RandomConfig(uniform);
  const int num_requests = uniform(1, 10);
  std::vector<TokenId> shared_prefix(uniform(1, c.max_model_len - 1));
  for (TokenId& t : shared_prefix) t = uniform(1, kVocab - 1);
  for (int i = 0; i < num_requests; ++i) {
    Arrival& a = w.arrivals.emplace_back();
    const RequestId id = 100 + i;
    a.at_iteration = uniform(0, 1) == 0 ? 0 : uniform(0, 30);
    a.spec.id = id;
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
    if (uniform(0, 5) == 0) w.aborts[uniform(0, 60)].push_back(id);
    if (uniform(0, 3) == 0) w.stop_tokens[id] = uniform(1, kVocab - 1);
  }
  w.description = absl::StrCat("seed ", seed, ": B=", c.block_size, " L=", c.max_model_len, " blocks=",
                               c.num_kv_blocks, " budget=", c.max_num_batched_tokens, " seqs=", c.max_num_seqs,
                               " prefix_cache=", c.enable_prefix_caching, " priority=",
                               c.policy == SchedulingPolicy::kPriority, " chunked=", c.enable_chunked_prefill,
                               " requests=", num_requests, " timed_aborts=", w.aborts.size(),
                               " stop_strings=", w.stop_tokens.size());
  return w;
}

absl::Status RunDifferential(const RandomWorkload& w, const DifferentialOptions& options,
                             DifferentialTally* tally) {
  ++tally->workloads;
  FakeExecutorOptions executor;
  executor.vocab_size = kVocab;
  WorkloadOptions base;
  base.stop_tokens = w.stop_tokens;
  base.check_invariants = options.check_invariants;

  EngineConfig sync_config = w.config;
  sync_config.async_scheduling = false;
  sync_config.batch_queue_depth = 1;
  const WorkloadRun reference = RunEngineWorkload(sync_config, CopyArrivals(w.arrivals), executor, base);
  ++tally->runs;
  tally->steps_checked += reference.steps_checked;
  absl::Status first = Compare(reference, reference, false);
  for (const auto& [id, result] : reference.results) {
    if (first.ok() && result.finish == FinishReason::kNone) {
      first = absl::InternalError(absl::StrCat("request ", id, " never finished"));
    }
    tally->stopped += result.finish == FinishReason::kStop ? 1 : 0;
    tally->stop_strings += result.finish == FinishReason::kAbort ? 1 : 0;
  }
  if (!first.ok()) {
    ++tally->mismatches;
    return absl::Status(first.code(), absl::StrCat(w.description, ", reference (sync, depth 1): ", first.message()));
  }
  tally->preemptions += reference.stats.num_preemptions;

  for (const EngineMode& mode : DifferentialModes()) {
    for (bool with_aborts : {false, true}) {
      if (with_aborts && w.aborts.empty()) continue;
      EngineConfig config = w.config;
      config.async_scheduling = mode.async_scheduling;
      config.batch_queue_depth = mode.batch_queue_depth;
      config.pipeline_parallel_size = mode.pipeline_parallel_size;
      WorkloadOptions run_options = base;
      run_options.fault = options.fault;
      if (with_aborts) run_options.aborts = w.aborts;
      const WorkloadRun run = RunEngineWorkload(config, CopyArrivals(w.arrivals), executor, run_options);
      ++tally->runs;
      tally->steps_checked += run.steps_checked;
      tally->preemptions += run.stats.num_preemptions;
      tally->stale_tokens += run.stats.num_stale_tokens_delivered;
      tally->wasted_rows += run.stats.num_wasted_rows;
      for (const auto& [id, result] : run.results) tally->aborted += result.finish == FinishReason::kAbort ? 1 : 0;
      if (absl::Status s = Compare(reference, run, with_aborts); !s.ok()) {
        ++tally->mismatches;
        if (first.ok()) {
          first = absl::Status(s.code(), absl::StrCat(w.description, ", ", mode.name,
                                                      with_aborts ? ", with aborts" : "", ": ", s.message()));
        }
      }
    }
  }
  return first;
}

}  // namespace tandem::scheduler::testing
