// Test inputs for paged attention, shared by the host model's test
// (attention_model_test.cc) and the GPU kernels' test
// (cuda/paged_attention_test.cc) so both see the same caches and tables.
//
// Deterministic (SplitMix64 draws): a case and its seed give the same bytes
// with any standard library. Block ids are a random permutation of the
// cache's blocks (scattered tables), block 0 is the null block, and every
// cache slot no sequence may read (block 0, free blocks, the tail of each
// sequence's last block) holds NaN, so a kernel that reads a key it must not
// poisons its output.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_TESTING_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "common/splitmix.h"
#include "common/types.h"
#include "worker/backends/backend.h"

namespace tandem::worker::attention_testing {

struct SeqSpec {
  int32_t queries;  // query tokens this step (1: a decode row)
  int32_t context;  // seq_len: context including the queries
};

struct AttentionCase {
  int32_t num_heads = 4;
  int32_t num_kv_heads = 4;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  std::vector<SeqSpec> seqs;
  // Sequence 1 reads sequence 0's first full blocks (the same block ids), as
  // prefix caching shares them.
  bool share_prefix = false;
  uint64_t seed = 1;
};

// Host copies of every input; Params() points into them.
struct AttentionInputs {
  AttentionCase c;
  int32_t num_blocks = 0;
  int32_t num_tokens = 0;
  int32_t max_seq_len = 0;
  int32_t max_query_len = 0;
  std::vector<float> k_cache, v_cache;  // [num_blocks, block_size, kv_heads, head_dim]
  std::vector<float> q;                 // [num_tokens, heads, head_dim]
  std::vector<int32_t> query_start, seq_lens, block_table_start;
  std::vector<BlockId> block_tables;

  // The call's parameters over the given buffers (host or device copies of
  // the vectors above).
  AttentionParams Params(const float* k, const float* v, const float* query, float* out, const int32_t* qs,
                         const int32_t* sl, const int32_t* bts, const BlockId* bt) const {
    AttentionParams p{};
    p.cache = KvCacheLayer{const_cast<float*>(k), const_cast<float*>(v), KvType::kF32};
    p.q = query;
    p.out = out;
    p.query_start = qs;
    p.seq_lens = sl;
    p.block_table_start = bts;
    p.block_tables = bt;
    p.num_seqs = static_cast<int32_t>(c.seqs.size());
    p.max_seq_len = max_seq_len;
    p.max_query_len = max_query_len;
    p.num_heads = c.num_heads;
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.block_size = c.block_size;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    return p;
  }
  // Over the host vectors.
  AttentionParams HostParams(float* out) const {
    return Params(k_cache.data(), v_cache.data(), q.data(), out, query_start.data(), seq_lens.data(),
                  block_table_start.data(), block_tables.data());
  }
};

class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64(state_++); }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(Next() >> 11) * 0x1.0p-53);
  }
  int32_t Below(int32_t n) { return static_cast<int32_t>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

// The cases both tests run. Decode rows and chunked-prefill rows mixed,
// short and long: contexts 1 to 2,000 across the split threshold (256) and
// its multiples, fresh prompts (queries == context) and continued chunks.
inline std::vector<SeqSpec> MixedSeqs() {
  return {{1, 1},   {1, 17},  {5, 5},     {7, 300}, {1, 2000}, {1, 256}, {1, 257},
          {1, 512}, {1, 513}, {33, 1100}, {2, 2},   {1, 769},  {16, 16}};
}

struct HeadConfig {
  int32_t heads;
  int32_t kv_heads;
  int32_t head_dim;
};

// GQA 1, 3 (SmolLM2: 9 query / 3 KV heads, head_dim 64), 4, 6 (a head tile
// of 8 with 2 heads idle) and 16 (two head tiles per KV head).
inline constexpr HeadConfig kHeadConfigs[] = {{4, 4, 64}, {9, 3, 64}, {8, 2, 128}, {12, 2, 64}, {16, 1, 128}};

inline AttentionInputs MakeAttentionInputs(const AttentionCase& c) {
  AttentionInputs in;
  in.c = c;
  Draws draws(c.seed);
  const int32_t bs = c.block_size;
  const int32_t kv_width = c.num_kv_heads * c.head_dim;
  std::vector<int32_t> blocks_needed;
  int32_t total_blocks = 0;
  for (const SeqSpec& s : c.seqs) {
    blocks_needed.push_back((s.context + bs - 1) / bs);
    total_blocks += blocks_needed.back();
    in.max_seq_len = std::max(in.max_seq_len, s.context);
    in.max_query_len = std::max(in.max_query_len, s.queries);
  }
  // Block 0 (null) and a few free blocks besides the used ones.
  in.num_blocks = total_blocks + 1 + 3;
  std::vector<BlockId> free_ids(in.num_blocks - 1);
  std::iota(free_ids.begin(), free_ids.end(), 1);
  for (size_t i = free_ids.size(); i > 1; --i) std::swap(free_ids[i - 1], free_ids[draws.Below(static_cast<int32_t>(i))]);
  size_t next = 0;
  in.block_table_start.push_back(0);
  in.query_start.push_back(0);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    int32_t shared = 0;
    if (c.share_prefix && s == 1) shared = std::min(c.seqs[0].context, c.seqs[1].context) / bs;
    for (int32_t b = 0; b < blocks_needed[s]; ++b) {
      in.block_tables.push_back(b < shared ? in.block_tables[b] : free_ids[next++]);
    }
    in.block_table_start.push_back(static_cast<int32_t>(in.block_tables.size()));
    in.query_start.push_back(in.query_start.back() + c.seqs[s].queries);
    in.seq_lens.push_back(c.seqs[s].context);
  }
  in.num_tokens = in.query_start.back();
  const size_t cache_floats = static_cast<size_t>(in.num_blocks) * bs * kv_width;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  in.k_cache.assign(cache_floats, nan);
  in.v_cache.assign(cache_floats, nan);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    for (int32_t j = 0; j < c.seqs[s].context; ++j) {
      const int64_t slot = int64_t{in.block_tables[in.block_table_start[s] + j / bs]} * bs + j % bs;
      for (int32_t i = 0; i < kv_width; ++i) {
        // A shared block is written twice with the same draws' slots: keep
        // the first sequence's values (prefix caching's blocks are shared
        // because they hold the same keys).
        float& k = in.k_cache[slot * kv_width + i];
        float& v = in.v_cache[slot * kv_width + i];
        const float dk = draws.Uniform(-1.0f, 1.0f);
        const float dv = draws.Uniform(-1.0f, 1.0f);
        if (std::isnan(k)) {
          k = dk;
          v = dv;
        }
      }
    }
  }
  // Queries of magnitude ~3 give scores of standard deviation ~1 after the
  // 1/sqrt(head_dim) scale: softmaxes neither flat nor one-hot.
  in.q.resize(static_cast<size_t>(in.num_tokens) * c.num_heads * c.head_dim);
  for (float& x : in.q) x = draws.Uniform(-3.0f, 3.0f);
  return in;
}

}  // namespace tandem::worker::attention_testing

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_TESTING_H_
