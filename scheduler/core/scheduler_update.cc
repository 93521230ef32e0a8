// Scheduler::UpdateFromOutput: reconciling a step with its result
// (vLLM's Scheduler.update_from_output() and
// AsyncScheduler._update_request_with_output(); scheduler/README.md §4.3,
// §4.5, §4.6, §4.8).
#include <algorithm>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {
namespace {

// Reports the logprobs of the tokens `out` took from `row` of `result` (a
// prefix of the row's tokens: those after a stop are discarded), so that
// out->logprobs stays aligned with out->new_token_ids.
void CopyLogprobs(const ModelRunnerOutput& result, size_t row, RequestOutput* out) {
  const size_t available = result.NumLogprobs(row);
  if (available == 0) return;  // the request did not ask
  TANDEM_DCHECK(available == result.Sampled(row).size() && out->new_token_ids.size() <= available);
  out->logprobs.resize(out->new_token_ids.size());
  for (size_t j = 0; j < out->logprobs.size(); ++j) {
    const size_t k = static_cast<size_t>(result.logprob_offsets[row]) + j;
    TokenLogprob& lp = out->logprobs[j];
    lp.logprob = result.sampled_logprobs[k];
    auto ids = result.TopIds(k);
    auto logprobs = result.TopLogprobs(k);
    lp.top.reserve(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) lp.top.emplace_back(ids[t], logprobs[t]);
  }
}

// Appends the prompt scores of `row` that continue what `r` has gathered
// (chunks arrive in order; a recomputed prompt's come again and are skipped).
void GatherPromptLogprobs(const ModelRunnerOutput& result, size_t row, Request* r) {
  for (const PromptLogprobsChunk& chunk : result.prompt_logprobs) {
    if (chunk.row != row || r->prompt_logprobs_sent ||
        chunk.first_position != static_cast<int32_t>(r->prompt_logprobs.size())) {
      continue;
    }
    r->prompt_logprobs.insert(r->prompt_logprobs.end(), chunk.tokens.begin(), chunk.tokens.end());
  }
}

}  // namespace

// Inlined, like AppendDelivered below: both run once per request and step, and
// the calls' register saves were a tenth of the update (callgrind).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Scheduler::CheckStop(Request* request) const {
  const int32_t outputs = request->num_output_tokens();
  const TokenId last = request->all_token_ids().back();
  if (outputs >= request->min_tokens()) {
    if (last == request->stopping_eos_token_id()) {
      request->status = RequestStatus::kFinishedStopped;
      return true;
    }
    if (request->has_stop_token_ids()) {
      const std::vector<TokenId>& stop_ids = request->sampling().stop_token_ids;
      if (std::find(stop_ids.begin(), stop_ids.end(), last) != stop_ids.end()) {
        request->status = RequestStatus::kFinishedStopped;
        request->stop_reason = last;
        return true;
      }
    }
  }
  // Length limits hold whatever min_tokens says: nothing is ever scheduled
  // past max_model_len, and min_tokens <= max_tokens by validation.
  if (request->num_tokens() >= config_.max_model_len || outputs >= request->max_tokens()) {
    request->status = RequestStatus::kFinishedLengthCapped;
    return true;
  }
  return false;
}

