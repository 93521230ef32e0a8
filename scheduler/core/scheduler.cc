// Scheduler: construction, admission of requests, aborts, preemption and
// block freeing. Schedule() is in scheduler_schedule.cc, UpdateFromOutput()
// in scheduler_update.cc.
#include "scheduler/core/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace tandem::scheduler {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const EngineConfig& config) {
  TANDEM_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<Scheduler>(new Scheduler(config));
}

Scheduler::Scheduler(const EngineConfig& config)
    : config_(config),
      decode_cadence_(config.DecodeCadence()),
      // A step in flight may still write a finished request's blocks, and our
      // transports and stages are not ordered with one stream: whenever more
      // than one step can be in flight, frees wait for their fence.
      defer_block_free_(config.EffectiveQueueDepth() > 1),
      kv_(config),
      waiting_(config.policy),
      skipped_waiting_(config.policy) {}

absl::Status Scheduler::ValidateRequest(const RequestSpec& spec) const {
  const SamplingParams& s = spec.sampling;
  if (requests_.contains(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id ", spec.id, " is already in use"));
  }
  if (spec.prompt_token_ids.empty()) return absl::InvalidArgumentError("prompt is empty");
  // vLLM's rule: a priority means something only to the priority policy, and
  // a client that sends one to an FCFS server is told so rather than ignored.
  if (spec.priority != 0 && config_.policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got priority ", spec.priority,
        " but priority scheduling is not enabled (start the server with --scheduling-policy=priority)"));
  }
  if (s.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", s.max_tokens));
  }
  if (s.min_tokens < 0 || s.min_tokens > s.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens must be in [0, max_tokens=",
                                                   s.max_tokens, "], got ", s.min_tokens));
  }
  const int64_t prompt_len = static_cast<int64_t>(spec.prompt_token_ids.size());
  if (prompt_len >= config_.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_len, " tokens, but max_model_len is ", config_.max_model_len,
                     ": the prompt must be shorter to leave room for one output token"));
  }
  if (config_.vocab_size > 0) {
    for (TokenId t : spec.prompt_token_ids) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt token id ", t, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
  }
  if (spec.grammar != nullptr && config_.vocab_size <= 0) {
    return absl::InvalidArgumentError("structured output needs the engine's vocab_size");
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddRequest(RequestSpec spec) {
  TANDEM_RETURN_IF_ERROR(ValidateRequest(spec));
  // Without block hashes a request neither reads nor fills the prefix cache:
  // prompt logprobs need logits at every prompt position.
  const bool hashed = config_.enable_prefix_caching && spec.sampling.prompt_logprobs < 0;
  auto request = std::make_unique<Request>(
      std::move(spec), next_arrival_seq_++, hashed ? config_.block_size : 0,
      config_.prefix_cache_hash_seed);
  waiting_.Add(requests_.Insert(std::move(request)));
  return absl::OkStatus();
}

void Scheduler::AbortRequests(absl::Span<const RequestId> ids, std::vector<RequestOutput>* outputs) {
  for (RequestId id : ids) {
    Request* request = requests_.Find(id);
    if (request == nullptr) continue;
    if (request->status == RequestStatus::kRunning) {
      running_.erase(std::find(running_.begin(), running_.end(), request));
    } else if (!waiting_.Remove(request)) {
      TANDEM_CHECK(skipped_waiting_.Remove(request)) << "request " << id << " is in no queue";
    }
    FinishRequest(request, RequestStatus::kFinishedAborted);
    RequestOutput& out = outputs->emplace_back();
    out.id = id;
    out.finish_reason = FinishReason::kAbort;
    out.num_output_tokens = request->num_output_tokens();
    requests_.Erase(request);
  }
}

void Scheduler::FailStartedRequests(const absl::Status& error, std::vector<RequestOutput>* outputs) {
  // Nothing in flight will ever be processed: every fence has passed.
  processed_step_seq_ = sched_step_seq_;
  DrainDeferredFrees();
  std::vector<Request*> failed;
  requests_.ForEach([&failed](const Request& r) {
    if (r.status == RequestStatus::kRunning || r.status == RequestStatus::kPreempted || r.num_in_flight_tokens > 0) {
      failed.push_back(const_cast<Request*>(&r));
    }
  });
  running_.clear();
  for (Request* r : failed) {
    if (r->status != RequestStatus::kRunning && !waiting_.Remove(r)) skipped_waiting_.Remove(r);
    r->error = error;
    FinishRequest(r, RequestStatus::kFinishedError);
    RequestOutput& out = outputs->emplace_back();
    out.id = r->id();
    out.finish_reason = FinishReason::kError;
    out.error = error;
    out.num_output_tokens = r->num_output_tokens();
    requests_.Erase(r);
  }
  // Workers start the next group with no requests; what they held is gone.
  finished_ids_.clear();
  preempted_ids_.clear();
  TANDEM_CHECK(kv_.mutable_pool().ResetPrefixCache()) << "blocks still held after failing every started request";
}

bool Scheduler::CanFreeBlocksNow(const Request& request) const {
  if (kFaultInjection && fault_ == SchedulerFault::kNoFence) return true;
  return !defer_block_free_ || request.last_sched_seq <= processed_step_seq_;
}

void Scheduler::FreeRequestBlocks(Request* request) {
  if (CanFreeBlocksNow(*request)) {
    kv_.Free(*request);
    return;
  }
  std::vector<BlockId> blocks = kv_.TakeBlocks(*request);
  // Fence = the newest scheduled step, so the deque stays sorted by fence.
  if (!blocks.empty()) deferred_frees_.push_back({sched_step_seq_, std::move(blocks)});
}

void Scheduler::DrainDeferredFrees() {
  while (!deferred_frees_.empty() && deferred_frees_.front().fence <= processed_step_seq_) {
    kv_.FreeDetached(deferred_frees_.front().blocks);
    deferred_frees_.pop_front();
  }
}

void Scheduler::Preempt(Request* request) {
  FreeRequestBlocks(request);
  request->status = RequestStatus::kPreempted;
  request->num_computed_tokens = 0;
  request->is_prefill_chunk = false;
  request->next_decode_eligible_step = 0;
  // Output already in flight was sampled from a correct context: it will be
  // delivered, but must not touch the reset counters, and the request is not
  // re-admitted until it has drained (scheduler/README.md §4.8).
  request->num_stale_output_tokens = request->num_in_flight_tokens;
  request->num_output_placeholders = 0;
  ++request->num_preemptions;
  ++stats_.num_preemptions;
  waiting_.Prepend(request);
  preempted_ids_.push_back(request->id());
}

void Scheduler::FinishRequest(Request* request, RequestStatus status) {
  TANDEM_DCHECK(IsFinished(status));
  request->status = status;
  ++stats_.num_finished[static_cast<int>(FinishReasonOf(status))];
  FreeRequestBlocks(request);
  finished_ids_.push_back(request->id());
}

GrammarOutput Scheduler::GetGrammarBitmask(const SchedulerOutput& step) const {
  GrammarOutput out;
  if (!step.has_structured_output_requests) return out;
  out.words_per_row = (config_.vocab_size + 31) / 32;
  for (const ScheduledRequest& row : step.scheduled) {
    if (!row.samples) continue;
    const Request* r = requests_.Resolve(row.handle);
    if (r == nullptr || !r->uses_structured_output()) continue;
    out.request_ids.push_back(row.id);
    out.bitmask.resize(out.bitmask.size() + out.words_per_row, 0);
    auto mask = absl::MakeSpan(out.bitmask).subspan(out.bitmask.size() - out.words_per_row);
    r->grammar()->FillBitmask(mask, config_.vocab_size);
  }
  return out;
}

const Request* Scheduler::FindRequest(RequestId id) const {
  return requests_.Find(id);
}

std::vector<const Request*> Scheduler::AllRequests() const {
  std::vector<const Request*> all;
  all.reserve(requests_.size());
  requests_.ForEach([&all](const Request& r) { all.push_back(&r); });
  return all;
}

std::vector<Request*> Scheduler::WaitingSnapshot() const {
  std::vector<Request*> all = skipped_waiting_.Snapshot();
  std::vector<Request*> waiting = waiting_.Snapshot();
  all.insert(all.end(), waiting.begin(), waiting.end());
  return all;
}

}  // namespace tandem::scheduler
