// KvCacheManager::AllocateSlots (vLLM's KVCacheManager.allocate_slots): what
// a failed allocation leaves behind, the admission check for the whole
// sequence, the watermark, and the capacity that touching an evictable prefix
// hit consumes.
#include "scheduler/core/kv_cache_manager.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/core/request.h"

namespace tandem::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// 10 usable blocks of 16 tokens.
EngineConfig SmallPool(bool caching = true) {
  EngineConfig config;
  config.block_size = 16;
  config.num_kv_blocks = 11;
  config.max_model_len = 160;
  config.enable_prefix_caching = caching;
  return config;
}

std::vector<TokenId> Distinct(TokenId start, int32_t count) {
  std::vector<TokenId> tokens;
  for (int32_t i = 0; i < count; ++i) tokens.push_back(start + i);
  return tokens;
}

std::unique_ptr<Request> MakeReq(const EngineConfig& config, RequestId id, std::vector<TokenId> tokens) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids = std::move(tokens);
  spec.sampling.max_tokens = 64;
  return std::make_unique<Request>(std::move(spec), static_cast<uint64_t>(id),
                                   config.enable_prefix_caching ? config.block_size : 0,
                                   config.prefix_cache_hash_seed);
}

// Allocates `n` tokens for a running request and advances C as Schedule does.
bool Step(KvCacheManager& kv, Request& r, int32_t n) {
  if (!kv.AllocateSlots(r, n, {}, /*full_sequence_must_fit=*/false, /*apply_watermark=*/false)) return false;
  r.num_computed_tokens += n;
  return true;
}

// Everything an allocation could touch, to compare before and after.
struct Snapshot {
  std::vector<BlockId> blocks;
  int32_t num_cached_blocks;
  int32_t num_computed_tokens;
  int32_t num_free;
  std::vector<BlockId> free_order;
  std::vector<int32_t> ref_cnts;
  size_t cached_entries;

  static Snapshot Of(const KvCacheManager& kv, const Request& r) {
    Snapshot s{r.blocks, r.num_cached_blocks, r.num_computed_tokens, kv.pool().num_free_blocks(),
               kv.pool().FreeQueueOrder(), {}, kv.pool().num_cached_entries()};
    for (BlockId b = 0; b < kv.pool().num_blocks(); ++b) s.ref_cnts.push_back(kv.pool().block(b).ref_cnt);
    return s;
  }
  void ExpectSame(const Snapshot& o) const {
    EXPECT_EQ(blocks, o.blocks);
    EXPECT_EQ(num_cached_blocks, o.num_cached_blocks);
    EXPECT_EQ(num_computed_tokens, o.num_computed_tokens);
    EXPECT_EQ(num_free, o.num_free);
    EXPECT_EQ(free_order, o.free_order);
    EXPECT_EQ(ref_cnts, o.ref_cnts);
    EXPECT_EQ(cached_entries, o.cached_entries);
  }
};

TEST(KvCacheManagerTest, FailedAllocationForANewRequestHasNoSideEffects) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  // A cached, now free 48-token prefix; the probe hits 2 of its blocks.
  auto owner = MakeReq(config, 0, Distinct(0, 48));
  ASSERT_TRUE(kv.AllocateSlots(*owner, 48, {}, true, false));
  kv.Free(*owner);
  auto filler = MakeReq(config, 1, Distinct(5000, 16));
  ASSERT_TRUE(Step(kv, *filler, 16));  // 9 blocks left free
  std::vector<TokenId> tokens = Distinct(0, 32);
  for (TokenId t : Distinct(900, 118)) tokens.push_back(t);  // 150 tokens: 10 blocks
  auto probe = MakeReq(config, 2, tokens);
  std::vector<BlockId> hits;
  ASSERT_EQ(kv.FindCachedPrefix(*probe, &hits), 32);

  const Snapshot before = Snapshot::Of(kv, *probe);
  EXPECT_FALSE(kv.AllocateSlots(*probe, 118, hits, /*full_sequence_must_fit=*/false, false));
  // No touch of the hit blocks, no partial allocation, nothing cached.
  Snapshot::Of(kv, *probe).ExpectSame(before);
  EXPECT_THAT(probe->blocks, IsEmpty());
}

TEST(KvCacheManagerTest, FailedAllocationForARunningRequestKeepsItsBlocks) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  auto a = MakeReq(config, 0, Distinct(0, 100));  // 7 blocks
  auto b = MakeReq(config, 1, Distinct(500, 60));  // first chunk of 40: 3 blocks, the pool is full
  ASSERT_TRUE(Step(kv, *a, 100));
  ASSERT_TRUE(Step(kv, *b, 40));
  ASSERT_EQ(kv.pool().num_free_blocks(), 0);

  // b's next chunk of 20 tokens would need 2 more blocks.
  const Snapshot before = Snapshot::Of(kv, *b);
  EXPECT_FALSE(kv.AllocateSlots(*b, 20, {}, false, false));
  Snapshot::Of(kv, *b).ExpectSame(before);
  // Within its last block it still fits.
  EXPECT_TRUE(kv.AllocateSlots(*b, 8, {}, false, false));
  EXPECT_EQ(b->blocks.size(), 3u);
}

