// Scheduler::Schedule: the two passes of one step (vLLM's Scheduler.schedule();
// scheduler/README.md §5).
#include <algorithm>

#include "absl/base/attributes.h"
#include "common/check.h"
#include "common/sampling_rule.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {

SchedulerOutput Scheduler::Schedule() {
  ++current_step_;
  SchedulerOutput out;
  if (!spare_outputs_.empty()) {
    out = std::move(spare_outputs_.back());
    spare_outputs_.pop_back();
  }
  out.step_index = current_step_;
  int32_t token_budget = config_.max_num_batched_tokens;
  std::vector<Planned>& planned = planned_scratch_;  // reused: no allocation per step
  planned.clear();

  bool pool_exhausted = false;
  ScheduleRunning(&token_budget, &planned, &pool_exhausted);
  // No admissions in a step where a running request could not get a block:
  // what is free belongs to the running requests first.
  if (!pool_exhausted) ScheduleWaiting(&token_budget, &planned);

  for (const Planned& p : planned) out.total_num_scheduled_tokens += p.num_tokens;
  TANDEM_DCHECK(out.total_num_scheduled_tokens <= config_.max_num_batched_tokens);
  TANDEM_DCHECK(static_cast<int32_t>(running_.size()) <= config_.max_num_seqs);
  if (out.empty()) return out;  // not executed; finished/preempted ids wait

  out.step_seq = ++sched_step_seq_;
  out.finished_request_ids.swap(finished_ids_);
  out.preempted_request_ids.swap(preempted_ids_);
  EmitStep(planned, &out);
  ++stats_.num_steps;
  stats_.num_scheduled_tokens += out.total_num_scheduled_tokens;
  return out;
}

void SchedulerOutput::Clear() {
  step_seq = 0;
  step_index = 0;
  new_requests.clear();
  cached.request_ids.clear();
  cached.resumed.clear();
  cached.num_computed_tokens.clear();
  cached.new_block_offsets.assign(1, 0);
  cached.new_block_ids.clear();
  cached.resumed_requests.clear();
  scheduled.clear();
  total_num_scheduled_tokens = 0;
  finished_request_ids.clear();
  preempted_request_ids.clear();
  has_structured_output_requests = false;
  pending_structured_output_tokens = false;
}

void Scheduler::Recycle(SchedulerOutput&& step) {
  constexpr size_t kMaxSpare = 4;
  if (spare_outputs_.size() >= kMaxSpare) return;
  step.Clear();
  spare_outputs_.push_back(std::move(step));
}

int32_t Scheduler::CapTokens(const Request& request, int32_t gap, int32_t token_budget) const {
  int32_t n = gap;
  if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
  n = std::min(n, token_budget);
  // The position computed last must stay below max_model_len.
  return std::min(n, config_.max_model_len - 1 - request.num_computed_tokens);
}

void Scheduler::ScheduleRunning(int32_t* token_budget, std::vector<Planned>* planned,
                                bool* pool_exhausted) {
  // Set once a request is left without the blocks it needs. From then on the
  // requests after it run only within blocks they already own (issue 11,
  // defect 3: it used to end the pass, skipping requests that need nothing).
  // Why not let a later request take a free block: FCFS preempts the newest
  // admission, so running_ order is the order of claims on the pool. A block
  // that an earlier request needed (it needs more than is free, or what would
  // refill the pool is fenced) must not go to a later one: the earlier request
  // would wait again next step while the later one holds it, and the
  // preemption that feeds the earlier one would then take the later one first
  // and throw its work away. A request that needs no new block takes nothing
  // that anyone is owed, and preempts no one (only the first request left
  // without blocks preempts). Under the priority policy this is conservative:
  // a more important later request waits one step for a block.
  bool blocks_denied = false;
  // Pipeline phases (scheduler/README.md §7): with a cadence of P a request
  // decodes in one step of every P, the phase it last decoded in. Requests
  // that became eligible together (a burst admitted in one step) would keep
  // one phase for good, leaving P - 1 steps of every P empty and the stages
  // idle. So a step takes at most ceil(running / P) decode rows; the others
  // wait one step, which moves them into the next phase.
  const size_t cadence = static_cast<size_t>(decode_cadence_);
  const bool phased = cadence > 1;
  size_t decode_rows_left = (running_.size() + cadence - 1) / cadence;
  size_t i = 0;
  while (i < running_.size() && *token_budget > 0) {
    // Requests are scattered on the heap: fetch a few ahead.
    if (i + 4 < running_.size()) __builtin_prefetch(running_[i + 4]);
    Request* r = running_[i];
    // Exact at any queue depth (scheduler/README.md §4.4): when committed
    // outputs plus placeholders reach max_tokens, every remaining token is
    // already in flight.
    if (r->num_output_tokens() + r->num_output_placeholders >= r->max_tokens() ||
        current_step_ < r->next_decode_eligible_step) {
      ++i;
      continue;
    }
    const int32_t gap = r->num_tokens() + r->num_output_placeholders - r->num_computed_tokens;
    const bool decode = phased && gap == 1 && r->num_output_tokens() + r->num_output_placeholders > 0;
    if (decode && decode_rows_left == 0) {
      ++i;
      continue;
    }
    const int32_t n = CapTokens(*r, gap, *token_budget);
    if (n <= 0) {  // continue, not break: it must not block the requests after it
      ++i;
      continue;
    }
    const int32_t first_new_block = static_cast<int32_t>(r->blocks.size());
    // Most decode steps fit in the blocks the request owns: checked inline.
    const bool allocated = kv_.FitsOwnedBlocks(*r, n) ||
                           (!blocks_denied && AllocateOrPreempt(r, n, &i, token_budget, planned));
    if (!allocated) {
      *pool_exhausted = blocks_denied = true;
      // Skip it alone; it is still at running_[i] unless it was its own victim.
      if (i < running_.size() && running_[i] == r) ++i;
      continue;
    }
    planned->push_back({r, n, Planned::Kind::kRunning, first_new_block});
    *token_budget -= n;
    decode_rows_left -= decode;
    ++i;
  }
  // Only now is every running plan final (a later request may have taken an
  // earlier-planned one as its priority victim): register the full blocks
  // this step computes, so that a request admitted later in this same step
  // can still hit them (vLLM does the same).
  const bool early_hashes = kFaultInjection && fault_ == SchedulerFault::kEarlyHashes;
  for (const Planned& p : *planned) {
    Request* r = p.request;
    kv_.CacheBlocks(*r, early_hashes ? r->num_tokens()
                                     : std::min(r->num_computed_tokens + p.num_tokens, r->num_tokens()));
  }
}

