// Paged attention kernels: the decomposition is attention_model.h's (read
// it first), the softmax arithmetic online_softmax.h's; the host model in
// attention_model.cc runs the same loops and is checked against CpuBackend
// on the CPU, and paged_attention_test.cc checks these kernels on a GPU.
//
// Layout of a warp's work: lane l owns dims [l * kVec, (l + 1) * kVec) of a
// head (kVec = head_dim / 32: float2 loads at 64, float4 at 128), so a warp
// loads one K or V row per instruction, coalesced. For each chunk of kChunk
// keys a warp issues all kChunk K and V loads before using any (latency
// hiding), forms each score as a lane partial dot product summed by an XOR
// butterfly (every lane ends with the bit-identical sum, so each lane keeps
// an identical copy of the softmax state and no broadcast is needed), then
// updates its slice of the accumulator.
//
// Resources (per CTA of 128 threads): registers hold the query slices, the
// accumulators and one chunk of K and V per lane. ptxas (sm_90a, no spills):
// decode 96 registers at head_dim 64 and a head tile of 4 (SmolLM2), 154 at
// 128 x 4, 187 at 128 x 8; prefill a few more. Registers, not shared memory,
// limit occupancy: 5 CTAs (20 warps) per SM for SmolLM2, 2 at 128 x 8. The
// decode kernel's only shared memory is the warps' states for the final
// fold, kWarps * kTile * (head_dim + 2) floats (at most 16.3 KiB); the
// prefill kernel uses none.
//
// What a faster kernel would do (not needed for correctness): for prefill,
// FlashAttention-2's tiling, a tile of queries x a tile of keys staged in
// shared memory (cp.async/TMA) and multiplied on tensor cores (bf16 mma with
// fp32 accumulation), splitting long contexts across CTAs as decode does;
// for decode, a reduce-scatter of a chunk's 8 partial dots across the warp
// (9 shuffles per head instead of 40), keys read in bf16/fp8, the split
// chosen from the SM count and the batch (keeping it per sequence keeps
// results batch-invariant), and a fixed grid for CUDA graphs (the grid now
// follows max_seq_len and max_query_len).
#include "worker/backends/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/portable/attention_model.h"
#include "worker/backends/portable/online_softmax.h"

namespace tandem::worker {
namespace {

using attention::kChunk;
using attention::kThreads;
using attention::kWarps;
using attention::kWarpSize;

// Everything a kernel needs, by value.
struct KernelArgs {
  const float* k;
  const float* v;
  const float* q;
  float* out;
  const int32_t* query_start;
  const int32_t* seq_lens;
  const int32_t* block_table_start;
  const int32_t* block_tables;
  float* workspace;  // null when max_splits == 0
  int32_t num_seqs;
  int32_t num_heads;
  int32_t group;       // query heads per KV head
  int32_t head_tiles;  // CTAs per KV head
  int32_t block_shift;
  int32_t kv_width;
  int32_t max_splits;
  float scale;
};

// The CTA's query heads: [head0, head0 + heads) of KV head kv_head.
struct CtaHeads {
  int kv_head;
  int head0;
  int heads;
};

template <int kTile>
__device__ __forceinline__ CtaHeads HeadsOf(const KernelArgs& a, int x) {
  CtaHeads c;
  c.kv_head = x / a.head_tiles;
  const int tile_index = x % a.head_tiles;
  c.head0 = c.kv_head * a.group + tile_index * kTile;
  c.heads = min(kTile, a.group - tile_index * kTile);
  return c;
}

template <int kVec>
__device__ __forceinline__ void LoadSlice(const float* p, float (&x)[kVec]) {
  static_assert(kVec == 2 || kVec == 4, "head_dim 64 or 128");
  if constexpr (kVec == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    x[0] = t.x;
    x[1] = t.y;
    x[2] = t.z;
    x[3] = t.w;
  } else {
    const float2 t = __ldg(reinterpret_cast<const float2*>(p));
    x[0] = t.x;
    x[1] = t.y;
  }
}

template <int kVec>
__device__ __forceinline__ void StoreSlice(float* p, const float (&x)[kVec], float scale) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0] * scale, x[1] * scale, x[2] * scale, x[3] * scale);
  } else {
    *reinterpret_cast<float2*>(p) = make_float2(x[0] * scale, x[1] * scale);
  }
}