TEST(KvCacheManagerTest, FullSequenceMustFitRefusesWhatOnlyTheFirstChunkFits) {
  const EngineConfig config = SmallPool(/*caching=*/false);
  KvCacheManager kv(config);
  auto big = MakeReq(config, 0, Distinct(0, 6 * 16));  // fills 6 of 10 blocks
  ASSERT_TRUE(Step(kv, *big, 96));
  ASSERT_EQ(kv.pool().num_free_blocks(), 4);

  // 80 tokens = 5 blocks in all, but a first chunk of 16 needs only 1.
  auto r = MakeReq(config, 1, Distinct(1000, 80));
  EXPECT_FALSE(kv.AllocateSlots(*r, 16, {}, /*full_sequence_must_fit=*/true, false));
  EXPECT_THAT(r->blocks, IsEmpty());
  EXPECT_EQ(kv.pool().num_free_blocks(), 4);
  EXPECT_TRUE(kv.AllocateSlots(*r, 16, {}, /*full_sequence_must_fit=*/false, false));
  EXPECT_EQ(r->blocks.size(), 1u);
  kv.Free(*r);

  // 64 tokens = 4 blocks: the whole sequence fits exactly, only the first
  // chunk's block is taken now.
  auto fits = MakeReq(config, 2, Distinct(2000, 64));
  EXPECT_TRUE(kv.AllocateSlots(*fits, 16, {}, /*full_sequence_must_fit=*/true, false));
  EXPECT_EQ(fits->blocks.size(), 1u);
  EXPECT_EQ(kv.pool().num_free_blocks(), 3);
}

TEST(KvCacheManagerTest, WatermarkOnlyWhenAsked) {
  EngineConfig config = SmallPool(/*caching=*/false);
  config.num_kv_blocks = 21;
  config.watermark = 0.1;  // 2 of 20 blocks
  ASSERT_TRUE(config.Validate().ok());
  ASSERT_EQ(config.WatermarkBlocks(), 2);
  KvCacheManager kv(config);
  auto filler = MakeReq(config, 9, Distinct(5000, 160));
  ASSERT_TRUE(Step(kv, *filler, 160));
  ASSERT_EQ(kv.pool().num_free_blocks(), 10);

  // 9 blocks: 9 + 2 > 10 with the watermark, fits without it.
  auto r = MakeReq(config, 0, Distinct(0, 9 * 16));
  EXPECT_FALSE(kv.AllocateSlots(*r, 144, {}, false, /*apply_watermark=*/true));
  EXPECT_THAT(r->blocks, IsEmpty());
  EXPECT_FALSE(kv.AllocateSlots(*r, 144, {}, /*full_sequence_must_fit=*/true, /*apply_watermark=*/true));
  EXPECT_TRUE(kv.AllocateSlots(*r, 144, {}, false, /*apply_watermark=*/false));
  EXPECT_EQ(kv.pool().num_free_blocks(), 1);
  kv.Free(*r);

  // 8 blocks: 8 + 2 == 10 still fits under the watermark.
  auto s = MakeReq(config, 1, Distinct(0, 8 * 16));
  EXPECT_TRUE(kv.AllocateSlots(*s, 128, {}, false, /*apply_watermark=*/true));
  EXPECT_EQ(kv.pool().num_free_blocks(), 2);
}

