#include "scheduler/core/block_pool.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::scheduler {

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : blocks_(num_blocks),
      prev_(num_blocks + 2, -1),
      next_(num_blocks + 2, -1),
      head_(num_blocks),
      tail_(num_blocks + 1),
      enable_caching_(enable_caching) {
  TANDEM_CHECK(num_blocks >= 2) << "a pool needs the null block and one more";
  next_[head_] = tail_;
  prev_[tail_] = head_;
  // Block 0 is the null block: never in the free queue, never cached.
  for (BlockId id = 1; id < num_blocks; ++id) LinkAfter(prev_[tail_], id);
}

double BlockPool::Usage() const {
  const int32_t usable = num_blocks() - 1;
  return 1.0 - static_cast<double>(num_free_) / usable;
}

void BlockPool::LinkAfter(int32_t pos, BlockId block) {
  const int32_t after = next_[pos];
  next_[pos] = block;
  prev_[block] = pos;
  next_[block] = after;
  prev_[after] = block;
  blocks_[block].in_free_queue = true;
  ++num_free_;
}

void BlockPool::Unlink(BlockId block) {
  TANDEM_DCHECK(blocks_[block].in_free_queue);
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  prev_[block] = next_[block] = -1;
  blocks_[block].in_free_queue = false;
  --num_free_;
}

void BlockPool::EvictHash(BlockId block) {
  KvBlock& b = blocks_[block];
  auto it = cached_.find(b.hash);
  TANDEM_DCHECK(it != cached_.end());
  auto& ids = it->second;
  ids.erase(std::find(ids.begin(), ids.end(), block));
  if (ids.empty()) cached_.erase(it);
  b.has_hash = false;
}

void BlockPool::AllocateBlocks(int32_t n, std::vector<BlockId>* out) {
  TANDEM_CHECK(n <= num_free_) << "allocating " << n << " blocks with " << num_free_ << " free";
  for (int32_t i = 0; i < n; ++i) {
    const BlockId block = next_[head_];
    Unlink(block);
    if (blocks_[block].has_hash) EvictHash(block);
    blocks_[block].ref_cnt = 1;
    out->push_back(block);
  }
}

void BlockPool::Touch(absl::Span<const BlockId> blocks) {
  for (BlockId block : blocks) {
    if (block == kNullBlock) continue;
    KvBlock& b = blocks_[block];
    if (b.ref_cnt == 0) Unlink(block);
    ++b.ref_cnt;
  }
}

void BlockPool::FreeBlocksTailFirst(absl::Span<const BlockId> blocks) {
  // Blocks without a hash go to the head in visiting order; `insert_after`
  // walks forward so the first visited ends up first.
  int32_t insert_after = head_;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const BlockId block = *it;
    if (block == kNullBlock) continue;
    KvBlock& b = blocks_[block];
    if (kFaultInjection && fault_ == SchedulerFault::kFreeSharedBlocks) {
      if (b.ref_cnt == 0) continue;  // a holder whose reference the fault dropped
      b.ref_cnt = 1;                 // drops the other holders' references too
    }
    TANDEM_CHECK(b.ref_cnt > 0) << "double free of block " << block;
    if (--b.ref_cnt > 0) continue;
    if (b.has_hash) {
      LinkAfter(prev_[tail_], block);
    } else {
      LinkAfter(insert_after, block);
      insert_after = block;
    }
  }
}

std::optional<BlockId> BlockPool::LookupCached(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second.front();
}

void BlockPool::CacheBlock(BlockId block, const BlockHash& hash) {
  if (!enable_caching_ || block == kNullBlock) return;
  KvBlock& b = blocks_[block];
  if (b.has_hash) return;
  b.has_hash = true;
  b.hash = hash;
  cached_[hash].push_back(block);
}

bool BlockPool::ResetPrefixCache() {
  if (num_free_ != num_blocks() - 1) return false;
  cached_.clear();
  for (KvBlock& b : blocks_) b.has_hash = false;
  return true;
}

std::vector<BlockId> BlockPool::FreeQueueOrder() const {
  std::vector<BlockId> order;
  order.reserve(num_free_);
  for (int32_t pos = next_[head_]; pos != tail_; pos = next_[pos]) order.push_back(pos);
  return order;
}

size_t BlockPool::num_cached_entries() const {
  size_t total = 0;
  for (const auto& [hash, ids] : cached_) total += ids.size();
  return total;
}

bool BlockPool::IsRegistered(BlockId block) const {
  const KvBlock& b = blocks_[block];
  if (!b.has_hash) return false;
  auto it = cached_.find(b.hash);
  return it != cached_.end() && std::find(it->second.begin(), it->second.end(), block) != it->second.end();
}

}  // namespace tandem::scheduler