// The sum over the warp, identical in every lane (IEEE addition commutes, so
// lanes l and l ^ o add the same two values).
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One warp's online-softmax state: per query head of the tile, the state
// (identical in every lane) and the lane's slice of the accumulator.
template <int kDim, int kTile>
struct WarpState {
  static constexpr int kVec = kDim / kWarpSize;
  float q[kTile][kVec];
  SoftmaxState state[kTile];
  float acc[kTile][kVec];

  // Loads token t's query slices (zeros for heads past the tile's) and
  // empties the state.
  __device__ __forceinline__ void Begin(const KernelArgs& a, const CtaHeads& c, int t, int lane) {
#pragma unroll
    for (int g = 0; g < kTile; ++g) {
      state[g] = EmptySoftmaxState();
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        acc[g][i] = 0.0f;
        q[g][i] = 0.0f;
      }
      if (g < c.heads) LoadSlice<kVec>(a.q + (int64_t{t} * a.num_heads + c.head0 + g) * kDim + lane * kVec, q[g]);
    }
  }
};

// The chunks first_chunk, first_chunk + chunk_stride, ... of the keys
// [begin, end) (attention_model.cc's WarpPass). Every branch is uniform
// across the warp, as the butterflies require.
template <int kDim, int kTile>
__device__ __forceinline__ void WarpPass(const KernelArgs& a, const int32_t* table, const CtaHeads& c, int begin,
                                         int end, int first_chunk, int chunk_stride, int lane,
                                         WarpState<kDim, kTile>* w) {
  constexpr int kVec = kDim / kWarpSize;
  for (int c0 = begin + first_chunk * kChunk; c0 < end; c0 += chunk_stride * kChunk) {
    float k[kChunk][kVec];
    float v[kChunk][kVec];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (c0 + j < end) {
        const int64_t row =
            attention::KvRowOffset(table, c0 + j, a.block_shift, a.kv_width, c.kv_head, kDim) + lane * kVec;
        LoadSlice<kVec>(a.k + row, k[j]);
        LoadSlice<kVec>(a.v + row, v[j]);
      } else {  // masked: never loaded (its slot may not exist)
#pragma unroll
        for (int i = 0; i < kVec; ++i) k[j][i] = v[j][i] = 0.0f;
      }
    }
#pragma unroll
    for (int g = 0; g < kTile; ++g) {
      if (g >= c.heads) continue;
      float scores[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) partial += w->q[g][i] * k[j][i];
        const float dot = WarpSum(partial);
        scores[j] = c0 + j < end ? dot * a.scale : -INFINITY;
      }
      float weights[kChunk];
      const float factor = SoftmaxUpdate(&w->state[g], scores, weights);
      SoftmaxAccumulate(w->acc[g], factor, weights, v);
    }
  }
}

