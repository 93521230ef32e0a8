#include "worker/backends/cpu/cpu_attention.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace tandem::worker::cpu {
namespace {

int32_t SpansOf(int32_t context) { return (context + kSpanRows - 1) / kSpanRows; }

// A half cache's sequences with several queries (prefills) read every row
// of their context once per later query and query head (up to 3 x 512 times
// in a 512-token prompt of SmolLM2): widened at each read, that cost a
// 64-token prefill 8% of its time against a float32 cache (alternated runs).
// Their context rows are widened once here, in parallel, into scratch
// (float32 rows in position order, read through the identity table; it
// grows to the largest step's prefill contexts); widening is exact, so the
// bits are those of the half rows. Decodes read each row once per query
// head, from memory, and keep reading the cache.
void WidenPrefills(ThreadPool& pool, const AttentionParams& p, const uint16_t* k_cache, const uint16_t* v_cache,
                   AttentionScratch* scratch) {
  AttentionScratch& s = *scratch;
  const int64_t kv_width = int64_t{p.num_kv_heads} * p.head_dim;
  s.widened_at.assign(p.num_seqs, -1);
  s.widened_first.assign(p.num_seqs + 1, 0);
  const int64_t budget_rows = s.widen_budget_bytes / (2 * kv_width * int64_t{sizeof(float)});
  int32_t longest = 0;
  for (int32_t seq = 0; seq < p.num_seqs; ++seq) {
    const bool prefill = p.query_start[seq + 1] - p.query_start[seq] > 1 &&
                         s.widened_first[seq] + p.seq_lens[seq] <= budget_rows;
    const int32_t rows = prefill ? p.seq_lens[seq] : 0;
    if (prefill) s.widened_at[seq] = s.widened_first[seq] * kv_width;
    s.widened_first[seq + 1] = s.widened_first[seq] + rows;
    longest = std::max(longest, rows);
  }
  const int64_t total = s.widened_first[p.num_seqs];
  if (total == 0) return;
  if (s.widened_k.size() < static_cast<size_t>(total * kv_width)) {
    s.widened_k.resize(total * kv_width);
    s.widened_v.resize(total * kv_width);
  }
  const int32_t blocks = (longest + p.block_size - 1) / p.block_size;
  for (auto b = static_cast<int32_t>(s.identity.size()); b < blocks; ++b) s.identity.push_back(b);
  pool.ParallelFor(total, 16, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t r = begin; r < end; ++r) {
      const auto seq = static_cast<int32_t>(
          std::upper_bound(s.widened_first.begin(), s.widened_first.end(), r) - s.widened_first.begin() - 1);
      const auto j = static_cast<int32_t>(r - s.widened_first[seq]);
      const BlockId* table = p.block_tables + p.block_table_start[seq];
      const int64_t at = (int64_t{table[j / p.block_size]} * p.block_size + j % p.block_size) * kv_width;
      HalvesToFloats(k_cache + at, s.widened_k.data() + r * kv_width, kv_width);
      HalvesToFloats(v_cache + at, s.widened_v.data() + r * kv_width, kv_width);
    }
  });
}

