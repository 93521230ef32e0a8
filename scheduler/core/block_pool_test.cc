// BlockPool and prefix-cache eviction order (vLLM's BlockPool, block hashing
// and KVCacheManager.get_computed_blocks), including the vLLM acceptance
// cases test_prefill, test_evict and test_decode of
// tests/v1/core/test_prefix_caching.py with their exact block ids.
#include "scheduler/core/block_pool.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/core/kv_cache_manager.h"
#include "scheduler/core/request.h"

namespace tandem::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// 11 blocks of 16 (block 0 is the null block, 10 usable), prefix caching on:
// the pool of vLLM's test_prefix_caching.py. 160 = 10 blocks fit one request.
EngineConfig CachingConfig(int32_t num_blocks = 11) {
  EngineConfig config;
  config.block_size = 16;
  config.num_kv_blocks = num_blocks;
  config.max_model_len = 160;
  config.enable_prefix_caching = true;
  return config;
}

// Tokens that are `value` repeated `count` times, appended to `tokens`.
void Append(std::vector<TokenId>* tokens, TokenId value, int32_t count) {
  tokens->insert(tokens->end(), count, value);
}

// `count` tokens start, start + 1, ... (no two blocks alike).
std::vector<TokenId> Distinct(TokenId start, int32_t count) {
  std::vector<TokenId> tokens;
  for (int32_t i = 0; i < count; ++i) tokens.push_back(start + i);
  return tokens;
}

std::unique_ptr<Request> MakeReq(const EngineConfig& config, RequestId id, std::vector<TokenId> tokens,
                                 std::string salt = "") {
  RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids = std::move(tokens);
  spec.sampling.max_tokens = 64;
  spec.cache_salt = std::move(salt);
  return std::make_unique<Request>(std::move(spec), static_cast<uint64_t>(id), config.block_size,
                                   config.prefix_cache_hash_seed);
}

// Admits `r` with its whole prompt as the scheduler's waiting pass does:
// look up the prefix, allocate with the hit, then C = hit + scheduled.
// Returns the hit length in tokens, or -1 if allocation failed.
int32_t Admit(KvCacheManager& kv, Request& r) {
  std::vector<BlockId> hits;
  const int32_t hit = kv.FindCachedPrefix(r, &hits);
  const int32_t n = r.num_tokens() - hit;
  if (!kv.AllocateSlots(r, n, hits, /*full_sequence_must_fit=*/true, /*apply_watermark=*/false)) return -1;
  r.num_computed_tokens = hit + n;
  return hit;
}

TEST(BlockPoolTest, NullBlockIsNeverFreeAndQueueStartsInIdOrder) {
  BlockPool pool(8, /*enable_caching=*/true);
  EXPECT_EQ(pool.num_blocks(), 8);
  EXPECT_EQ(pool.num_free_blocks(), 7);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_FALSE(pool.block(BlockPool::kNullBlock).in_free_queue);
  EXPECT_DOUBLE_EQ(pool.Usage(), 0.0);

  std::vector<BlockId> got;
  pool.AllocateBlocks(2, &got);
  EXPECT_THAT(got, ElementsAre(1, 2));
  // Usage counts the 7 usable blocks only: 2 of 7 taken.
  EXPECT_DOUBLE_EQ(pool.Usage(), 2.0 / 7.0);
  pool.AllocateBlocks(5, &got);
  EXPECT_THAT(got, ElementsAre(1, 2, 3, 4, 5, 6, 7));  // the null block is never handed out
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(pool.Usage(), 1.0);

  // The null block is skipped by Touch and by frees: padding, not a real block.
  pool.Touch({BlockPool::kNullBlock});
  pool.FreeBlocksTailFirst({BlockPool::kNullBlock, 3});
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(3));
  EXPECT_FALSE(pool.block(BlockPool::kNullBlock).in_free_queue);
  EXPECT_EQ(pool.block(BlockPool::kNullBlock).ref_cnt, 0);
}