// Decode rows: CTA (KV head x head tile, sequence, split).
template <int kDim, int kTile>
__global__ void __launch_bounds__(kThreads) DecodeKernel(KernelArgs a) {
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int t = a.query_start[seq];
  if (a.query_start[seq + 1] - t != 1) return;
  const CtaHeads c = HeadsOf<kTile>(a, blockIdx.x);
  const int context = max(a.seq_lens[seq], 0);
  const int splits = attention::NumSplits(context);
  if (splits > static_cast<int>(gridDim.z)) {
    // max_seq_len understated this context (a caller's bug): NaN, loudly,
    // rather than a truncated context or a write past the workspace.
    if (split == 0) {
      for (int e = threadIdx.x; e < c.heads * kDim; e += kThreads) {
        a.out[(int64_t{t} * a.num_heads + c.head0 + e / kDim) * kDim + e % kDim] = __int_as_float(0x7fc00000);
      }
    }
    return;
  }
  if (split >= splits) return;
  const int partition = attention::PartitionTokens(context);
  const int begin = split * partition;
  const int end = min(begin + partition, context);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  WarpState<kDim, kTile> w;
  w.Begin(a, c, t, lane);
  WarpPass<kDim, kTile>(a, a.block_tables + a.block_table_start[seq], c, begin, end, warp, kWarps, lane, &w);

  // Fold the warps' states in warp order (every slot written, idle heads'
  // included, before the barrier).
  constexpr int kVec = kDim / kWarpSize;
  __shared__ float s_acc[kWarps][kTile][kDim];
  __shared__ SoftmaxState s_state[kWarps][kTile];
#pragma unroll
  for (int g = 0; g < kTile; ++g) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) s_acc[warp][g][lane * kVec + i] = w.acc[g][i];
    if (lane == 0) s_state[warp][g] = w.state[g];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < c.heads * kDim; e += kThreads) {
    const int g = e / kDim;
    const int d = e % kDim;
    SoftmaxState state = s_state[0][g];
    float acc = s_acc[0][g][d];
#pragma unroll
    for (int other = 1; other < kWarps; ++other) {
      float fa, fb;
      state = SoftmaxMerge(state, s_state[other][g], &fa, &fb);
      acc = acc * fa + s_acc[other][g][d] * fb;
    }
    const int head = c.head0 + g;
    if (splits == 1) {
      a.out[(int64_t{t} * a.num_heads + head) * kDim + d] = acc * SoftmaxInvSum(state);
      continue;
    }
    const int64_t partial = attention::PartialIndex(seq, head, split, a.num_heads, a.max_splits);
    a.workspace[partial * kDim + d] = acc;
    if (d == 0) {
      float* stats = a.workspace + attention::StatsOffset(a.num_seqs, a.num_heads, kDim, a.max_splits) + partial * 2;
      stats[0] = state.max;
      stats[1] = state.sum;
    }
  }
}

// The split merge: CTA (head, sequence), thread = dim. Folds the partials in
// split order.
template <int kDim>
__global__ void __launch_bounds__(kDim) MergeKernel(KernelArgs a) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  const int t = a.query_start[seq];
  if (a.query_start[seq + 1] - t != 1) return;
  const int splits = attention::NumSplits(max(a.seq_lens[seq], 0));
  if (splits <= 1 || splits > a.max_splits) return;
  const float* stats = a.workspace + attention::StatsOffset(a.num_seqs, a.num_heads, kDim, a.max_splits);
  int64_t partial = attention::PartialIndex(seq, head, 0, a.num_heads, a.max_splits);
  SoftmaxState state{stats[partial * 2], stats[partial * 2 + 1]};
  float acc = a.workspace[partial * kDim + d];
  for (int split = 1; split < splits; ++split) {
    partial = attention::PartialIndex(seq, head, split, a.num_heads, a.max_splits);
    float fa, fb;
    state = SoftmaxMerge(state, SoftmaxState{stats[partial * 2], stats[partial * 2 + 1]}, &fa, &fb);
    acc = acc * fa + a.workspace[partial * kDim + d] * fb;
  }
  a.out[(int64_t{t} * a.num_heads + head) * kDim + d] = acc * SoftmaxInvSum(state);
}

// Chunked-prefill rows: CTA (KV head x head tile, sequence, query tile);
// each warp owns whole query tokens and walks their causal key range alone.
template <int kDim, int kTile>
__global__ void __launch_bounds__(kThreads) PrefillKernel(KernelArgs a) {
  constexpr int kVec = kDim / kWarpSize;
  const int seq = blockIdx.y;
  const int first = a.query_start[seq];
  const int queries = a.query_start[seq + 1] - first;
  if (queries < 2) return;
  const CtaHeads c = HeadsOf<kTile>(a, blockIdx.x);
  const int context = a.seq_lens[seq];
  const int32_t* table = a.block_tables + a.block_table_start[seq];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int i = blockIdx.z * kWarps + warp; i < queries; i += gridDim.z * kWarps) {
    const int t = first + i;
    const int end = max(context - queries + i + 1, 0);  // keys [0, position]
    WarpState<kDim, kTile> w;
    w.Begin(a, c, t, lane);
    WarpPass<kDim, kTile>(a, table, c, 0, end, 0, 1, lane, &w);
#pragma unroll
    for (int g = 0; g < kTile; ++g) {
      if (g >= c.heads) continue;
      StoreSlice<kVec>(a.out + (int64_t{t} * a.num_heads + c.head0 + g) * kDim + lane * kVec, w.acc[g],
                       SoftmaxInvSum(w.state[g]));
    }
  }
}

