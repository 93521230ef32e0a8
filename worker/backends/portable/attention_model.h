// The decomposition of the GPU paged attention (cuda/paged_attention.cu),
// shared by the kernels and by a host model of them.
//
// The plan (TANDEM_HD, used by both):
//  * Decode rows (a sequence with one query token): one CTA per (sequence,
//    KV head, head tile, context split). A head tile is up to kMaxGroupTile
//    query heads of one KV head, so every K/V row a CTA loads serves all of
//    them (GQA reuse). A context longer than its partition
//    (PartitionTokens: 32 tokens up to 128 of context, then 64, 128, and
//    kPartitionTokens past 512) is split into partitions, one CTA each;
//    their partial softmax states go to a workspace and a merge kernel folds
//    them in split order. A context of one partition is finished by its CTA
//    (no workspace).
//  * Inside a CTA, kWarps warps; warp w takes the chunks of kChunk tokens
//    w, w + kWarps, ... of the CTA's range, keeps its own online softmax
//    state per query head, and the CTA folds the warps' states in warp order.
//  * Chunked-prefill rows (a sequence with several query tokens): one CTA
//    per (sequence, KV head, head tile, query tile); warp w takes query
//    tokens tile * kWarps + w, then every gridDim.z * kWarps further, and
//    runs over the whole causal key range [0, position] alone, in chunks.
//  * Keys are addressed token by token through the block table, so chunks
//    need not align with cache blocks; keys past a row's range are masked
//    (score -inf, value 0) and never loaded.
// Each sequence's result depends only on its own inputs, never on the rest
// of the batch (the grid's shape only adds CTAs that exit at once).
//
// The model (ModelPagedAttention, host): the same grid, warps, chunks, splits
// and merges, in the same order, calling the same online_softmax.h
// functions. attention_model_test compares it with CpuBackend; only the
// dot products' summation order differs from the GPU (there lanes sum slices
// and a butterfly adds the lanes).
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_MODEL_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_MODEL_H_

#include <stddef.h>
#include <stdint.h>

#include "worker/backends/portable/portable.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backends/backend.h"

