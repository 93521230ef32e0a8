// KvCacheManager: a request's view of the block pool (vLLM's KVCacheManager:
// get_computed_blocks, allocate_slots, free). It finds prefix-cache hits,
// allocates the blocks a step needs, registers committed full blocks in the
// prefix cache, and frees a request's blocks tail-first. Block tables live in
// Request::blocks; this class is their only writer.
//
// Thread-compatible: owned by the Scheduler on the engine thread.
#ifndef TANDEM_SCHEDULER_CORE_KV_CACHE_MANAGER_H_
#define TANDEM_SCHEDULER_CORE_KV_CACHE_MANAGER_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "scheduler/core/block_pool.h"
#include "scheduler/core/engine_config.h"
#include "scheduler/core/request.h"

namespace tandem::scheduler {

struct PrefixCacheStats {
  int64_t queries = 0;  // tokens looked up
  int64_t hits = 0;     // tokens found
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const EngineConfig& config);

  // Longest run of leading full blocks of `request` found in the prefix cache,
  // capped at N - 1 tokens (the last token is recomputed for its logits).
  // Fills `hit_blocks` (without taking references) and returns the hit length
  // in tokens. REQUIRES: the request owns no blocks.
  int32_t FindCachedPrefix(const Request& request, std::vector<BlockId>* hit_blocks) const;
  // Counts one admitted request's lookup in the prefix-cache statistics.
  void RecordPrefixLookup(int32_t queried_tokens, int32_t hit_tokens) {
    stats_.queries += queried_tokens;
    stats_.hits += hit_tokens;
  }

  // Makes room for `num_new_tokens` tokens after C and the prefix hit
  // `hit_blocks`. With `full_sequence_must_fit`, also requires room for the
  // request's whole current sequence (admission). With `apply_watermark`,
  // keeps the watermark free. Returns false, changing nothing, if the pool
  // cannot do it. On success registers committed full blocks that the step
  // will have computed (up to min(C + hit + new, N)) in the prefix cache, so
  // only for a plan that nothing can undo: an admission.
  bool AllocateSlots(Request& request, int32_t num_new_tokens,
                     absl::Span<const BlockId> hit_blocks, bool full_sequence_must_fit,
                     bool apply_watermark) {
    const int32_t computed = request.num_computed_tokens + static_cast<int32_t>(hit_blocks.size()) * block_size_;
    if (!AllocateSlotsSlow(request, num_new_tokens, hit_blocks, full_sequence_must_fit, apply_watermark)) {
      return false;
    }
    CacheBlocks(request, std::min(computed + num_new_tokens, request.num_tokens()));
    return true;
  }

  // The running pass's allocation: room for `num_new_tokens` after C, with
  // no prefix hit, watermark or whole-sequence check. Returns false, changing
  // nothing, if the pool cannot do it. Registers nothing: the priority policy
  // may still undo this plan in the same step (a later request takes it as
  // its victim), and a hash must never name KV that no step computes. The
  // caller registers with CacheBlocks once the step's plan is final.
  bool ReserveSlots(Request& request, int32_t num_new_tokens) {
    // Inline fast path, most decode steps: the tokens fit in owned blocks.
    if (FitsOwnedBlocks(request, num_new_tokens)) return true;
    return AllocateSlotsSlow(request, num_new_tokens, {}, /*full_sequence_must_fit=*/false,
                             /*apply_watermark=*/false);
  }

  // Whether `num_new_tokens` after C fit in the blocks the request owns.
  bool FitsOwnedBlocks(const Request& request, int32_t num_new_tokens) const {
    const int32_t end = std::min(request.num_computed_tokens + num_new_tokens, max_model_len_);
    return BlocksFor(end) <= static_cast<int32_t>(request.blocks.size());
  }

  // Registers the request's full blocks up to `num_tokens` (<= N) tokens.
  void CacheBlocks(Request& request, int32_t num_tokens) {
    if (enable_caching_ && (num_tokens >> block_shift_) > request.num_cached_blocks) {
      CacheNewFullBlocks(request, num_tokens);
    }
  }

  // Returns the request's blocks to the pool now, tail first.
  void Free(Request& request);
  // Detaches the request's blocks (allocation order) for a deferred free;
  // the pool keeps their references until FreeDetached.
  std::vector<BlockId> TakeBlocks(Request& request);
  void FreeDetached(absl::Span<const BlockId> blocks) { pool_.FreeBlocksTailFirst(blocks); }

  int32_t BlocksFor(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + block_size_ - 1) >> block_shift_);
  }
  int32_t block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  BlockPool& mutable_pool() { return pool_; }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }

 private:
  bool AllocateSlotsSlow(Request& request, int32_t num_new_tokens, absl::Span<const BlockId> hit_blocks,
                         bool full_sequence_must_fit, bool apply_watermark);
  void CacheNewFullBlocks(Request& request, int32_t num_tokens);

  const int32_t block_size_;
  const int32_t block_shift_;  // log2(block_size_)
  const int32_t max_model_len_;
  const bool enable_caching_;
  const int32_t watermark_blocks_;
  BlockPool pool_;
  PrefixCacheStats stats_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_KV_CACHE_MANAGER_H_
