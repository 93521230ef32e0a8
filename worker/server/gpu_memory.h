// Sizing a GPU worker's KV cache with --gpu-memory-utilization, as vLLM
// does: the worker may use `utilization` of the device's total memory for
// its weights, its activations and its KV cache; the KV cache gets what is
// left after the weights and the activation peak of the largest step,
// measured by running one (ProfileLargestStep). What other processes hold is
// not charged to this worker, but the cache never takes more than is free.
//
// Thread-compatible: the thread that drives the backend.
#ifndef TANDEM_WORKER_SERVER_GPU_MEMORY_H_
#define TANDEM_WORKER_SERVER_GPU_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backends/backend.h"
#include "worker/model/llama_model.h"

namespace tandem::worker {

struct GpuMemoryPlan {
  double utilization = 0.9;
  size_t total_bytes = 0;
  size_t free_at_start = 0;       // the backend made, nothing loaded
  size_t free_after_weights = 0;
  size_t free_after_profile = 0;  // after the largest step ran (the model keeps its scratch)
  size_t step_io_bytes = 0;       // the step's inputs and outputs, which the runner holds too
  // Left free for what the profile does not allocate: the sampler's and
  // cuBLAS's workspaces, the runner's buffers growing by doubling.
  size_t reserve_bytes = size_t{512} << 20;

  size_t weight_bytes() const;
  size_t activation_bytes() const;
  // "weights 0.27 GiB, activations 0.31 GiB, ... of 139.81 GiB"
  std::string Describe() const;
};

// The KV cache's bytes under `plan`; FailedPrecondition naming the figures
// when nothing is left for it.
absl::StatusOr<int64_t> KvCacheBytesFor(const GpuMemoryPlan& plan);

// Runs `model` once on a step of `tokens` tokens in `rows` sequences (each
// sampling one row of logits), on a two-block KV cache that the step's block
// tables reuse, so that every activation buffer reaches the size of the
// largest step the scheduler sends by default; waits for the device. Returns
// the bytes of the step's inputs and outputs (freed on return; the runner
// holds as much). The model's KV cache must be allocated again afterwards
// (Configure does).
absl::StatusOr<size_t> ProfileLargestStep(Backend& backend, LlamaModel& model, int32_t tokens, int32_t rows,
                                int32_t block_size);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GPU_MEMORY_H_