template <int kDim, int kTile>
absl::Status Launch(const AttentionParams& p, const KernelArgs& a, CUstream_st* stream) {
  const dim3 threads(kThreads);
  const unsigned grid_x = static_cast<unsigned>(p.num_kv_heads) * a.head_tiles;
  const unsigned decode_z = a.max_splits > 0 ? a.max_splits : 1;
  DecodeKernel<kDim, kTile><<<dim3(grid_x, p.num_seqs, decode_z), threads, 0, stream>>>(a);
  if (absl::Status s = LaunchStatus("paged attention decode kernel"); !s.ok()) return s;
  if (a.max_splits > 0) {
    MergeKernel<kDim><<<dim3(p.num_heads, p.num_seqs), kDim, 0, stream>>>(a);
    if (absl::Status s = LaunchStatus("paged attention merge kernel"); !s.ok()) return s;
  }
  if (p.max_query_len > 1) {
    const unsigned prefill_z = std::min((p.max_query_len + kWarps - 1) / kWarps, attention::kMaxGridYZ);
    PrefillKernel<kDim, kTile><<<dim3(grid_x, p.num_seqs, prefill_z), threads, 0, stream>>>(a);
    if (absl::Status s = LaunchStatus("paged attention prefill kernel"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <int kDim>
absl::Status LaunchForDim(const AttentionParams& p, const KernelArgs& a, int tile, CUstream_st* stream) {
  switch (tile) {
    case 1:
      return Launch<kDim, 1>(p, a, stream);
    case 2:
      return Launch<kDim, 2>(p, a, stream);
    case 4:
      return Launch<kDim, 4>(p, a, stream);
    default:
      return Launch<kDim, 8>(p, a, stream);
  }
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

size_t PagedAttentionWorkspaceBytes(const AttentionParams& p) {
  if (p.num_seqs <= 0 || p.num_heads <= 0 || p.head_dim <= 0) return 0;
  return attention::WorkspaceFloats(p.num_seqs, p.num_heads, p.head_dim, attention::MaxSplits(p.max_seq_len)) *
         sizeof(float);
}

absl::Status LaunchPagedAttention(const AttentionParams& p, void* workspace, size_t workspace_bytes,
                                  CUstream_st* stream) {
  if (absl::Status s = attention::CheckAttentionShape(p); !s.ok()) return s;
  if (p.head_dim != 64 && p.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged attention: head_dim ", p.head_dim, " is not supported (64 or 128)"));
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  // Each lane loads head_dim / 32 consecutive floats as one vector.
  const size_t vector_bytes = static_cast<size_t>(p.head_dim / kWarpSize) * sizeof(float);
  if (!Aligned(p.q, vector_bytes) || !Aligned(p.out, vector_bytes) || !Aligned(p.cache.k, vector_bytes) ||
      !Aligned(p.cache.v, vector_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged attention: q, out and the cache must be aligned to ", vector_bytes, " bytes"));
  }
  const size_t needed = PagedAttentionWorkspaceBytes(p);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("paged attention: the workspace has ", workspace_bytes,
                                                   " bytes, the launch needs ", needed));
  }
  KernelArgs a;
  a.k = static_cast<const float*>(p.cache.k);
  a.v = static_cast<const float*>(p.cache.v);
  a.q = p.q;
  a.out = p.out;
  a.query_start = p.query_start;
  a.seq_lens = p.seq_lens;
  a.block_table_start = p.block_table_start;
  a.block_tables = p.block_tables;
  a.workspace = needed > 0 ? static_cast<float*>(workspace) : nullptr;
  a.num_seqs = p.num_seqs;
  a.num_heads = p.num_heads;
  a.group = p.num_heads / p.num_kv_heads;
  const int tile = attention::GroupTile(a.group);
  a.head_tiles = attention::HeadTiles(a.group, tile);
  a.block_shift = attention::BlockShift(p.block_size);
  a.kv_width = p.num_kv_heads * p.head_dim;
  a.max_splits = attention::MaxSplits(p.max_seq_len);
  a.scale = p.scale;
  return p.head_dim == 64 ? LaunchForDim<64>(p, a, tile, stream) : LaunchForDim<128>(p, a, tile, stream);
}

}  // namespace tandem::worker