bool Scheduler::AllocateOrPreempt(Request* r, int32_t n, size_t* index, int32_t* token_budget,
                                  std::vector<Planned>* planned) {
  while (!kv_.ReserveSlots(*r, n)) {
    // Blocks freed earlier are still fenced by steps in flight and come
    // back without preempting anyone else; preempting now would cascade.
    if (!deferred_frees_.empty()) return false;
    const Request* victim = nullptr;
    const bool freed_now = PreemptOne(r, index, token_budget, planned, &victim);
    // A victim whose blocks wait behind a fence frees nothing now: retrying
    // would preempt the whole batch for nothing (vLLM issue 49674).
    if (victim == r || !freed_now) return false;
  }
  return true;
}

bool Scheduler::PreemptOne(Request* current, size_t* index, int32_t* token_budget,
                           std::vector<Planned>* planned, const Request** victim_out) {
  Request* victim;
  if (config_.policy == SchedulingPolicy::kPriority) {
    auto it = std::max_element(running_.begin(), running_.end(),
                               [](const Request* a, const Request* b) { return ComesBefore(*a, *b); });
    victim = *it;
    const size_t victim_index = static_cast<size_t>(it - running_.begin());
    running_.erase(it);
    if (victim_index < *index) --*index;
    // Priority may take a request already planned in this step: undo it.
    auto p = std::find_if(planned->begin(), planned->end(),
                          [victim](const Planned& q) { return q.request == victim; });
    if (p != planned->end()) {
      *token_budget += p->num_tokens;
      planned->erase(p);
    }
  } else {
    // FCFS takes the most recently admitted; never one planned before
    // `current`, which sits earlier in admission order.
    victim = running_.back();
    running_.pop_back();
  }
  TANDEM_DCHECK(victim == current || victim != nullptr);
  const bool freed_now = CanFreeBlocksNow(*victim);
  Preempt(victim);
  *victim_out = victim;
  return freed_now;
}

RequestQueue& Scheduler::SelectWaitingQueue() {
  if (skipped_waiting_.empty()) return waiting_;
  if (waiting_.empty() || config_.policy == SchedulingPolicy::kFcfs) return skipped_waiting_;
  return ComesBefore(*skipped_waiting_.Peek(), *waiting_.Peek()) ? skipped_waiting_ : waiting_;
}

