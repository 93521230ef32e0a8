// Request: one generation request's state inside the scheduler, with the
// counters of scheduler/README.md §4:
//
//   P  num_prompt_tokens()        N  num_tokens() = P + committed outputs
//   C  num_computed_tokens        computed or scheduled (advanced at schedule time)
//   ph num_output_placeholders    sampled positions in flight whose ids are unknown
//   IF num_in_flight_tokens       tokens of steps scheduled but not yet processed
//   ST num_stale_output_tokens    in-flight share that predates a preemption
//
// A request needs scheduling exactly when N + ph > C. Token storage and block
// hashes are private (they must stay consistent); the counters are plain
// fields because the Scheduler is their only writer.
//
// Thread-compatible: owned by the Scheduler, touched on the engine thread only.
#ifndef TANDEM_SCHEDULER_CORE_REQUEST_H_
#define TANDEM_SCHEDULER_CORE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "scheduler/core/block_hash.h"
#include "scheduler/core/grammar.h"
#include "scheduler/core/sampling_params.h"

namespace tandem::scheduler {

// Ordered: every value after kPreempted is a finished state.
enum class RequestStatus {
  kWaiting,
  kRunning,
  kPreempted,
  kFinishedStopped,       // EOS or a stop token: finish reason "stop"
  kFinishedLengthCapped,  // max_tokens or max_model_len: "length"
  kFinishedAborted,       // client gone, stop string: "abort"
  kFinishedError,         // grammar rejection, worker failure: "error"
};

inline bool IsFinished(RequestStatus status) { return status > RequestStatus::kPreempted; }

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

// Where a request lives in the scheduler's RequestTable (see request_table.h).
struct RequestHandle {
  uint32_t slot = 0;
  uint32_t generation = 0;
};

FinishReason FinishReasonOf(RequestStatus status);
const char* FinishReasonName(FinishReason reason);
const char* RequestStatusName(RequestStatus status);

// What a client submits; validated by Scheduler::AddRequest.
struct RequestSpec {
  RequestId id = 0;
  std::vector<TokenId> prompt_token_ids;
  SamplingParams sampling;
  int32_t priority = 0;          // lower is more important (priority policy)
  std::string cache_salt;        // isolates this request's prefix-cache entries
  std::unique_ptr<Grammar> grammar;  // structured output; null for free text
};

// Cache-line aligned: the fields every step reads fill its first two lines.
class alignas(64) Request {
 public:
  // `hash_seed` starts the block-hash chain; `block_size` 0 disables hashing.
  Request(RequestSpec spec, uint64_t arrival_seq, int32_t block_size, uint64_t hash_seed);

  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  RequestId id() const { return id_; }
  int32_t priority() const { return priority_; }
  uint64_t arrival_seq() const { return arrival_seq_; }
  const SamplingParams& sampling() const { return sampling_; }
  Grammar* grammar() const { return grammar_.get(); }
  bool uses_structured_output() const { return grammar_ != nullptr; }
  const std::string& cache_salt() const { return cache_salt_; }

  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_tokens() const { return static_cast<int32_t>(all_token_ids_.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }
  int32_t max_tokens() const { return max_tokens_; }
  int32_t min_tokens() const { return min_tokens_; }
  // The EOS id that stops this request, or -1 (none, or ignore_eos).
  TokenId stopping_eos_token_id() const { return stopping_eos_; }
  bool has_stop_token_ids() const { return has_stop_token_ids_; }
  absl::Span<const TokenId> all_token_ids() const { return all_token_ids_; }
  absl::Span<const TokenId> prompt_token_ids() const {
    return absl::MakeConstSpan(all_token_ids_).subspan(0, num_prompt_tokens_);
  }
  absl::Span<const TokenId> output_token_ids() const {
    return absl::MakeConstSpan(all_token_ids_).subspan(num_prompt_tokens_);
  }

  // Commits one sampled token and hashes any block it completes. Inline:
  // once per running request and step.
  void AppendOutputToken(TokenId token) {
    all_token_ids_.push_back(token);
    // block_size_ is a power of two (EngineConfig::Validate).
    if (block_size_ > 0 && (all_token_ids_.size() & (block_size_ - 1)) == 0) HashNewFullBlocks();
  }

  // Hashes of every full block of all_token_ids() (empty if hashing is off).
  const std::vector<BlockHash>& block_hashes() const { return block_hashes_; }

  bool is_finished() const { return IsFinished(status); }

  // Layout: what every step reads comes first, so a step touches one or two
  // cache lines per request (scheduler_bench).
 private:
  const RequestId id_;
  const int32_t num_prompt_tokens_;
  const int32_t max_tokens_;
  const int32_t min_tokens_;
  const TokenId stopping_eos_;
  const bool has_stop_token_ids_;
  std::vector<TokenId> all_token_ids_;
  std::unique_ptr<Grammar> grammar_;

 public:
  // --- counters, written by the Scheduler only ---
  RequestStatus status = RequestStatus::kWaiting;
  int32_t num_computed_tokens = 0;       // C
  int32_t num_output_placeholders = 0;   // ph
  int32_t num_in_flight_tokens = 0;      // IF
  int32_t num_stale_output_tokens = 0;   // ST
  bool is_prefill_chunk = false;         // the last scheduled step did not sample
  RequestHandle handle;                  // stamped by the RequestTable
  StepSeq last_sched_seq = 0;            // fence: newest step that scheduled this request
  int64_t next_decode_eligible_step = 0;  // pipeline cadence (scheduler/README.md §7)

  // --- KV bookkeeping, written by the KvCacheManager only ---
  std::vector<BlockId> blocks;        // block i holds positions [i*B, (i+1)*B)
  int32_t num_cached_blocks = 0;      // leading blocks registered in the prefix cache

  // --- rarely touched ---
  int32_t num_preemptions = 0;
  std::optional<TokenId> stop_reason;    // the stop token that finished it, if any
  absl::Status error;                    // why it finished with kFinishedError
  // prompt_logprobs: the prompt's scores gathered chunk by chunk, handed to
  // the first output (then prompt_logprobs_sent; a recomputation after a
  // preemption scores the prompt again and is ignored).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;

 private:
  void HashNewFullBlocks();

  const int32_t block_size_;  // 0: no hashing
  const uint64_t hash_seed_;
  std::vector<BlockHash> block_hashes_;
  const int32_t priority_;
  const uint64_t arrival_seq_;
  const SamplingParams sampling_;
  const std::string cache_salt_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_REQUEST_H_