void Scheduler::UpdateFromOutput(const SchedulerOutput& step, const ModelRunnerOutput& result,
                                 std::vector<RequestOutput>* outputs) {
  TANDEM_CHECK(step.step_seq == processed_step_seq_ + 1)
      << "steps must be updated once each, in order: got " << step.step_seq << " after "
      << processed_step_seq_;
  TANDEM_CHECK(result.request_ids.size() == step.scheduled.size())
      << "step " << step.step_seq << " has " << step.scheduled.size() << " rows, result has "
      << result.request_ids.size();
  processed_step_seq_ = step.step_seq;
  DrainDeferredFrees();

  std::vector<std::pair<Request*, RequestStatus>> finished;
  // At most one output a row: reserved once, not regrown (and every
  // RequestOutput moved) as a decode batch's outputs are appended.
  outputs->reserve(outputs->size() + step.scheduled.size());
  constexpr size_t kPrefetchAhead = 4;  // requests are scattered on the heap
  // Hoisted: the calls below could change the vector for all the compiler
  // knows, so it would recompute the size (a division) twice a row.
  const size_t rows = step.scheduled.size();
  const ScheduledRequest* const scheduled_rows = step.scheduled.data();
  for (size_t row = 0; row < rows; ++row) {
    if (row + kPrefetchAhead < rows) __builtin_prefetch(requests_.Resolve(scheduled_rows[row + kPrefetchAhead].handle));
    const ScheduledRequest& scheduled = scheduled_rows[row];
    Request* r = requests_.Resolve(scheduled.handle);
    if (r == nullptr) {
      // Finished or aborted while this step was in flight: its work is wasted.
      ++stats_.num_wasted_rows;
      continue;
    }
    r->num_in_flight_tokens -= scheduled.num_tokens;
    TANDEM_CHECK(r->num_in_flight_tokens >= 0) << "in-flight underflow for request " << r->id();
    // Stale and in-flight tokens drain in lockstep; a step scheduled before
    // the preemption is stale as a whole.
    const bool stale = r->num_stale_output_tokens > 0;
    if (stale) {
      r->num_stale_output_tokens -= scheduled.num_tokens;
      TANDEM_CHECK(r->num_stale_output_tokens >= 0) << "stale underflow for request " << r->id();
    }
    if (!result.prompt_logprobs.empty()) GatherPromptLogprobs(result, row, r);
    absl::Span<const TokenId> sampled = result.Sampled(row);
    if (sampled.empty()) continue;  // a prefill chunk
    const RequestStatus before = r->status;
    RequestOutput& out = outputs->emplace_back();
    const bool done = AppendDelivered(r, sampled, stale, &out);
    if (result.has_logprobs()) CopyLogprobs(result, row, &out);
    if (r->sampling().prompt_logprobs >= 0 && !r->prompt_logprobs_sent) {
      out.prompt_logprobs = std::move(r->prompt_logprobs);
      r->prompt_logprobs_sent = true;
    }
    if (done) finished.emplace_back(r, before);
  }
  if (!finished.empty()) RemoveFinished(finished);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Scheduler::AppendDelivered(Request* r, absl::Span<const TokenId> sampled,
                                                                    bool stale, RequestOutput* out) {
  const bool was_running = r->status == RequestStatus::kRunning;
  out->id = r->id();
  out->stale = stale;
  bool stopped = false;
  for (TokenId token : sampled) {
    r->AppendOutputToken(token);
    out->new_token_ids.push_back(token);
    if (CheckStop(r)) {
      stopped = true;
      break;
    }
  }
  const auto delivered = static_cast<int32_t>(out->new_token_ids.size());
  if (stale) {
    // Placeholders were reset at preemption: a late delivery must not touch them.
    stats_.num_stale_tokens_delivered += delivered;
  } else if (config_.async_scheduling) {
    r->num_output_placeholders -= delivered;
    TANDEM_CHECK(r->num_output_placeholders >= 0) << "placeholder underflow for request " << r->id();
  }
  // Positions still in flight have unknown ids: cache only up to C - ph.
  // Done before a finished request is freed, so its last blocks are cached.
  if (was_running) kv_.CacheBlocks(*r, r->num_computed_tokens - r->num_output_placeholders);

  if (r->grammar() != nullptr && !r->grammar()->AcceptTokens(out->new_token_ids)) {
    r->status = RequestStatus::kFinishedError;
    r->error = absl::InvalidArgumentError(
        absl::StrCat("token ", out->new_token_ids.back(), " is not allowed by the request's grammar"));
    stopped = true;
  }
  if (stopped) {
    out->finish_reason = FinishReasonOf(r->status);
    out->stop_reason = r->stop_reason;
    out->error = r->error;
    FinishRequest(r, r->status);
  }
  out->num_output_tokens = r->num_output_tokens();
  out->num_output_placeholders = r->num_output_placeholders;
  return stopped;
}

void Scheduler::RemoveFinished(const std::vector<std::pair<Request*, RequestStatus>>& finished) {
  bool any_running = false;
  for (const auto& [request, before] : finished) {
    if (before == RequestStatus::kRunning) {
      any_running = true;
    } else if (!waiting_.Remove(request)) {
      // A preempted request finished by its stale output.
      TANDEM_CHECK(skipped_waiting_.Remove(request)) << "request " << request->id() << " is in no queue";
    }
  }
  if (any_running) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Request* r) { return r->is_finished(); }),
                   running_.end());
  }
  for (const auto& entry : finished) requests_.Erase(entry.first);
}

}  // namespace tandem::scheduler
