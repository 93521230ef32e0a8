// The host model of cuda/paged_attention.cu: the same loops, in the same
// order, over the same portable functions. Each function names the kernel
// (or the part of it) it mirrors; a CTA is a call, a warp an object, a lane's
// slice of a row the whole row.
#include "worker/backends/portable/attention_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "worker/backends/portable/online_softmax.h"

namespace tandem::worker::attention {
namespace {

struct Shape {
  int group;       // query heads per KV head
  int tile;        // query heads per CTA
  int head_tiles;  // CTAs per KV head
  int block_shift;
  int kv_width;
  int max_splits;  // workspace splits (0: none)
  int decode_z;    // gridDim.z of the decode kernel
  int prefill_z;   // gridDim.z of the prefill kernel
};

Shape MakeShape(const AttentionParams& p) {
  Shape s;
  s.group = p.num_heads / p.num_kv_heads;
  s.tile = GroupTile(s.group);
  s.head_tiles = HeadTiles(s.group, s.tile);
  s.block_shift = BlockShift(p.block_size);
  s.kv_width = p.num_kv_heads * p.head_dim;
  s.max_splits = MaxSplits(p.max_seq_len);
  s.decode_z = std::max(1, s.max_splits);
  s.prefill_z = std::min((p.max_query_len + kWarps - 1) / kWarps, kMaxGridYZ);
  return s;
}

// One warp's state: per query head of the tile, the online softmax state and
// the accumulator (on the GPU each lane holds head_dim / 32 of it).
template <int kDim>
struct Warp {
  SoftmaxState state[kMaxGroupTile];
  float acc[kMaxGroupTile][kDim];
  Warp() {
    for (int g = 0; g < kMaxGroupTile; ++g) {
      state[g] = EmptySoftmaxState();
      std::fill(acc[g], acc[g] + kDim, 0.0f);
    }
  }
};

// The CTA's coordinates and its query heads: heads [head0, head0 + heads).
struct Cta {
  int seq;
  int kv_head;
  int head0;
  int heads;
};

Cta MakeCta(const AttentionParams& p, const Shape& s, int seq, int x) {
  Cta c;
  c.seq = seq;
  c.kv_head = x / s.head_tiles;
  const int tile_index = x % s.head_tiles;
  c.head0 = c.kv_head * s.group + tile_index * s.tile;
  c.heads = std::min(s.tile, s.group - tile_index * s.tile);
  return c;
}

float Dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// WarpPass in paged_attention.cu: the chunks first_chunk, first_chunk +
// chunk_stride, ... of the keys [begin, end) of token `t`'s query heads.
template <int kDim>
void WarpPass(const AttentionParams& p, const Shape& s, const Cta& c, int t, int begin, int end, int first_chunk,
              int chunk_stride, Warp<kDim>* w) {
  const int32_t* table = p.block_tables + p.block_table_start[c.seq];
  for (int c0 = begin + first_chunk * kChunk; c0 < end; c0 += chunk_stride * kChunk) {
    float k[kChunk][kDim];
    float v[kChunk][kDim];
    for (int j = 0; j < kChunk; ++j) {
      const int token = c0 + j;
      if (token < end) {
        const int64_t row = KvRowOffset(table, token, s.block_shift, s.kv_width, c.kv_head, kDim);
        const float* keys = static_cast<const float*>(p.cache.k) + row;
        const float* values = static_cast<const float*>(p.cache.v) + row;
        std::copy(keys, keys + kDim, k[j]);
        std::copy(values, values + kDim, v[j]);
      } else {
        std::fill(k[j], k[j] + kDim, 0.0f);
        std::fill(v[j], v[j] + kDim, 0.0f);
      }
    }
    for (int g = 0; g < c.heads; ++g) {
      const float* q = p.q + (int64_t{t} * p.num_heads + c.head0 + g) * kDim;
      float scores[kChunk];
      for (int j = 0; j < kChunk; ++j) scores[j] = c0 + j < end ? Dot(q, k[j], kDim) * p.scale : -INFINITY;
      float weights[kChunk];
      const float factor = SoftmaxUpdate(&w->state[g], scores, weights);
      SoftmaxAccumulate(w->acc[g], factor, weights, v);
    }
  }
}

void WriteNan(const AttentionParams& p, const Cta& c, int t) {
  for (int g = 0; g < c.heads; ++g) {
    float* out = p.out + (int64_t{t} * p.num_heads + c.head0 + g) * p.head_dim;
    std::fill(out, out + p.head_dim, std::numeric_limits<float>::quiet_NaN());
  }
}

// DecodeKernel: CTA (x, seq, split).
template <int kDim>
void DecodeCta(const AttentionParams& p, const Shape& s, const Cta& c, int split, float* workspace) {
  const int t = p.query_start[c.seq];
  if (p.query_start[c.seq + 1] - t != 1) return;
  const int context = std::max(p.seq_lens[c.seq], 0);
  const int splits = NumSplits(context);
  if (splits > s.decode_z) {  // max_seq_len understated: fail loudly
    if (split == 0) WriteNan(p, c, t);
    return;
  }
  if (split >= splits) return;
  const int partition = PartitionTokens(context);
  const int begin = split * partition;
  const int end = std::min(begin + partition, context);
  std::vector<Warp<kDim>> warps(kWarps);
  for (int w = 0; w < kWarps; ++w) WarpPass(p, s, c, t, begin, end, w, kWarps, &warps[w]);
  // The fold of the warps, in warp order, element by element as the CTA's
  // threads do it.
  for (int g = 0; g < c.heads; ++g) {
    const int head = c.head0 + g;
    for (int d = 0; d < kDim; ++d) {
      SoftmaxState state = warps[0].state[g];
      float acc = warps[0].acc[g][d];
      for (int w = 1; w < kWarps; ++w) {
        float fa, fb;
        state = SoftmaxMerge(state, warps[w].state[g], &fa, &fb);
        acc = acc * fa + warps[w].acc[g][d] * fb;
      }
      if (splits == 1) {
        p.out[(int64_t{t} * p.num_heads + head) * kDim + d] = acc * SoftmaxInvSum(state);
        continue;
      }
      const int64_t partial = PartialIndex(c.seq, head, split, p.num_heads, s.max_splits);
      workspace[partial * kDim + d] = acc;
      if (d == 0) {
        float* stats = workspace + StatsOffset(p.num_seqs, p.num_heads, kDim, s.max_splits) + partial * 2;
        stats[0] = state.max;
        stats[1] = state.sum;
      }
    }
  }
}

// MergeKernel: CTA (head, seq), thread d.
void MergeSplits(const AttentionParams& p, const Shape& s, int seq, int head, const float* workspace) {
  const int t = p.query_start[seq];
  if (p.query_start[seq + 1] - t != 1) return;
  const int splits = NumSplits(std::max(p.seq_lens[seq], 0));
  if (splits <= 1 || splits > s.max_splits) return;
  const float* stats = workspace + StatsOffset(p.num_seqs, p.num_heads, p.head_dim, s.max_splits);
  for (int d = 0; d < p.head_dim; ++d) {
    int64_t partial = PartialIndex(seq, head, 0, p.num_heads, s.max_splits);
    SoftmaxState state{stats[partial * 2], stats[partial * 2 + 1]};
    float acc = workspace[partial * p.head_dim + d];
    for (int split = 1; split < splits; ++split) {
      partial = PartialIndex(seq, head, split, p.num_heads, s.max_splits);
      float fa, fb;
      state = SoftmaxMerge(state, SoftmaxState{stats[partial * 2], stats[partial * 2 + 1]}, &fa, &fb);
      acc = acc * fa + workspace[partial * p.head_dim + d] * fb;
    }
    p.out[(int64_t{t} * p.num_heads + head) * p.head_dim + d] = acc * SoftmaxInvSum(state);
  }
}

// PrefillKernel: CTA (x, seq, z); warp w's query tokens.
template <int kDim>
void PrefillCta(const AttentionParams& p, const Shape& s, const Cta& c, int z) {
  const int first = p.query_start[c.seq];
  const int queries = p.query_start[c.seq + 1] - first;
  if (queries < 2) return;
  const int context = p.seq_lens[c.seq];
  for (int w = 0; w < kWarps; ++w) {
    for (int i = z * kWarps + w; i < queries; i += s.prefill_z * kWarps) {
      const int t = first + i;
      const int end = std::max(context - queries + i + 1, 0);  // keys [0, position]
      Warp<kDim> warp;
      WarpPass(p, s, c, t, 0, end, 0, 1, &warp);
      for (int g = 0; g < c.heads; ++g) {
        float* out = p.out + (int64_t{t} * p.num_heads + c.head0 + g) * kDim;
        const float inv_sum = SoftmaxInvSum(warp.state[g]);
        for (int d = 0; d < kDim; ++d) out[d] = warp.acc[g][d] * inv_sum;
      }
    }
  }
}

template <int kDim>
void Run(const AttentionParams& p) {
  const Shape s = MakeShape(p);
  std::vector<float> workspace(WorkspaceFloats(p.num_seqs, p.num_heads, kDim, s.max_splits));
  const int grid_x = p.num_kv_heads * s.head_tiles;
  // The launcher's order: decode, then merge (when splits), then prefill
  // (when some row has several queries). They write disjoint rows.
  for (int seq = 0; seq < p.num_seqs; ++seq) {
    for (int x = 0; x < grid_x; ++x) {
      for (int z = 0; z < s.decode_z; ++z) DecodeCta<kDim>(p, s, MakeCta(p, s, seq, x), z, workspace.data());
    }
  }
  if (s.max_splits > 0) {
    for (int seq = 0; seq < p.num_seqs; ++seq) {
      for (int head = 0; head < p.num_heads; ++head) MergeSplits(p, s, seq, head, workspace.data());
    }
  }
  if (p.max_query_len > 1) {
    for (int seq = 0; seq < p.num_seqs; ++seq) {
      for (int x = 0; x < grid_x; ++x) {
        for (int z = 0; z < s.prefill_z; ++z) PrefillCta<kDim>(p, s, MakeCta(p, s, seq, x), z);
      }
    }
  }
}

}  // namespace

absl::Status ModelPagedAttention(const AttentionParams& p) {
  if (absl::Status status = CheckAttentionShape(p); !status.ok()) return status;
  if (p.num_seqs == 0) return absl::OkStatus();
  switch (p.head_dim) {
    case 64:
      Run<64>(p);
      return absl::OkStatus();
    case 128:
      Run<128>(p);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("paged attention: head_dim ", p.head_dim, " is not supported (64 or 128)"));
  }
}

}  // namespace tandem::worker::attention