TEST(BlockPoolTest, FreedBlocksGoToHeadWithoutHashAndToTailWithHash) {
  BlockPool pool(8, /*enable_caching=*/true);
  std::vector<BlockId> got;
  pool.AllocateBlocks(4, &got);  // 1 2 3 4
  pool.CacheBlock(1, BlockHash{11, 0});
  pool.CacheBlock(2, BlockHash{12, 0});
  // Visited 4, 3, 2, 1: uncached 4 and 3 go to the head in visiting order,
  // cached 2 and 1 to the tail in visiting order.
  pool.FreeBlocksTailFirst(got);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(4, 3, 5, 6, 7, 2, 1));
  // Lazy eviction: the freed blocks still answer lookups until reallocated.
  EXPECT_EQ(pool.LookupCached(BlockHash{12, 0}), 2);
  got.clear();
  pool.AllocateBlocks(7, &got);
  EXPECT_THAT(got, ElementsAre(4, 3, 5, 6, 7, 2, 1));
  EXPECT_EQ(pool.LookupCached(BlockHash{12, 0}), std::nullopt);  // evicted on reuse
  EXPECT_EQ(pool.num_cached_entries(), 0u);
  EXPECT_FALSE(pool.block(2).has_hash);
}

// vLLM's test_prefix_caching.py::test_prefill.
TEST(BlockPoolTest, PrefillEvictionOrder) {
  const EngineConfig config = CachingConfig();
  ASSERT_TRUE(config.Validate().ok());
  KvCacheManager kv(config);
  const BlockPool& pool = kv.pool();

  std::vector<TokenId> common;
  for (TokenId v : {0, 1, 2}) Append(&common, v, 16);
  std::vector<TokenId> t0 = common;
  Append(&t0, 3, 7);
  auto req0 = MakeReq(config, 0, t0);
  ASSERT_EQ(req0->num_tokens(), 55);
  EXPECT_EQ(Admit(kv, *req0), 0);
  EXPECT_THAT(req0->blocks, ElementsAre(1, 2, 3, 4));
  // The three full prompt blocks are registered at schedule time, the partial
  // tail block is not.
  for (BlockId b : {1, 2, 3}) EXPECT_TRUE(pool.IsRegistered(b)) << "block " << b;
  EXPECT_FALSE(pool.block(4).has_hash);
  EXPECT_EQ(req0->num_cached_blocks, 3);

  std::vector<TokenId> t1 = common;
  Append(&t1, 4, 7);
  auto req1 = MakeReq(config, 1, t1);
  EXPECT_EQ(Admit(kv, *req1), 48);
  EXPECT_THAT(req1->blocks, ElementsAre(1, 2, 3, 5));
  for (BlockId b : {1, 2, 3}) EXPECT_EQ(pool.block(b).ref_cnt, 2) << "block " << b;
  EXPECT_EQ(pool.block(5).ref_cnt, 1);
  EXPECT_EQ(pool.num_free_blocks(), 5);

  kv.Free(*req0);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(4, 6, 7, 8, 9, 10));
  kv.Free(*req1);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(5, 4, 6, 7, 8, 9, 10, 3, 2, 1));
  EXPECT_TRUE(req0->blocks.empty());
  EXPECT_TRUE(req1->blocks.empty());

  // A request with no hit takes the blocks in exactly the free-queue order,
  // evicting the common prefix last.
  auto req2 = MakeReq(config, 2, Distinct(100, 160));
  req2->num_computed_tokens = 0;
  std::vector<BlockId> hits;
  ASSERT_EQ(kv.FindCachedPrefix(*req2, &hits), 0);
  ASSERT_TRUE(kv.AllocateSlots(*req2, 160, hits, /*full_sequence_must_fit=*/false, /*apply_watermark=*/false));
  EXPECT_THAT(req2->blocks, ElementsAre(5, 4, 6, 7, 8, 9, 10, 3, 2, 1));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  // The old prefix is gone from the cache.
  EXPECT_EQ(pool.LookupCached(req0->block_hashes()[0]), std::nullopt);
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 3, t0), &hits), 0);
}

