#include "scheduler/testing/invariant_checker.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace tandem::scheduler {
namespace {

struct InFlightTally {
  int64_t tokens = 0;
  int32_t sampling_rows = 0;
};

absl::Status Violation(const Request& r, const std::string& what) {
  return absl::InternalError(absl::StrCat(
      "request ", r.id(), " (", RequestStatusName(r.status), ", P=", r.num_prompt_tokens(), " N=", r.num_tokens(),
      " C=", r.num_computed_tokens, " ph=", r.num_output_placeholders, " IF=", r.num_in_flight_tokens,
      " ST=", r.num_stale_output_tokens, "): ", what));
}

absl::Status CheckRequest(const Scheduler& s, const Request& r, const InFlightTally& tally) {
  const EngineConfig& config = s.config();
  const int32_t C = r.num_computed_tokens;
  const int32_t N = r.num_tokens();
  const int32_t ph = r.num_output_placeholders;
  if (ph < 0 || r.num_in_flight_tokens < 0 || r.num_stale_output_tokens < 0 ||
      r.num_stale_output_tokens > r.num_in_flight_tokens) {
    return Violation(r, "counter out of range");
  }
  if (!config.async_scheduling && ph != 0) return Violation(r, "placeholder without async scheduling");
  if (r.num_output_tokens() + ph > r.max_tokens()) return Violation(r, "scheduled past max_tokens");
  if (N + ph > config.max_model_len) return Violation(r, "scheduled past max_model_len");
  if (r.num_in_flight_tokens != tally.tokens) {
    return Violation(r, absl::StrCat("IF disagrees with the ", tally.tokens, " tokens in flight"));
  }
  if (r.num_stale_output_tokens > 0) {
    if (ph != 0 || r.num_stale_output_tokens != r.num_in_flight_tokens) {
      return Violation(r, "stale output must be all that is in flight, with no placeholders");
    }
  } else if (config.async_scheduling && ph != tally.sampling_rows) {
    return Violation(r, absl::StrCat("ph disagrees with the ", tally.sampling_rows, " sampling rows in flight"));
  }
  if (r.status == RequestStatus::kRunning) {
    const int32_t unsampled = config.async_scheduling ? 0 : tally.sampling_rows;
    if (r.is_prefill_chunk ? C >= N + ph : C != N + ph + unsampled - 1) {
      return Violation(r, r.is_prefill_chunk ? "prefill chunk reached the end" : "decode needs C == N + ph - 1");
    }
    if (C > config.max_model_len - 1) return Violation(r, "computed past max_model_len");
    // A hash names KV that an emitted step computes (§4.5): never a block
    // past C, whose positions no step has been scheduled to compute.
    if (r.num_cached_blocks * config.block_size > C) return Violation(r, "cached a block past C");
    if (static_cast<int32_t>(r.blocks.size()) != s.kv_cache().BlocksFor(C)) {
      return Violation(r, absl::StrCat("owns ", r.blocks.size(), " blocks for C=", C));
    }
  } else if (r.status == RequestStatus::kWaiting || r.status == RequestStatus::kPreempted) {
    if (!r.blocks.empty() || C != 0 || ph != 0) return Violation(r, "a queued request holds KV state");
  } else {
    return Violation(r, "a finished request is still in the table");
  }
  if (r.num_cached_blocks > static_cast<int32_t>(r.blocks.size()) ||
      r.num_cached_blocks * config.block_size > N) {
    return Violation(r, "cached beyond the committed tokens");
  }
  if (config.enable_prefix_caching) {
    const BlockPool& pool = s.kv_cache().pool();
    for (int32_t i = 0; i < r.num_cached_blocks; ++i) {
      const KvBlock& block = pool.block(r.blocks[i]);
      if (!block.has_hash || block.hash != r.block_hashes()[i]) {
        return Violation(r, absl::StrCat("cached block ", r.blocks[i], " does not carry the request's hash"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckQueues(const Scheduler& s) {
  absl::flat_hash_map<const Request*, int> seen;
  for (const Request* r : s.running()) {
    if (r->status != RequestStatus::kRunning) return Violation(*r, "in the running list but not RUNNING");
    if (++seen[r] > 1) return Violation(*r, "twice in the queues");
  }
  for (const Request* r : s.WaitingSnapshot()) {
    if (r->status != RequestStatus::kWaiting && r->status != RequestStatus::kPreempted) {
      return Violation(*r, "in a waiting queue but not WAITING or PREEMPTED");
    }
    if (++seen[r] > 1) return Violation(*r, "twice in the queues");
  }
  if (seen.size() != s.num_requests()) {
    return absl::InternalError(absl::StrCat(seen.size(), " queued requests, ", s.num_requests(), " in the table"));
  }
  if (static_cast<int32_t>(s.running().size()) > s.config().max_num_seqs) {
    return absl::InternalError("more running requests than max_num_seqs");
  }
  return absl::OkStatus();
}

absl::Status CheckBlocks(const Scheduler& s) {
  const BlockPool& pool = s.kv_cache().pool();
  std::vector<int32_t> refs(pool.num_blocks(), 0);
  for (const Request* r : s.AllRequests()) {
    for (BlockId b : r->blocks) ++refs[b];
  }
  for (const DeferredFree& d : s.deferred_frees()) {
    for (BlockId b : d.blocks) ++refs[b];
  }
  int32_t free = 0;
  int32_t hashed = 0;
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    const KvBlock& block = pool.block(b);
    if (block.ref_cnt != refs[b]) {
      return absl::InternalError(absl::StrCat("block ", b, " has ref ", block.ref_cnt, " but ", refs[b], " holders"));
    }
    if (block.in_free_queue != (refs[b] == 0)) {
      return absl::InternalError(absl::StrCat("block ", b, " is free iff unreferenced: violated"));
    }
    free += refs[b] == 0 ? 1 : 0;
    if (block.has_hash) {
      ++hashed;
      if (!pool.IsRegistered(b)) return absl::InternalError(absl::StrCat("block ", b, " hash is not in the map"));
    }
  }
  if (pool.block(BlockPool::kNullBlock).in_free_queue || refs[BlockPool::kNullBlock] != 0) {
    return absl::InternalError("the null block was handed out");
  }
  if (free != pool.num_free_blocks() || static_cast<int32_t>(pool.FreeQueueOrder().size()) != free) {
    return absl::InternalError(absl::StrCat("free + referenced != total: ", free, " unreferenced, ",
                                            pool.num_free_blocks(), " counted free"));
  }
  if (static_cast<size_t>(hashed) != pool.num_cached_entries()) {
    return absl::InternalError("the prefix-cache map holds blocks without their hash");
  }
  StepSeq previous_fence = 0;
  for (const DeferredFree& d : s.deferred_frees()) {
    if (d.fence < previous_fence || d.fence <= s.processed_step_seq() || d.fence > s.sched_step_seq()) {
      return absl::InternalError(absl::StrCat("deferred free with fence ", d.fence, " (processed ",
                                              s.processed_step_seq(), ", scheduled ", s.sched_step_seq(), ")"));
    }
    previous_fence = d.fence;
  }
  if (s.processed_step_seq() > s.sched_step_seq()) return absl::InternalError("processed a step never scheduled");
  return absl::OkStatus();
}

}  // namespace

absl::Status InvariantChecker::Check(const Scheduler& scheduler,
                                     const std::deque<SchedulerOutput>& in_flight) {
  absl::flat_hash_map<RequestId, InFlightTally> tally;
  for (const SchedulerOutput& step : in_flight) {
    for (const ScheduledRequest& row : step.scheduled) {
      InFlightTally& t = tally[row.id];
      t.tokens += row.num_tokens;
      t.sampling_rows += row.samples ? 1 : 0;
    }
  }
  for (const Request* r : scheduler.AllRequests()) {
    auto it = tally.find(r->id());
    TANDEM_RETURN_IF_ERROR(CheckRequest(scheduler, *r, it == tally.end() ? InFlightTally{} : it->second));
  }
  TANDEM_RETURN_IF_ERROR(CheckQueues(scheduler));
  return CheckBlocks(scheduler);
}

absl::Status InvariantChecker::CheckFreshBlocks(const Scheduler& s, const SchedulerOutput& step) {
  const int32_t B = s.config().block_size;
  last_writer_.resize(s.kv_cache().pool().num_blocks(), 0);
  auto check_fresh = [&](absl::Span<const BlockId> blocks) -> absl::Status {
    for (BlockId b : blocks) {
      if (last_writer_[b] > s.processed_step_seq()) {
        return absl::InternalError(absl::StrCat("block ", b, " handed out in step ", step.step_seq,
                                                " while step ", last_writer_[b], " may still write it"));
      }
    }
    return absl::OkStatus();
  };
  for (const NewRequestData& data : step.new_requests) {
    TANDEM_RETURN_IF_ERROR(check_fresh(absl::MakeConstSpan(data.block_ids).subspan(data.num_computed_tokens / B)));
  }
  for (size_t i = 0; i < step.cached.size(); ++i) {
    auto blocks = step.cached.NewBlocks(i);
    if (step.cached.resumed[i]) blocks = blocks.subspan(step.cached.num_computed_tokens[i] / B);
    TANDEM_RETURN_IF_ERROR(check_fresh(blocks));
  }
  // Record the blocks this step writes: positions [C - n, C) of each row.
  for (const ScheduledRequest& row : step.scheduled) {
    const Request* r = s.FindRequest(row.id);
    const int32_t end = r->num_computed_tokens;
    for (int32_t b = (end - row.num_tokens) / B; b <= (end - 1) / B; ++b) last_writer_[r->blocks[b]] = step.step_seq;
  }
  return absl::OkStatus();
}

void InvariantChecker::Report(absl::Status status) {
  if (status.ok()) return;
  if (on_violation_ == OnViolation::kCrash) TANDEM_CHECK_OK(status);
  violation_ = std::move(status);
}

void InvariantChecker::OnScheduled(const EngineCore& engine, const SchedulerOutput& step) {
  if (!violation_.ok()) return;
  ++num_checks_;
  if (!step.empty()) Report(CheckFreshBlocks(engine.scheduler(), step));
  if (violation_.ok()) Report(Check(engine.scheduler(), engine.in_flight()));
}

void InvariantChecker::OnUpdated(const EngineCore& engine, const SchedulerOutput& step,
                                 const ModelRunnerOutput& result, absl::Span<const RequestOutput> outputs) {
  if (!violation_.ok()) return;
  ++num_checks_;
  Report(Check(engine.scheduler(), engine.in_flight()));
}

}  // namespace tandem::scheduler
