// ModelRunner: the worker's side of the step protocol (scheduler/README.md
// §6) for one pipeline stage. It keeps a persistent batch: one slot per live
// request (token history, block table, sampling state, a generation counter
// so that a late result never lands in a reused slot) and applies each
// SchedulerOutput as a diff.
//
// Placeholder substitution: after sampling, each row's token stays in the
// device buffer last_sampled[slot]. When a later step computes that token's
// position, the runner copies last_sampled[slot] into the input ids on the
// device; the scheduler never sends it, and the host may not know it yet.
// Which rows sample is decided by common/sampling_rule.h, the scheduler's
// own rule.
//
// Call order, per step k: Execute(k), Sample(k), then TakeOutput(k) (or
// CollectOutput(k), which also waits for it), with Sample(k) before
// Execute(k+1) (a decode row of step k+1 needs step k's sample).
//
// The host's copy of the sampled ids: Sample(k) enqueues the device-to-host
// copies; TakeOutput(k) hands them out as a StepOutput, which another thread
// (the worker's output thread) waits on and serializes while this thread
// runs step k+1. The runner's own state never leaves this thread: it reads
// the same immutable StepOutput when the copy is done, and absorbs the tokens
// into its slots' histories at its next call (Execute, TakeOutput), in
// step order, without waiting; rows that apply penalties wait for earlier
// copies first.
//
// Pipeline parallelism (scheduler/README.md §7): every stage applies every
// step's diff and computes the same positions and block tables. Stage r > 0
// receives the step's hidden states from r - 1; stage r < last sends its own
// to r + 1. Only the last stage samples (Sample, CollectOutput); it sends each
// step's sampled ids straight to stage 0, which writes them into last_sampled
// and waits for them only when a decode row needs one.
//
// ModelRunner is thread-compatible: the worker's compute thread.
#ifndef TANDEM_WORKER_RUNNER_MODEL_RUNNER_H_
#define TANDEM_WORKER_RUNNER_MODEL_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/step.pb.h"
#include "worker/backends/backend.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama_model.h"
#include "worker/runner/prompt_logprobs.h"

namespace tandem::worker {

struct ModelRunnerOptions {
  int32_t block_size = 16;
  // Key of the random draws of requests without a seed.
  uint64_t unseeded_rng_key = 0x9e3779b97f4a7c15ULL;
  // Pipeline stages only: the group's communicator (not owned) and how long
  // to wait for a peer's data before failing the step. `communicator`
  // carries hidden states (rank r to r + 1); `token_communicator`, when set,
  // carries the sampled ids (last rank to rank 0), otherwise `communicator`
  // does. NCCL needs the two apart (worker/server/backend_factory.h).
  Communicator* communicator = nullptr;
  Communicator* token_communicator = nullptr;
  absl::Duration peer_timeout = absl::Seconds(30);
};

// One sampled step's result on its way to the host (ModelRunner::TakeOutput):
// the rows, and host buffers that the device's copies fill until its event
// completes; nothing writes them after that. So one thread may wait on it and
// serialize it while the compute thread reads the same tokens into its slots.
//
// Thread-safe. The destructor waits for the copies, whose destination it
// owns.
class StepOutput {
 public:
  StepOutput() = default;
  ~StepOutput();
  StepOutput(const StepOutput&) = delete;
  StepOutput& operator=(const StepOutput&) = delete;

  uint64_t step_seq() const { return seq_; }
  // Blocks until the copies are done; their error if one failed.
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the copies are done; never blocks (false while another thread
  // is in Wait).
  bool Done() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits, then the scheduler's message for the step.
  absl::StatusOr<v1::ModelRunnerOutput> Serialize() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class ModelRunner;
  struct RowInfo {
    RequestId id;
    int32_t logits_row;  // -1: the row does not sample
  };

  // Set by the runner before it hands the object out; read-only afterwards
  // (the buffers are written by the copies until their events complete).
  uint64_t seq_ = 0;
  std::vector<RowInfo> rows_;
  std::vector<TokenId> tokens_;        // per logits row
  std::vector<float> logprobs_;        // per logits row: 1 + max_top
  std::vector<TokenId> top_ids_;       // per logits row: max_top
  int32_t max_top_ = -1;               // -1: no row asked for logprobs
  std::vector<int32_t> row_logprobs_;  // per logits row: requested top-n, -1 none
  // Prompt logprobs: what to score, from the host copy of the logits rows.
  std::vector<PromptScores> prompt_scores_;
  std::vector<float> prompt_logits_;
  int32_t vocab_ = 0;

  // One thread at a time queries or waits on the events (a backend's Event
  // need not be thread-safe).
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Event>> copies_ ABSL_GUARDED_BY(mu_);  // empty: nothing to copy
  std::atomic<bool> done_{false};
};

class ModelRunner {
 public:
  // `model` must have its KV cache allocated; both must outlive the runner.
  ModelRunner(Backend* backend, LlamaModel* model, ModelRunnerOptions options);
  // Waits for the copies of steps not handed out (their buffers are ours).
  ~ModelRunner();

  absl::Status Execute(const v1::SchedulerOutput& step);
  absl::Status Sample(const v1::SampleCommand& command);
  // The output of sampled step `step_seq` (the oldest not yet taken), without
  // waiting for its copies.
  absl::StatusOr<std::shared_ptr<StepOutput>> TakeOutput(uint64_t step_seq);
  // TakeOutput, then waits for it and serializes it (callers that have no
  // output thread: the in-process executors, tests).
  absl::StatusOr<v1::ModelRunnerOutput> CollectOutput(uint64_t step_seq);

  size_t num_live_requests() const { return index_.size(); }
  // The tokens the host knows for a live request (tests).
  std::vector<TokenId> HostTokens(RequestId id) const;

