#include "scheduler/core/engine_config.h"

#include "absl/strings/str_cat.h"

namespace tandem::scheduler {
namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("invalid engine config: ", field, " ", why));
}

}  // namespace

int32_t EngineConfig::EffectiveQueueDepth() const {
  if (batch_queue_depth > 0) return batch_queue_depth;
  return async_scheduling ? pipeline_parallel_size + 1 : pipeline_parallel_size;
}

int32_t EngineConfig::WatermarkBlocks() const {
  return static_cast<int32_t>(watermark * (num_kv_blocks - 1));
}

absl::Status EngineConfig::Validate() const {
  if (block_size < 1 || (block_size & (block_size - 1)) != 0) {
    return Bad("block_size", absl::StrCat("must be a power of two, got ", block_size));
  }
  if (num_kv_blocks < 2) {
    return Bad("num_kv_blocks", absl::StrCat("must be >= 2 (block 0 is the null block), got ",
                                              num_kv_blocks));
  }
  if (max_num_batched_tokens < 1) {
    return Bad("max_num_batched_tokens", absl::StrCat("must be >= 1, got ", max_num_batched_tokens));
  }
  if (max_num_seqs < 1) return Bad("max_num_seqs", absl::StrCat("must be >= 1, got ", max_num_seqs));
  if (max_model_len < 2) {
    return Bad("max_model_len",
               absl::StrCat("must be >= 2 (one prompt token and one output), got ", max_model_len));
  }
  if (long_prefill_token_threshold < 0) {
    return Bad("long_prefill_token_threshold",
               absl::StrCat("must be >= 0, got ", long_prefill_token_threshold));
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    return Bad("max_num_batched_tokens",
               absl::StrCat("must be >= max_model_len (", max_model_len,
                            ") when chunked prefill is off, got ", max_num_batched_tokens));
  }
  if (watermark < 0.0 || watermark >= 1.0) {
    return Bad("watermark", absl::StrCat("must be in [0, 1), got ", watermark));
  }
  // One request of max_model_len tokens must fit, or it could never be
  // (re)admitted and would wait forever.
  const int64_t blocks_per_request = (int64_t{max_model_len} + block_size - 1) / block_size;
  if (blocks_per_request > num_kv_blocks - 1 - WatermarkBlocks()) {
    return Bad("num_kv_blocks",
               absl::StrCat("holds ", num_kv_blocks - 1, " usable blocks of ", block_size,
                            " tokens, but one request of max_model_len=", max_model_len, " needs ",
                            blocks_per_request, " (lower max_model_len or give the KV cache more memory)"));
  }
  if (pipeline_parallel_size < 1) {
    return Bad("pipeline_parallel_size", absl::StrCat("must be >= 1, got ", pipeline_parallel_size));
  }
  if (batch_queue_depth < 0) {
    return Bad("batch_queue_depth", absl::StrCat("must be >= 0 (0 = derived), got ", batch_queue_depth));
  }
  if (async_scheduling && EffectiveQueueDepth() < 2) {
    return Bad("batch_queue_depth", "must be >= 2 with async scheduling (one step in flight while the next is planned)");
  }
  if (vocab_size < 0) return Bad("vocab_size", absl::StrCat("must be >= 0, got ", vocab_size));
  return absl::OkStatus();
}

}  // namespace tandem::scheduler
