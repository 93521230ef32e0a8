// File: worker/model_runner.h
//
// ModelRunner: the worker's side of the step protocol (ARCHITECTURE §6) for
// a single-stage model. It keeps a persistent batch: one slot per live
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
// Call order, per step k: Execute(k), Sample(k), CollectOutput(k), with
// Sample(k) before Execute(k+1) (a decode row of step k+1 needs step k's
// sample). Tokens reach the host history when their copy completes; rows that
// apply penalties wait for earlier copies first.
//
// Thread-compatible: the worker's compute thread.
#ifndef TANDEM_WORKER_MODEL_RUNNER_H_
#define TANDEM_WORKER_MODEL_RUNNER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "tandem/v1/step.pb.h"
#include "worker/backend.h"
#include "worker/model/llama_model.h"

namespace tandem::worker {

struct ModelRunnerOptions {
  int32_t block_size = 16;
  // Key of the random draws of requests without a seed.
  uint64_t unseeded_rng_key = 0x9e3779b97f4a7c15ULL;
};

class ModelRunner {
 public:
  // `model` must have its KV cache allocated; both must outlive the runner.
  ModelRunner(Backend* backend, LlamaModel* model, ModelRunnerOptions options);

  absl::Status Execute(const v1::SchedulerOutput& step);
  absl::Status Sample(const v1::SampleCommand& command);
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
    int32_t total_len = 0;        // prompt + every token sampled for it
    int32_t num_computed = 0;
    bool last_sampled_valid = false;
    std::vector<BlockId> blocks;
    SamplingOptions options;
    uint64_t rng_key = 0;
  };
  struct Row {
    RequestId id;
    int32_t slot;
    uint32_t generation;
    bool samples;
    int32_t logits_row;  // -1 when not sampling
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
    std::unique_ptr<Event> copied;
  };

  absl::Status ApplyDiff(const v1::SchedulerOutput& step);
  absl::StatusOr<int32_t> CreateSlot(RequestId id);
  void FreeSlot(RequestId id);
  absl::Status SetBlocks(Slot& slot, const int32_t* ids, int32_t count, bool replace);
  absl::Status EnsureCapacity(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes, bool keep);
  absl::Status Absorb(PendingStep& step);

  Backend* const backend_;
  LlamaModel* const model_;
  const ModelRunnerOptions options_;

  std::vector<Slot> slots_;
  std::vector<int32_t> free_slots_;
  absl::flat_hash_map<RequestId, int32_t> index_;
  std::deque<PendingStep> pending_;

  // Device buffers, grown as needed.
  std::unique_ptr<DeviceBuffer> last_sampled_;  // [slots]
  std::unique_ptr<DeviceBuffer> input_ids_, positions_, kv_slots_, query_start_, seq_lens_,
      block_table_start_, block_tables_, logits_rows_, sub_targets_, sub_slots_;
  std::unique_ptr<DeviceBuffer> logits_, sampled_, sampled_slots_, logprobs_, top_ids_;
};

// Sampling options of the worker from the wire.
SamplingOptions ToSamplingOptions(const v1::SamplingParams& params);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_RUNNER_H_
