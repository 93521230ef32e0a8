// EngineConfig: every knob of the scheduler and the engine loop, validated once
// at startup (scheduler/README.md §9, convention 6). Flag names in the CLI
// follow vLLM's (--max-num-seqs, --max-num-batched-tokens, ...); the fields
// here carry the same names in snake_case.
#ifndef TANDEM_SCHEDULER_CORE_ENGINE_CONFIG_H_
#define TANDEM_SCHEDULER_CORE_ENGINE_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::scheduler {

enum class SchedulingPolicy { kFcfs, kPriority };

struct EngineConfig {
  // --- KV cache ---
  int32_t block_size = 16;          // tokens per KV block; a power of two
  int32_t num_kv_blocks = 4096;    // pool size including the null block 0
  bool enable_prefix_caching = true;
  // Fraction of blocks kept free when admitting a request while others run.
  double watermark = 0.0;
  // Seed of every block-hash chain. Per deployment, so hashes cannot be
  // predicted from outside (prefix-cache collision attacks).
  uint64_t prefix_cache_hash_seed = 0x7a6e64656d31ULL;

  // --- scheduling ---
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  int32_t max_num_seqs = 128;             // running requests at most
  int32_t max_model_len = 2048;           // positions per request, prompt included
  int32_t long_prefill_token_threshold = 0;  // per-request cap per step; 0 = off
  bool enable_chunked_prefill = true;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Admit a waiting request only if its whole current sequence fits now.
  bool reserve_full_sequence = true;

  // --- engine loop ---
  bool async_scheduling = true;
  int32_t pipeline_parallel_size = 1;
  // Steps in flight at most. 0 = derived: async ? pp + 1 : pp
  // (scheduler/README.md §7).
  int32_t batch_queue_depth = 0;
  // Optional vocabulary size; prompts with ids outside [0, vocab_size) are
  // rejected when it is set (> 0).
  int32_t vocab_size = 0;

  // Returns InvalidArgument naming the first bad field.
  absl::Status Validate() const;

  // Queue depth after derivation.
  int32_t EffectiveQueueDepth() const;
  // Steps between two decode steps of one request: with async scheduling and
  // P pipeline stages a token needs P steps to come back to rank 0.
  int32_t DecodeCadence() const { return async_scheduling ? pipeline_parallel_size : 1; }
  // Blocks kept free by the watermark.
  int32_t WatermarkBlocks() const;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_ENGINE_CONFIG_H_
