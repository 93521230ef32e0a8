// PagedAttention for the CPU backend (backend.h's semantics), on its pool.
//
// Work is split by (token, span of kSpanRows keys). An item runs every head
// of its token over the span, KV head by KV head, with the span's whole
// cache rows (every KV head's part) asked for ahead: the block table
// scatters them, so the hardware prefetcher does not, and a head alone reads
// a third of each row. A thread's first item asks for its own rows at once;
// every item asks for those of the thread's next item a few lines per row it
// reads (RowPrefetcher), so that they arrive while it computes. Spans let
// one long context use every thread at batch 1 and keep a span's rows in L2
// while its heads read them.
//
// Spans are fixed by position (rows [s * kSpanRows, (s + 1) * kSpanRows)), so
// a query's result depends on its own context only: not on the batch, the
// chunking of its prompt, nor the number of threads. A context of one span
// is normalized as it is computed (AttendRow's arithmetic); longer ones are
// merged (MergeSpans) by a second loop.
//
// The cache holds float32 or half floats (KvCacheLayer::type; the model
// keeps halves, CpuBackendOptions::kv_type); a half cache gives the bits a
// float32 cache holding the same values gives. A decode widens each half row
// as it reads it; a prefill, which reads every row of its context once per
// query and query head, has its context widened once first.
//
// Thread-compatible: one caller at a time per scratch.
#ifndef TANDEM_WORKER_BACKENDS_CPU_CPU_ATTENTION_H_
#define TANDEM_WORKER_BACKENDS_CPU_CPU_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/backends/backend.h"
#include "worker/backends/cpu/cpu_math.h"
#include "worker/backends/cpu/thread_pool.h"

namespace tandem::worker::cpu {

// Keys a work item covers: for SmolLM2 (3 KV heads of 64) 24 KiB each of
// keys and values; a 640-token decode is 10 items, a 128-token one 2.
inline constexpr int32_t kSpanRows = 64;

// Buffers kept across calls (they grow to the largest step and stay).
struct AttentionScratch {
  std::vector<std::vector<float>> scores;  // per pool thread: kSpanRows
  std::vector<RowPrefetcher> ahead;        // per pool thread: the rows of its next item
  std::vector<int32_t> item_start;         // [tokens + 1]: first item of each token
  std::vector<int32_t> token_seq;          // [tokens]: each token's sequence
  std::vector<int32_t> merged;             // tokens of more than one span
  std::vector<SpanSums> sums;              // [items * group]: each span's sums
  std::vector<float> outs;                 // [items * group * head_dim]: unnormalized outputs
  // A half cache's prefills (WidenPrefills in cpu_attention.cc): each such
  // sequence's context rows as float32, from widened_at[seq] (-1: read from
  // the cache), and a block table that maps every row to itself. At most
  // widen_budget_bytes of keys and values together: many prefills of long
  // contexts in one step (a shared prefix's hits, each with a few new
  // tokens) would otherwise hold hundreds of MB; those past it read the
  // cache, with the same bits.
  int64_t widen_budget_bytes = int64_t{32} << 20;
  std::vector<int64_t> widened_at;     // [seqs]
  std::vector<int64_t> widened_first;  // [seqs + 1]: rows of the sequences before, widened
  std::vector<float> widened_k, widened_v;
  std::vector<BlockId> identity;
};

absl::Status PagedAttention(ThreadPool& pool, const AttentionParams& p, AttentionScratch* scratch);

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_CPU_ATTENTION_H_