// Touching a hit block with ref 0 removes it from the free queue, so it costs
// free capacity exactly like a fresh block.
TEST(KvCacheManagerTest, EvictablePrefixHitsCountAgainstFreeCapacity) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  const BlockPool& pool = kv.pool();
  auto owner = MakeReq(config, 0, Distinct(0, 48));
  ASSERT_TRUE(kv.AllocateSlots(*owner, 48, {}, true, false));
  EXPECT_THAT(owner->blocks, ElementsAre(1, 2, 3));
  kv.Free(*owner);  // 1, 2, 3 stay cached, ref 0
  auto other = MakeReq(config, 1, Distinct(5000, 64));
  ASSERT_TRUE(Step(kv, *other, 64));
  EXPECT_THAT(other->blocks, ElementsAre(4, 5, 6, 7));
  ASSERT_THAT(pool.FreeQueueOrder(), ElementsAre(8, 9, 10, 3, 2, 1));

  // 128 tokens = 8 blocks, 2 of them hits with ref 0: 6 fresh + 2 touched = 8
  // free blocks needed, 6 exist. Counting only fresh blocks would say yes.
  std::vector<TokenId> tokens = Distinct(0, 32);
  for (TokenId t : Distinct(7000, 96)) tokens.push_back(t);
  auto too_big = MakeReq(config, 2, tokens);
  std::vector<BlockId> hits;
  ASSERT_EQ(kv.FindCachedPrefix(*too_big, &hits), 32);
  const Snapshot before = Snapshot::Of(kv, *too_big);
  EXPECT_FALSE(kv.AllocateSlots(*too_big, 96, hits, false, false));
  Snapshot::Of(kv, *too_big).ExpectSame(before);

  // 96 tokens = 6 blocks: 4 fresh + 2 touched = 6, exactly what is free.
  tokens.resize(96);
  auto fits = MakeReq(config, 3, tokens);
  ASSERT_EQ(kv.FindCachedPrefix(*fits, &hits), 32);
  ASSERT_TRUE(kv.AllocateSlots(*fits, 64, hits, false, false));
  EXPECT_THAT(fits->blocks, ElementsAre(1, 2, 8, 9, 10, 3));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.block(1).ref_cnt, 1);
}

// A hit on blocks another request holds costs nothing extra.
TEST(KvCacheManagerTest, SharedPrefixHitsCostNoFreeCapacity) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  auto owner = MakeReq(config, 0, Distinct(0, 48));
  ASSERT_TRUE(Step(kv, *owner, 48));
  ASSERT_EQ(kv.pool().num_free_blocks(), 7);
  // 144 tokens = 9 blocks, 3 shared: 6 fresh blocks.
  std::vector<TokenId> tokens = Distinct(0, 48);
  for (TokenId t : Distinct(7000, 96)) tokens.push_back(t);
  auto r = MakeReq(config, 1, tokens);
  std::vector<BlockId> hits;
  ASSERT_EQ(kv.FindCachedPrefix(*r, &hits), 48);
  ASSERT_TRUE(kv.AllocateSlots(*r, 96, hits, /*full_sequence_must_fit=*/true, false));
  EXPECT_EQ(kv.pool().num_free_blocks(), 1);
  EXPECT_EQ(kv.pool().block(1).ref_cnt, 2);
}

// scheduler/README.md §4.5: a block is cached at schedule time only up to the
// committed tokens, never the position an in-flight step is writing.
TEST(KvCacheManagerTest, ScheduleTimeCachingStopsAtCommittedTokens) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  auto r = MakeReq(config, 0, Distinct(0, 31));
  ASSERT_TRUE(Step(kv, *r, 31));  // prefill; samples position 31 (placeholder)
  EXPECT_EQ(r->num_cached_blocks, 1);
  ASSERT_TRUE(Step(kv, *r, 1));  // async decode of the placeholder: fills block 2
  EXPECT_EQ(r->blocks.size(), 2u);
  EXPECT_EQ(r->num_cached_blocks, 1);
  EXPECT_FALSE(kv.pool().block(r->blocks[1]).has_hash);
  // Output 1 arrives: N = 32, one placeholder still in flight, cache C - ph.
  r->AppendOutputToken(1);
  kv.CacheBlocks(*r, r->num_computed_tokens - 1);
  EXPECT_FALSE(kv.pool().block(r->blocks[1]).has_hash);
  // Output 2 arrives: position 31 is committed and computed.
  r->AppendOutputToken(2);
  kv.CacheBlocks(*r, r->num_computed_tokens);
  EXPECT_EQ(r->num_cached_blocks, 2);
  EXPECT_TRUE(kv.pool().IsRegistered(r->blocks[1]));
}

TEST(KvCacheManagerTest, TakeBlocksDetachesWithoutFreeing) {
  const EngineConfig config = SmallPool();
  KvCacheManager kv(config);
  auto r = MakeReq(config, 0, Distinct(0, 40));
  ASSERT_TRUE(Step(kv, *r, 40));
  const std::vector<BlockId> taken = kv.TakeBlocks(*r);
  EXPECT_THAT(taken, ElementsAre(1, 2, 3));
  EXPECT_THAT(r->blocks, IsEmpty());
  EXPECT_EQ(r->num_cached_blocks, 0);
  EXPECT_EQ(kv.pool().num_free_blocks(), 7);  // the pool still holds the references
  kv.FreeDetached(taken);
  EXPECT_EQ(kv.pool().num_free_blocks(), 10);
  // Tail first: uncached 3 to the head, cached 2 and 1 to the tail.
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(3, 4, 5, 6, 7, 8, 9, 10, 2, 1));
}

}  // namespace
}  // namespace tandem::scheduler