namespace tandem::worker::attention {

inline constexpr int kWarpSize = 32;
inline constexpr int kWarps = 4;                       // per CTA
inline constexpr int kThreads = kWarps * kWarpSize;
inline constexpr int kChunk = 8;                       // keys a warp loads per step
// Context per decode CTA of a long context: 64 keys (8 chunks) per warp
// keeps each warp's loads in flight long enough to hide latency, and a
// 2,000-token context still spreads over 8 CTAs per KV head at batch 1.
inline constexpr int kPartitionTokens = 256;
// Shorter contexts are cut finer (PartitionTokens), down to one chunk per
// warp, so that a small batch of short contexts still has several CTAs per
// KV head: at batch 1 a 128-token context took one CTA of 128 keys, 17 us a
// layer on an H200, against the layer's 60.
inline constexpr int kMinPartitionTokens = kWarps * 8;
inline constexpr int kMaxGroupTile = 8;                // query heads per CTA
inline constexpr int kMaxGridYZ = 65535;               // CUDA's limit on gridDim.y and .z

// Keys per partition of a decode row's context: a function of the row's
// own context only, so that each row's result stays independent of the rest
// of the batch. At most 4 partitions up to 512 tokens of context.
TANDEM_HD int PartitionTokens(int context) {
  return context <= 4 * kMinPartitionTokens   ? kMinPartitionTokens
         : context <= 8 * kMinPartitionTokens ? 2 * kMinPartitionTokens
         : context <= 4 * kPartitionTokens / 2 ? kPartitionTokens / 2
                                               : kPartitionTokens;
}

// Number of context partitions of a decode row (at least 1).
TANDEM_HD int NumSplits(int context) {
  const int partition = PartitionTokens(context);
  return context <= partition ? 1 : (context + partition - 1) / partition;
}

// The most partitions of any context of at most max_seq_len tokens (NumSplits
// is not monotonic: 128 tokens make 4 partitions of 32, 129 make 3 of 64).
TANDEM_HD int SplitsBound(int max_seq_len) {
  if (max_seq_len <= 4 * kPartitionTokens / 2) {
    const int fine = (max_seq_len + kMinPartitionTokens - 1) / kMinPartitionTokens;
    return fine < 4 ? (fine < 1 ? 1 : fine) : 4;
  }
  const int coarse = (max_seq_len + kPartitionTokens - 1) / kPartitionTokens;
  return coarse > 4 ? coarse : 4;
}

// Query heads per CTA for `group` query heads per KV head: the smallest power
// of two >= group, at most kMaxGroupTile (the kernels are instantiated for
// 1, 2, 4 and 8).
TANDEM_HD int GroupTile(int group) {
  int tile = 1;
  while (tile < group && tile < kMaxGroupTile) tile *= 2;
  return tile;
}

// Head tiles per KV head.
TANDEM_HD int HeadTiles(int group, int tile) { return (group + tile - 1) / tile; }

// Offset in floats of token `token`'s row of KV head `kv_head` in a layer's
// cache ([num_blocks, block_size, num_kv_heads, head_dim]); block_size is
// 1 << block_shift.
TANDEM_HD int64_t KvRowOffset(const int32_t* table, int token, int block_shift, int kv_width, int kv_head,
                              int head_dim) {
  const int64_t slot = (int64_t{table[token >> block_shift]} << block_shift) + (token & ((1 << block_shift) - 1));
  return slot * kv_width + int64_t{kv_head} * head_dim;
}

// The split workspace: for each (sequence, query head, split) an
// unnormalized accumulator of head_dim floats, then a (max, sum) pair.
// `max_splits` is SplitsBound(max_seq_len) when it exceeds 1 (0 otherwise:
// no workspace).
TANDEM_HD int64_t PartialIndex(int seq, int head, int split, int num_heads, int max_splits) {
  return (int64_t{seq} * num_heads + head) * max_splits + split;
}
TANDEM_HD size_t WorkspaceFloats(int num_seqs, int num_heads, int head_dim, int max_splits) {
  return static_cast<size_t>(num_seqs) * num_heads * max_splits * (head_dim + 2);
}
// Where the (max, sum) pairs start: after every accumulator.
TANDEM_HD size_t StatsOffset(int num_seqs, int num_heads, int head_dim, int max_splits) {
  return static_cast<size_t>(num_seqs) * num_heads * max_splits * head_dim;
}
TANDEM_HD int MaxSplits(int max_seq_len) { return SplitsBound(max_seq_len) > 1 ? SplitsBound(max_seq_len) : 0; }

// The host-side checks of the launch shape that the kernels and the model
// share (LaunchPagedAttention adds head_dim, pointer alignment and the
// workspace). Device values cannot be checked on the host: the contract is
// that every seq_lens[i] <= max_seq_len, every query count <= max_query_len
// and query count <= seq_lens[i]; a decode row whose context needs more
// splits than max_seq_len gave it is written as NaN rather than silently
// truncated.
inline absl::Status CheckAttentionShape(const AttentionParams& p) {
  auto invalid = [](auto... why) { return absl::InvalidArgumentError(absl::StrCat("paged attention: ", why...)); };
  if (p.num_seqs < 0) return invalid("num_seqs ", p.num_seqs, " is negative");
  if (p.num_seqs > kMaxGridYZ) return invalid("num_seqs ", p.num_seqs, " exceeds ", kMaxGridYZ);
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return invalid(p.num_heads, " query heads do not divide into ", p.num_kv_heads, " KV heads");
  }
  if (p.head_dim <= 0) return invalid("head_dim ", p.head_dim, " is not positive");
  if (p.block_size <= 0 || (p.block_size & (p.block_size - 1)) != 0) {
    return invalid("block_size ", p.block_size, " is not a power of two");
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.max_query_len < 1 || p.max_seq_len < p.max_query_len) {
    return invalid("max_query_len ", p.max_query_len, " and max_seq_len ", p.max_seq_len,
                   " must satisfy 1 <= max_query_len <= max_seq_len");
  }
  if (SplitsBound(p.max_seq_len) > kMaxGridYZ) return invalid("max_seq_len ", p.max_seq_len, " is too long");
  if (p.q == nullptr || p.out == nullptr || p.cache.k == nullptr || p.cache.v == nullptr ||
      p.query_start == nullptr || p.seq_lens == nullptr || p.block_table_start == nullptr ||
      p.block_tables == nullptr) {
    return invalid("a null pointer");
  }
  if (p.cache.type != KvType::kF32) return invalid("the cache is not float32");
  return absl::OkStatus();
}

// log2(block_size), for a block_size CheckAttentionShape accepted.
TANDEM_HD int BlockShift(int block_size) {
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  return shift;
}

// Runs the kernels' decomposition on the host over `p`'s host pointers (the
// CPU backend's layout). The same checks as LaunchPagedAttention but pointer
// alignment; head_dim 64 or 128, as the kernels.
absl::Status ModelPagedAttention(const AttentionParams& p);

}  // namespace tandem::worker::attention

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_ATTENTION_MODEL_H_