// vLLM's test_prefix_caching.py::test_evict.
TEST(BlockPoolTest, EvictOrderAcrossRequests) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  const BlockPool& pool = kv.pool();

  const std::vector<TokenId> t0 = Distinct(0, 5 * 16 + 7);
  auto req0 = MakeReq(config, 0, t0);
  EXPECT_EQ(Admit(kv, *req0), 0);
  EXPECT_THAT(req0->blocks, ElementsAre(1, 2, 3, 4, 5, 6));
  auto req1 = MakeReq(config, 1, Distinct(1000, 3 * 16));
  EXPECT_EQ(Admit(kv, *req1), 0);
  EXPECT_THAT(req1->blocks, ElementsAre(7, 8, 9));
  EXPECT_EQ(pool.num_free_blocks(), 1);

  kv.Free(*req0);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(6, 10, 5, 4, 3, 2, 1));
  kv.Free(*req1);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(6, 10, 5, 4, 3, 2, 1, 9, 8, 7));

  // 35 tokens: req0's first 32 then 3 others. Hits 1 and 2, and the new block
  // comes from the head of the queue.
  std::vector<TokenId> t2(t0.begin(), t0.begin() + 32);
  Append(&t2, 999, 3);
  auto req2 = MakeReq(config, 2, t2);
  EXPECT_EQ(Admit(kv, *req2), 32);
  EXPECT_THAT(req2->blocks, ElementsAre(1, 2, 6));
  EXPECT_EQ(pool.num_free_blocks(), 7);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(10, 5, 4, 3, 9, 8, 7));
}

// vLLM's test_prefix_caching.py::test_decode, driven as a synchronous
// scheduler would: allocate one slot, compute it, commit the sampled token,
// cache up to C.
TEST(BlockPoolTest, DecodeAllocatesOnlyWhenCrossingABlockBoundary) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  const BlockPool& pool = kv.pool();
  std::vector<TokenId> tokens;
  for (TokenId v : {0, 1, 2}) Append(&tokens, v, 16);
  Append(&tokens, 3, 7);
  auto req = MakeReq(config, 0, tokens);
  ASSERT_EQ(Admit(kv, *req), 0);
  ASSERT_THAT(req->blocks, ElementsAre(1, 2, 3, 4));
  req->AppendOutputToken(7);  // the prefill samples position 55
  kv.CacheBlocks(*req, req->num_computed_tokens);
  const int32_t free_after_prefill = pool.num_free_blocks();

  // Positions 55..63 are computed inside block 4: nothing is allocated and
  // block 4 gets no hash until it is full.
  for (int32_t pos = 55; pos < 64; ++pos) {
    EXPECT_FALSE(pool.block(4).has_hash) << "position " << pos;
    ASSERT_TRUE(kv.AllocateSlots(*req, 1, {}, false, false)) << "position " << pos;
    req->num_computed_tokens += 1;
    EXPECT_EQ(pool.num_free_blocks(), free_after_prefill) << "position " << pos;
    EXPECT_EQ(req->blocks.size(), 4u);
    req->AppendOutputToken(7);
    kv.CacheBlocks(*req, req->num_computed_tokens);
  }
  // Block 4 is now full and committed: it carries the request's chain hash.
  ASSERT_EQ(req->num_tokens(), 65);
  EXPECT_TRUE(pool.IsRegistered(4));
  EXPECT_EQ(pool.block(4).hash, req->block_hashes()[3]);
  EXPECT_EQ(req->num_cached_blocks, 4);

  // Position 64 starts block 5: exactly one block.
  ASSERT_TRUE(kv.AllocateSlots(*req, 1, {}, false, false));
  req->num_computed_tokens += 1;
  EXPECT_EQ(pool.num_free_blocks(), free_after_prefill - 1);
  EXPECT_THAT(req->blocks, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_FALSE(pool.block(5).has_hash);
}

TEST(BlockPoolTest, FindCachedPrefixLeavesTheLastTokenToCompute) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  auto owner = MakeReq(config, 0, Distinct(0, 32));
  ASSERT_EQ(Admit(kv, *owner), 0);
  ASSERT_EQ(owner->num_cached_blocks, 2);  // both blocks are fully cached

  // Same 32 tokens: only 16 may hit, the last token needs its logits.
  auto same = MakeReq(config, 1, Distinct(0, 32));
  std::vector<BlockId> hits;
  EXPECT_EQ(kv.FindCachedPrefix(*same, &hits), 16);
  EXPECT_THAT(hits, ElementsAre(owner->blocks[0]));
  // One more token: both blocks may hit.
  auto longer = MakeReq(config, 2, Distinct(0, 33));
  EXPECT_EQ(kv.FindCachedPrefix(*longer, &hits), 32);
  EXPECT_THAT(hits, ElementsAreArray(owner->blocks));
  // Lookups take no references.
  EXPECT_EQ(kv.pool().block(owner->blocks[0]).ref_cnt, 1);
}