// PagedAttention over a cache of elements T.
template <typename T>
absl::Status Attend(ThreadPool& pool, const AttentionParams& p, const T* k_cache, const T* v_cache,
                    AttentionScratch* scratch) {
  const int32_t group = p.num_heads / p.num_kv_heads;
  const int32_t tokens = p.query_start[p.num_seqs];
  const int32_t kv_width = p.num_kv_heads * p.head_dim;
  const int64_t dim = p.head_dim;
  AttentionScratch& s = *scratch;
  // Queries are the last tokens of their context: token t of sequence `seq`
  // sees keys [0, Context(t)).
  s.token_seq.resize(tokens);
  for (int32_t seq = 0; seq < p.num_seqs; ++seq) {
    std::fill(s.token_seq.begin() + p.query_start[seq], s.token_seq.begin() + p.query_start[seq + 1], seq);
  }
  auto context = [&](int32_t t) {
    const int32_t seq = s.token_seq[t];
    return p.seq_lens[seq] - p.query_start[seq + 1] + t + 1;
  };
  s.item_start.resize(tokens + 1);
  s.item_start[0] = 0;
  s.merged.clear();
  for (int32_t t = 0; t < tokens; ++t) {
    const int32_t spans = SpansOf(context(t));
    s.item_start[t + 1] = s.item_start[t] + spans;
    if (spans > 1) s.merged.push_back(t);
  }
  const int32_t items = s.item_start[tokens];
  if (!s.merged.empty() && s.sums.size() < static_cast<size_t>(items) * p.num_heads) {
    s.sums.resize(static_cast<size_t>(items) * p.num_heads);
    s.outs.resize(static_cast<size_t>(items) * p.num_heads * dim);
  }
  if constexpr (std::is_same_v<T, uint16_t>) {
    WidenPrefills(pool, p, k_cache, v_cache, &s);
  } else {
    s.widened_at.assign(p.num_seqs, -1);
  }
  s.scores.resize(pool.num_threads());
  s.ahead.resize(pool.num_threads());
  auto item_token = [&](int64_t item) {
    return static_cast<int32_t>(std::upper_bound(s.item_start.begin(), s.item_start.begin() + tokens + 1, item) -
                                s.item_start.begin() - 1);
  };
  // Whether token t is its sequence's only query.
  auto decode = [&](int32_t t) {
    const int32_t seq = s.token_seq[t];
    return p.query_start[seq + 1] - p.query_start[seq] == 1;
  };
  // The token of an item, its span and that span's rows.
  struct ItemRows {
    int32_t token, span, first, last;
    const BlockId* table;
  };
  auto item_rows = [&](int64_t item) {
    ItemRows r;
    r.token = item_token(item);
    r.span = static_cast<int32_t>(item) - s.item_start[r.token];
    r.first = r.span * kSpanRows;
    r.last = std::min(context(r.token), r.first + kSpanRows);
    r.table = p.block_tables + p.block_table_start[s.token_seq[r.token]];
    return r;
  };
  // Item (t, span): every head of token t over that span of its context,
  // KV head by KV head. Its heads' parts sit span by span, so a head's spans
  // are contiguous for the merge: part (item_start[t] * num_heads + head *
  // spans + span).
  pool.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int32_t thread) {
    std::vector<float>& scores = s.scores[thread];
    if (scores.size() < static_cast<size_t>(kSpanRows)) scores.resize(kSpanRows);
    RowPrefetcher& ahead = s.ahead[thread];
    for (int64_t item = begin; item < end; ++item) {
      const auto [t, span, first, last, table] = item_rows(item);
      const int32_t spans = SpansOf(context(t));
      const int64_t widened = s.widened_at[s.token_seq[t]];
      // The next item's rows, spread over this one's loops, when this thread
      // is likely to run it (the next unit of its own range: another
      // thread's would be fetched twice, by two cores) and it is a decode's
      // (a sequence with several queries reads a span's rows once per query,
      // from the cache after the first: there the visits only cost, 5% of a
      // 512-token prefill). A thread's first item goes without: asking for
      // its rows in one burst, before reading them, cost BM_Attention/1/128
      // 12% and /1/640 1-4% (three alternated rounds, 2026-12-05; until
      // that day GCC had deleted the burst, see prefetch.h).
      ahead.Clear();
      if (item + 1 < items && pool.OwnerOf(item + 1) == thread) {
        const ItemRows next = item_rows(item + 1);
        if (decode(next.token)) {
          ahead.Reset(k_cache, v_cache, next.table, p.block_size, kv_width * int64_t{sizeof(T)}, next.first,
                      next.last, int64_t{2} * p.num_heads * (last - first));
        }
      }
      for (int32_t head = 0; head < p.num_heads; ++head) {
        const int64_t head_offset = int64_t{head / group} * dim;
        const float* q = p.q + (int64_t{t} * p.num_heads + head) * dim;
        // The output normalized (one span), or the span's part for the merge.
        const int64_t part = int64_t{s.item_start[t]} * p.num_heads + int64_t{head} * spans + span;
        float* out = spans == 1 ? p.out + (int64_t{t} * p.num_heads + head) * dim : s.outs.data() + part * dim;
        SpanSums* sums = spans == 1 ? nullptr : &s.sums[part];
        if (widened >= 0) {
          const PagedRows rows{s.widened_k.data() + widened + head_offset, s.widened_v.data() + widened + head_offset,
                               s.identity.data(), p.block_size, kv_width};
          AttendSpan(q, rows, first, last, dim, p.scale, scores.data(), out, sums, &ahead);
        } else {
          const PagedRowsOf<T> rows{k_cache + head_offset, v_cache + head_offset, table, p.block_size, kv_width};
          AttendSpan(q, rows, first, last, dim, p.scale, scores.data(), out, sums, &ahead);
        }
      }
    }
  });
  if (s.merged.empty()) return absl::OkStatus();
  const int64_t merges = static_cast<int64_t>(s.merged.size()) * p.num_heads;
  pool.ParallelFor(merges, 8, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t m = begin; m < end; ++m) {
      const int32_t t = s.merged[m / p.num_heads];
      const auto head = static_cast<int32_t>(m % p.num_heads);
      const int32_t spans = SpansOf(context(t));
      const int64_t part = int64_t{s.item_start[t]} * p.num_heads + int64_t{head} * spans;
      MergeSpans(spans, &s.sums[part], s.outs.data() + part * dim, dim,
                 p.out + (int64_t{t} * p.num_heads + head) * dim);
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status PagedAttention(ThreadPool& pool, const AttentionParams& p, AttentionScratch* scratch) {
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError("heads do not divide into kv heads");
  }
  if (p.cache.type == KvType::kF32) {
    return Attend(pool, p, static_cast<const float*>(p.cache.k), static_cast<const float*>(p.cache.v), scratch);
  }
  if (p.head_dim > kMaxHalfRowDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", p.head_dim, " is over the ", kMaxHalfRowDim, " a half-float cache takes"));
  }
  return Attend(pool, p, static_cast<const uint16_t*>(p.cache.k), static_cast<const uint16_t*>(p.cache.v), scratch);
}

}  // namespace tandem::worker::cpu