void Scheduler::ScheduleWaiting(int32_t* token_budget, std::vector<Planned>* planned) {
  std::vector<Request*> skipped;
  while ((!waiting_.empty() || !skipped_waiting_.empty()) && *token_budget > 0) {
    if (static_cast<int32_t>(running_.size()) >= config_.max_num_seqs) break;
    RequestQueue& queue = SelectWaitingQueue();
    Request* r = queue.Peek();
    // Stale output still in flight: resuming now could resample a position
    // that output will deliver.
    if (r->num_stale_output_tokens > 0) {
      skipped.push_back(queue.Pop());
      continue;
    }
    const int32_t hit = kv_.FindCachedPrefix(*r, &hit_scratch_);
    // N, not P: a resumed request recomputes its committed outputs too.
    int32_t n = r->num_tokens() - hit;
    if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
    if (!config_.enable_chunked_prefill && n > *token_budget) break;
    n = std::min(n, *token_budget);
    if (!kv_.AllocateSlots(*r, n, hit_scratch_, config_.reserve_full_sequence,
                           /*apply_watermark=*/!running_.empty())) {
      break;  // the waiting pass ends at the first request that does not fit
    }
    queue.Pop();
    if (kFaultInjection && fault_ == SchedulerFault::kEarlyHashes) kv_.CacheBlocks(*r, r->num_tokens());
    kv_.RecordPrefixLookup(r->num_tokens(), hit);
    const auto kind = r->status == RequestStatus::kPreempted ? Planned::Kind::kResumed : Planned::Kind::kNew;
    r->status = RequestStatus::kRunning;
    r->num_computed_tokens = hit;
    running_.push_back(r);
    planned->push_back({r, n, kind, 0});
    *token_budget -= n;
  }
  skipped_waiting_.PrependAll(skipped);
}

void Scheduler::EmitStep(const std::vector<Planned>& planned, SchedulerOutput* out) {
  CachedRequestData& cached = out->cached;
  cached.request_ids.reserve(planned.size());
  cached.resumed.reserve(planned.size());
  cached.num_computed_tokens.reserve(planned.size());
  cached.new_block_offsets.reserve(planned.size() + 1);
  out->scheduled.reserve(planned.size());
  // One pass, touching each request once. Planned order has every running
  // request before the admitted ones, so cached entries come out as
  // "running, then resumed".
  const size_t rows = planned.size();  // hoisted, as in UpdateFromOutput
  for (size_t i = 0; i < rows; ++i) {
    if (i + 4 < rows) __builtin_prefetch(planned[i + 4].request);
    const Planned& p = planned[i];
    Request* r = p.request;
    switch (p.kind) {
      case Planned::Kind::kRunning:
        AddCachedEntry(*r, absl::MakeConstSpan(r->blocks).subspan(p.first_new_block), false, &cached);
        break;
      case Planned::Kind::kResumed: {
        AddCachedEntry(*r, r->blocks, true, &cached);
        CachedRequestData::Resumed& resumed = cached.resumed_requests.emplace_back();
        resumed.token_ids.assign(r->all_token_ids().begin(), r->all_token_ids().end());
        resumed.num_prompt_tokens = r->num_prompt_tokens();
        resumed.sampling = r->sampling();
        resumed.structured_output = r->uses_structured_output();
        break;
      }
      case Planned::Kind::kNew: {
        NewRequestData& data = out->new_requests.emplace_back();
        data.id = r->id();
        data.prompt_token_ids.assign(r->all_token_ids().begin(), r->all_token_ids().end());
        data.sampling = r->sampling();
        data.structured_output = r->uses_structured_output();
        data.block_ids = r->blocks;
        data.num_computed_tokens = r->num_computed_tokens;
        break;
      }
    }
    AdvanceScheduled(r, p.num_tokens, out);
  }
}

// Inlined, as AdvanceScheduled: once per request and step, and the calls'
// register saves were a fifth of their cost (callgrind).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Scheduler::AddCachedEntry(const Request& r,
                                                                   absl::Span<const BlockId> new_blocks,
                                                                   bool resumed, CachedRequestData* cached) {
  cached->request_ids.push_back(r.id());
  cached->resumed.push_back(resumed ? 1 : 0);
  cached->num_computed_tokens.push_back(r.num_computed_tokens);  // C before this step
  // Most decode rows add no block: no call into the vector for them.
  if (!new_blocks.empty()) {
    cached->new_block_ids.insert(cached->new_block_ids.end(), new_blocks.begin(), new_blocks.end());
  }
  cached->new_block_offsets.push_back(static_cast<int32_t>(cached->new_block_ids.size()));
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Scheduler::AdvanceScheduled(Request* r, int32_t num_tokens,
                                                                     SchedulerOutput* out) {
  const int32_t sequence_length = r->num_tokens() + r->num_output_placeholders;
  const bool samples = StepSamples(r->num_computed_tokens, num_tokens, sequence_length);
  r->num_computed_tokens += num_tokens;
  r->num_in_flight_tokens += num_tokens;
  r->last_sched_seq = out->step_seq;
  r->is_prefill_chunk = !samples;
  out->scheduled.push_back({r->id(), num_tokens, samples, r->handle});
  if (!samples) return;
  out->has_structured_output_requests |= r->uses_structured_output();
  if (!config_.async_scheduling) return;
  // The grammar has not seen the token still in flight: sampling must wait.
  out->pending_structured_output_tokens |= r->uses_structured_output() && r->num_output_placeholders > 0;
  ++r->num_output_placeholders;
  r->next_decode_eligible_step = current_step_ + decode_cadence_;
}

}  // namespace tandem::scheduler