TEST(BlockPoolTest, FindCachedPrefixStopsAtTheFirstMiss) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  auto owner = MakeReq(config, 0, Distinct(0, 48));
  ASSERT_EQ(Admit(kv, *owner), 0);

  // Shares block 0 only, then differs.
  std::vector<TokenId> tokens = Distinct(0, 16);
  Append(&tokens, 500, 16);
  Append(&tokens, 501, 17);
  auto probe = MakeReq(config, 1, tokens);
  // Register probe's third block hash on a free block, so that a lookup that
  // skipped the miss instead of stopping would find a later "hit".
  const BlockId planted = kv.pool().FreeQueueOrder().front();
  kv.mutable_pool().CacheBlock(planted, probe->block_hashes()[2]);
  ASSERT_EQ(kv.pool().LookupCached(probe->block_hashes()[2]), planted);

  std::vector<BlockId> hits;
  EXPECT_EQ(kv.FindCachedPrefix(*probe, &hits), 16);
  EXPECT_THAT(hits, ElementsAre(owner->blocks[0]));
}

TEST(BlockPoolTest, CacheSaltIsolatesPrefixes) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  auto owner = MakeReq(config, 0, Distinct(0, 48), "tenant-a");
  ASSERT_EQ(Admit(kv, *owner), 0);
  std::vector<BlockId> hits;
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 1, Distinct(0, 48), "tenant-a"), &hits), 32);
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 2, Distinct(0, 48), "tenant-b"), &hits), 0);
  EXPECT_THAT(hits, IsEmpty());
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 3, Distinct(0, 48)), &hits), 0);
}

TEST(BlockPoolTest, ResetPrefixCacheOnlyWhenEveryBlockIsFree) {
  const EngineConfig config = CachingConfig();
  KvCacheManager kv(config);
  auto req = MakeReq(config, 0, Distinct(0, 40));
  ASSERT_EQ(Admit(kv, *req), 0);
  ASSERT_EQ(kv.pool().num_cached_entries(), 2u);

  EXPECT_FALSE(kv.mutable_pool().ResetPrefixCache());  // blocks are held
  EXPECT_EQ(kv.pool().num_cached_entries(), 2u);
  EXPECT_TRUE(kv.pool().block(req->blocks[0]).has_hash);

  kv.Free(*req);
  // Lazy eviction keeps the hashes of free blocks until the reset.
  std::vector<BlockId> hits;
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 1, Distinct(0, 40)), &hits), 32);
  EXPECT_TRUE(kv.mutable_pool().ResetPrefixCache());
  EXPECT_EQ(kv.pool().num_cached_entries(), 0u);
  for (BlockId b = 0; b < kv.pool().num_blocks(); ++b) EXPECT_FALSE(kv.pool().block(b).has_hash) << b;
  EXPECT_EQ(kv.FindCachedPrefix(*MakeReq(config, 2, Distinct(0, 40)), &hits), 0);
  EXPECT_EQ(kv.pool().num_free_blocks(), 10);
}

TEST(BlockPoolDeathTest, DoubleFreeCrashes) {
  BlockPool pool(4, /*enable_caching=*/true);
  std::vector<BlockId> got;
  pool.AllocateBlocks(1, &got);
  pool.FreeBlocksTailFirst(got);
  EXPECT_DEATH(pool.FreeBlocksTailFirst(got), "double free of block 1");
}

TEST(BlockPoolDeathTest, AllocatingMoreThanFreeCrashes) {
  BlockPool pool(4, /*enable_caching=*/false);
  std::vector<BlockId> got;
  EXPECT_DEATH(pool.AllocateBlocks(4, &got), "allocating 4 blocks with 3 free");
}

}  // namespace
}  // namespace tandem::scheduler
