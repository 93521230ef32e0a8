#include "scheduler/core/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::scheduler {

KvCacheManager::KvCacheManager(const EngineConfig& config)
    : block_size_(config.block_size),
      block_shift_(__builtin_ctz(static_cast<unsigned>(config.block_size))),
      max_model_len_(config.max_model_len),
      enable_caching_(config.enable_prefix_caching),
      watermark_blocks_(config.WatermarkBlocks()),
      pool_(config.num_kv_blocks, config.enable_prefix_caching) {}

int32_t KvCacheManager::FindCachedPrefix(const Request& request,
                                         std::vector<BlockId>* hit_blocks) const {
  TANDEM_DCHECK(request.blocks.empty());
  hit_blocks->clear();
  if (!enable_caching_) return 0;
  const auto& hashes = request.block_hashes();
  const size_t max_blocks =
      std::min<size_t>(hashes.size(), static_cast<size_t>((request.num_tokens() - 1) / block_size_));
  for (size_t i = 0; i < max_blocks; ++i) {
    std::optional<BlockId> hit = pool_.LookupCached(hashes[i]);
    if (!hit) break;  // chained hashes: every later block misses too
    hit_blocks->push_back(*hit);
  }
  return static_cast<int32_t>(hit_blocks->size()) * block_size_;
}

bool KvCacheManager::AllocateSlotsSlow(Request& request, int32_t num_new_tokens,
                                       absl::Span<const BlockId> hit_blocks, bool full_sequence_must_fit,
                                       bool apply_watermark) {
  TANDEM_DCHECK(num_new_tokens > 0);
  TANDEM_DCHECK(hit_blocks.empty() || request.blocks.empty());
  const int32_t owned = static_cast<int32_t>(request.blocks.size());
  const int32_t num_hits = static_cast<int32_t>(hit_blocks.size());
  const int32_t total_computed =
      std::min(request.num_computed_tokens + num_hits * block_size_, max_model_len_);
  // Touching a free hit takes it out of the free queue: it costs capacity too.
  int32_t evictable_hits = 0;
  for (BlockId block : hit_blocks) evictable_hits += pool_.block(block).ref_cnt == 0 ? 1 : 0;
  const int32_t reserve = apply_watermark ? watermark_blocks_ : 0;
  const int32_t free = pool_.num_free_blocks();

  if (full_sequence_must_fit) {
    const int32_t whole = BlocksFor(std::min(request.num_tokens(), max_model_len_));
    const int32_t need = std::max(0, whole - owned - num_hits) + evictable_hits;
    if (need + reserve > free) return false;
  }
  const int32_t slots = std::min(total_computed + num_new_tokens, max_model_len_);
  const int32_t need = std::max(0, BlocksFor(slots) - owned - num_hits) + evictable_hits;
  if (need + reserve > free) return false;

  if (num_hits > 0) {
    pool_.Touch(hit_blocks);
    request.blocks.insert(request.blocks.end(), hit_blocks.begin(), hit_blocks.end());
    request.num_cached_blocks = num_hits;
  }
  const int32_t fresh = BlocksFor(slots) - static_cast<int32_t>(request.blocks.size());
  if (fresh > 0) pool_.AllocateBlocks(fresh, &request.blocks);
  return true;
}

void KvCacheManager::CacheNewFullBlocks(Request& request, int32_t num_tokens) {
  TANDEM_DCHECK(num_tokens <= request.num_tokens());
  const auto& hashes = request.block_hashes();
  // A request without hashes (prompt logprobs) caches nothing.
  const int32_t full = std::min<int32_t>({num_tokens >> block_shift_, static_cast<int32_t>(request.blocks.size()),
                                          static_cast<int32_t>(hashes.size())});
  for (int32_t i = request.num_cached_blocks; i < full; ++i) {
    pool_.CacheBlock(request.blocks[i], hashes[i]);
  }
  request.num_cached_blocks = std::max(request.num_cached_blocks, full);
}

void KvCacheManager::Free(Request& request) {
  pool_.FreeBlocksTailFirst(request.blocks);
  request.blocks.clear();
  request.num_cached_blocks = 0;
}

std::vector<BlockId> KvCacheManager::TakeBlocks(Request& request) {
  std::vector<BlockId> blocks;
  blocks.swap(request.blocks);
  request.num_cached_blocks = 0;
  return blocks;
}

}  // namespace tandem::scheduler
