// BlockPool: the KV cache blocks, their reference counts, the free queue and
// the prefix-cache hash map (vLLM's BlockPool, vllm/v1/core/block_pool.py).
// The pool only does accounting; the memory itself lives on the workers and is
// laid out by these block ids.
//
// Eviction order (tested against vLLM's tests/v1/core/test_prefix_caching.py
// test_prefill / test_evict):
//  * all blocks start free in id order; block 0 is the null block, never free;
//  * freed blocks reaching ref 0 go to the HEAD if they carry no hash (reused
//    first) and to the TAIL if they do (evicted last, LRU), each group in the
//    order given; callers free a request's blocks tail-first;
//  * allocation pops from the head and evicts the popped block's stale hash.
// Freed blocks keep their hash ("lazy eviction") so a later request can still
// hit them until they are reallocated.
//
// Thread-compatible: owned by the KvCacheManager on the engine thread.
#ifndef TANDEM_SCHEDULER_CORE_BLOCK_POOL_H_
#define TANDEM_SCHEDULER_CORE_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "scheduler/core/block_hash.h"
#include "scheduler/core/fault_injection.h"

namespace tandem::scheduler {

struct KvBlock {
  int32_t ref_cnt = 0;
  bool in_free_queue = false;
  bool has_hash = false;
  BlockHash hash;
};

class BlockPool {
 public:
  static constexpr BlockId kNullBlock = 0;

  BlockPool(int32_t num_blocks, bool enable_caching);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free_blocks() const { return num_free_; }
  // Fraction of usable blocks (all but the null block) that are not free.
  double Usage() const;

  // Pops `n` blocks from the head of the free queue and appends them to `out`,
  // each with ref 1. REQUIRES: n <= num_free_blocks().
  void AllocateBlocks(int32_t n, std::vector<BlockId>* out);
  // Takes one more reference on each block (prefix-cache hits).
  void Touch(absl::Span<const BlockId> blocks);
  // Drops one reference on each block, visiting them in reverse of `blocks`
  // (a request's block list is released tail-first).
  void FreeBlocksTailFirst(absl::Span<const BlockId> blocks);

  // Any block registered under `hash`, or nullopt.
  std::optional<BlockId> LookupCached(const BlockHash& hash) const;
  // Registers a full block under `hash`. No-op if the block already has one.
  void CacheBlock(BlockId block, const BlockHash& hash);
  // Forgets every hash. Fails (returns false) unless every block is free.
  bool ResetPrefixCache();

  // Test builds only (fault_injection.h); no effect elsewhere.
  void InjectFaultForTest(SchedulerFault fault) { fault_ = fault; }

  // --- introspection for tests and the invariant checker ---
  const KvBlock& block(BlockId id) const { return blocks_[id]; }
  std::vector<BlockId> FreeQueueOrder() const;
  // Number of (hash, block) registrations in the map.
  size_t num_cached_entries() const;
  // True iff `block` is registered under its own hash in the map.
  bool IsRegistered(BlockId block) const;

 private:
  // Free-queue links; indices num_blocks and num_blocks+1 are the head and
  // tail sentinels.
  void LinkAfter(int32_t pos, BlockId block);
  void Unlink(BlockId block);
  void EvictHash(BlockId block);

  std::vector<KvBlock> blocks_;
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  int32_t head_;
  int32_t tail_;
  int32_t num_free_ = 0;
  const bool enable_caching_;
  SchedulerFault fault_ = SchedulerFault::kNone;
  absl::flat_hash_map<BlockHash, absl::InlinedVector<BlockId, 1>> cached_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_BLOCK_POOL_H_
