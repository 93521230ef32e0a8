// The data of one step, as the engine sees it (scheduler/README.md §3). These
// are plain structs; scheduler/wire/step_codec.h converts them to and from the
// wire messages in proto/tandem/v1/step.proto.
//
// A running request's entry never carries token ids: the worker feeds its
// own last sampled token into the placeholder position. Only resumed
// requests, rebuilt after a preemption, carry their committed tokens.
#ifndef TANDEM_SCHEDULER_CORE_SCHEDULER_OUTPUT_H_
#define TANDEM_SCHEDULER_CORE_SCHEDULER_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/check.h"
#include "common/types.h"
#include "scheduler/core/request.h"
#include "scheduler/core/sampling_params.h"

namespace tandem::scheduler {

struct NewRequestData {
  RequestId id = 0;
  std::vector<TokenId> prompt_token_ids;
  SamplingParams sampling;
  bool structured_output = false;
  std::vector<BlockId> block_ids;
  int32_t num_computed_tokens = 0;  // prefix-cache hit: compute from here
};

// Requests the workers already know (or know again, when resumed), as
// parallel arrays indexed like request_ids.
struct CachedRequestData {
  std::vector<RequestId> request_ids;
  std::vector<uint8_t> resumed;             // 1: replace blocks, rebuild state
  std::vector<int32_t> num_computed_tokens;  // C before this step
  // Request i's new blocks are new_block_ids[new_block_offsets[i] .. [i+1]).
  std::vector<int32_t> new_block_offsets{0};
  std::vector<BlockId> new_block_ids;
  // One entry per resumed request, in order.
  struct Resumed {
    std::vector<TokenId> token_ids;  // prompt + committed outputs
    int32_t num_prompt_tokens = 0;
    SamplingParams sampling;
    bool structured_output = false;
  };
  std::vector<Resumed> resumed_requests;

  size_t size() const { return request_ids.size(); }
  absl::Span<const BlockId> NewBlocks(size_t i) const {
    return absl::MakeConstSpan(new_block_ids)
        .subspan(new_block_offsets[i], new_block_offsets[i + 1] - new_block_offsets[i]);
  }
};

struct ScheduledRequest {
  RequestId id = 0;
  int32_t num_tokens = 0;
  // Whether this row produces a sampled token (common/sampling_rule.h).
  // Kept for validating the model runner's answer; the worker derives the
  // same bit from the same rule.
  bool samples = false;
  // Engine-internal: resolves the row to its request without a lookup. Not
  // sent on the wire.
  RequestHandle handle;
};

struct SchedulerOutput {
  StepSeq step_seq = 0;     // 0 for an empty output that is not executed
  int64_t step_index = 0;   // every Schedule() call counts
  std::vector<NewRequestData> new_requests;
  CachedRequestData cached;
  std::vector<ScheduledRequest> scheduled;  // scheduling order
  int32_t total_num_scheduled_tokens = 0;
  // Since the previous executed step. Workers drop these first, then apply
  // new and resumed requests.
  std::vector<RequestId> finished_request_ids;
  std::vector<RequestId> preempted_request_ids;
  bool has_structured_output_requests = false;
  bool pending_structured_output_tokens = false;

  bool empty() const { return total_num_scheduled_tokens == 0; }
  // Empties every list but keeps their capacity, for reuse.
  void Clear();
};

// Packed allowed-token masks for the structured-output rows of one step.
struct GrammarOutput {
  std::vector<RequestId> request_ids;
  int32_t words_per_row = 0;
  std::vector<uint32_t> bitmask;

  absl::Span<const uint32_t> Row(size_t i) const {
    return absl::MakeConstSpan(bitmask).subspan(i * words_per_row, words_per_row);
  }
};

// The prompt tokens one step scored for row `row` (prompt_logprobs): the
// logits at position first_position + i score prompt token first_position + i + 1.
struct PromptLogprobsChunk {
  size_t row = 0;
  int32_t first_position = 0;
  std::vector<PromptTokenLogprob> tokens;
};

// What the model runner answers for one step. Rows follow the step's
// scheduling order one to one.
struct ModelRunnerOutput {
  StepSeq step_seq = 0;
  std::vector<RequestId> request_ids;
  // Row i's sampled ids are sampled_token_ids[sampled_offsets[i] .. [i+1]).
  std::vector<int32_t> sampled_offsets{0};
  std::vector<TokenId> sampled_token_ids;