 private:
  struct Slot {
    RequestId id = -1;
    uint32_t generation = 0;
    std::vector<TokenId> tokens;  // host: prompt + outputs whose copies completed
    int32_t num_prompt_tokens = 0;
    int32_t total_len = 0;        // prompt + every token sampled or being sampled for it
    int32_t num_computed = 0;
    bool last_sampled_valid = false;
    uint64_t last_sample_step = 0;  // the step whose sample is last_sampled
    std::vector<BlockId> blocks;
    SamplingOptions options;
    uint64_t rng_key = 0;
    std::vector<std::pair<TokenId, float>> logit_bias;  // ascending ids, unique
    std::vector<std::vector<TokenId>> bad_words;        // token sequences, each non-empty
    int32_t prompt_logprobs = -1;                       // top-k per prompt token; -1 none
  };
  struct Row {
    RequestId id;
    int32_t slot;
    uint32_t generation;
    bool samples;
    int32_t logits_row;  // -1 when not sampling
    int32_t position;    // index of the token it samples
  };
  // A step whose sampled ids stage 0 expects from the last stage.
  struct IncomingTokens {
    uint64_t seq;
    std::vector<std::pair<int32_t, uint32_t>> slots;  // (slot, generation) per sampling row
  };
  struct PendingStep {
    uint64_t seq = 0;
    std::vector<Row> rows;
    bool sampled = false;
    bool absorbed = false;
    std::vector<TokenId> tokens;       // per logits row, once copied
    std::vector<float> logprobs;       // per logits row: 1 + max_top
    std::vector<TokenId> top_ids;      // per logits row: max_top
    int32_t max_top = -1;              // -1: no row asked for logprobs
    std::vector<int32_t> row_logprobs; // per logits row: requested top-n, -1 none
    // Prompt logprobs: the rows to score and the host copy of their logits
    // (after the sampling rows in the step's logits), one of `copies`.
    std::vector<PromptScores> prompt_scores;
    std::vector<float> prompt_logits;
    // Every device-to-host copy of the step, each waited on: a backend may
    // land a copy in the host buffer only when its own event is waited on or
    // found done (CudaBackend copies through pinned bounce buffers).
    std::vector<std::unique_ptr<Event>> copies;
    // Once TakeOutput handed the step out: its buffers and events moved here
    // (the vectors above are then empty); the step stays in pending_ until
    // its tokens are absorbed.
    std::shared_ptr<StepOutput> taken;
  };

  absl::Status ApplyDiff(const v1::SchedulerOutput& step);
  absl::StatusOr<int32_t> CreateSlot(RequestId id);
  void FreeSlot(RequestId id);
  absl::Status SetBlocks(Slot& slot, const int32_t* ids, int32_t count, bool replace);
  absl::Status EnsureCapacity(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes, bool keep);
  // Appends a sampled step's tokens to its slots' histories, waiting for the
  // copies; TryAbsorb does so only when they are done.
  absl::Status Absorb(PendingStep& step);
  absl::StatusOr<bool> TryAbsorb(PendingStep& step);
  // Absorbs finished copies in step order and forgets steps taken and
  // absorbed; stops at the first copy still in flight.
  absl::Status AbsorbFinished();
  Communicator* token_communicator() const {
    return options_.token_communicator != nullptr ? options_.token_communicator : options_.communicator;
  }
  bool first_stage() const { return model_->is_first_stage(); }
  bool last_stage() const { return model_->is_last_stage(); }
  // Stage 0 of a pipeline: receives the last stage's sampled ids in step
  // order up to step `seq` and stores them in last_sampled.
  absl::Status ReceiveTokensThrough(uint64_t seq);
  absl::Status SendTokensToFirstStage(uint64_t seq, int32_t num_rows);

  Backend* const backend_;
  LlamaModel* const model_;
  const ModelRunnerOptions options_;

  std::vector<Slot> slots_;
  std::vector<int32_t> free_slots_;
  absl::flat_hash_map<RequestId, int32_t> index_;
  std::deque<PendingStep> pending_;          // last stage
  std::deque<IncomingTokens> incoming_;      // stage 0 of a pipeline

  // Device buffers, grown as needed.
  std::unique_ptr<DeviceBuffer> last_sampled_;  // [slots]
  std::unique_ptr<DeviceBuffer> input_ids_, positions_, kv_slots_, query_start_, seq_lens_,
      block_table_start_, block_tables_, logits_rows_, sub_targets_, sub_slots_;
  std::unique_ptr<DeviceBuffer> logits_, sampled_, sampled_slots_, logprobs_, top_ids_;
  // Sample's inputs on the device (SampleParams): rows, penalty histories
  // and their counts scratch, grammar mask rows, logit biases.
  std::unique_ptr<DeviceBuffer> sample_rows_, sample_history_, penalty_counts_, sample_masks_, sample_bias_ids_,
      sample_bias_values_;
  std::unique_ptr<DeviceBuffer> hidden_in_, hidden_out_, token_message_, token_slots_, token_rows_;
};

// Sampling options of the worker from the wire.
SamplingOptions ToSamplingOptions(const v1::SamplingParams& params);

// The biases of one sampling step of a request: its logit_bias merged with
// -inf for every token its bad_words ban after `output` (the tokens it
// generated so far): the last token of each word whose other tokens end
// `output` (a one-token word always). Ascending ids, unique.
std::vector<std::pair<TokenId, float>> StepBiases(const std::vector<std::pair<TokenId, float>>& logit_bias,
                                                  const std::vector<std::vector<TokenId>>& bad_words,
                                                  const TokenId* output, int32_t output_len);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_RUNNER_MODEL_RUNNER_H_