  // Logprobs of the rows whose request asked (SamplingParams::logprobs >= 0).
  // All five lists stay empty when no row did, so such a step costs nothing.
  // Otherwise row i's logprob entries are k in [logprob_offsets[i],
  // logprob_offsets[i + 1]): none (the row did not ask, or sampled nothing)
  // or exactly one per sampled token of the row, in order. Entry k holds the
  // sampled token's logprob, sampled_logprobs[k], and its top-n alternatives,
  // top_token_ids / top_logprobs [top_offsets[k] .. top_offsets[k + 1]), most
  // likely first; n is the same for every entry of a row.
  std::vector<int32_t> logprob_offsets;  // rows + 1 entries, or empty
  std::vector<float> sampled_logprobs;
  std::vector<int32_t> top_offsets;      // entries + 1, or empty
  std::vector<TokenId> top_token_ids;
  std::vector<float> top_logprobs;
  // Rows whose request asked for prompt logprobs and that computed prompt
  // positions; empty otherwise.
  std::vector<PromptLogprobsChunk> prompt_logprobs;

  void AddRow(RequestId id, absl::Span<const TokenId> sampled) {
    request_ids.push_back(id);
    sampled_token_ids.insert(sampled_token_ids.end(), sampled.begin(), sampled.end());
    sampled_offsets.push_back(static_cast<int32_t>(sampled_token_ids.size()));
    if (!logprob_offsets.empty()) logprob_offsets.push_back(logprob_offsets.back());
  }
  // Gives the next sampled token of the last row added its logprob and top
  // alternatives. REQUIRES: that row has a sampled token without logprobs
  // yet; top_ids.size() == top.size().
  void AddLogprob(float logprob, absl::Span<const TokenId> top_ids, absl::Span<const float> top) {
    TANDEM_DCHECK(!request_ids.empty() && top_ids.size() == top.size());
    if (logprob_offsets.empty()) {  // the first entry: the rows before have none
      logprob_offsets.assign(request_ids.size() + 1, 0);
      top_offsets.push_back(0);
    }
    sampled_logprobs.push_back(logprob);
    ++logprob_offsets.back();
    TANDEM_DCHECK(NumLogprobs(request_ids.size() - 1) <= Sampled(request_ids.size() - 1).size());
    top_token_ids.insert(top_token_ids.end(), top_ids.begin(), top_ids.end());
    top_logprobs.insert(top_logprobs.end(), top.begin(), top.end());
    top_offsets.push_back(static_cast<int32_t>(top_token_ids.size()));
  }
  absl::Span<const TokenId> Sampled(size_t row) const {
    return absl::MakeConstSpan(sampled_token_ids)
        .subspan(sampled_offsets[row], sampled_offsets[row + 1] - sampled_offsets[row]);
  }
  bool has_logprobs() const { return !logprob_offsets.empty(); }
  // 0 or Sampled(row).size(); the row's entries start at logprob_offsets[row].
  size_t NumLogprobs(size_t row) const {
    return has_logprobs() ? static_cast<size_t>(logprob_offsets[row + 1] - logprob_offsets[row]) : 0;
  }
  absl::Span<const TokenId> TopIds(size_t entry) const {
    return absl::MakeConstSpan(top_token_ids).subspan(top_offsets[entry], top_offsets[entry + 1] - top_offsets[entry]);
  }
  absl::Span<const float> TopLogprobs(size_t entry) const {
    return absl::MakeConstSpan(top_logprobs).subspan(top_offsets[entry], top_offsets[entry + 1] - top_offsets[entry]);
  }
};

// The logprobs of one token delivered to a request (RequestOutput::logprobs).
struct TokenLogprob {
  float logprob = 0.0f;                        // of the sampled token, from the raw logits
  std::vector<std::pair<TokenId, float>> top;  // top-n (id, logprob), most likely first
};

// What the engine reports to the frontend for one request after a step.
struct RequestOutput {
  RequestId id = 0;
  absl::InlinedVector<TokenId, 2> new_token_ids;
  // Empty when the request did not ask for logprobs (SamplingParams::logprobs
  // < 0); otherwise one per new_token_ids entry, in the same order.
  std::vector<TokenLogprob> logprobs;
  // With the request's first tokens, when it asked for prompt logprobs: one
  // per prompt token after the first, in order.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<TokenId> stop_reason;
  absl::Status error;  // why, with FinishReason::kError (one word when OK)
  // Counters after this update, for tracing and metrics.
  int32_t num_output_tokens = 0;
  int32_t num_output_placeholders = 0;
  bool stale = false;  // sampled by a step that predates a preemption

  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_SCHEDULER_OUTPUT_H_
