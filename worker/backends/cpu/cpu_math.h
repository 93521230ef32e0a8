// The inner loops of the CPU backend: dot products and scaled adds over
// float32 vectors (attention's keys and values also as half floats, widened
// as they are loaded). Each has an AVX2+FMA+F16C version, chosen once at
// startup when the CPU has it, and a portable one (the build itself targets
// plain x86-64).
//
// Thread-safe: pure functions.
#ifndef TANDEM_WORKER_BACKENDS_CPU_CPU_MATH_H_
#define TANDEM_WORKER_BACKENDS_CPU_CPU_MATH_H_

#include <cstdint>

#include "worker/backends/cpu/prefetch.h"

namespace tandem::worker::cpu {

// sum(a[i] * b[i])
float Dot(const float* a, const float* b, int64_t n);
// y[i] = y[i] * scale + a * x[i]
void ScaleAdd(float* y, float scale, float a, const float* x, int64_t n);
// x[i] = exp(x[i] - shift); returns the sum of the results. Relative error
// below 2e-7 for arguments in [-87, 0], which is all softmax needs.
float ExpShiftSum(float* x, float shift, int64_t n);
// x[i] = x[i] / (1 + exp(-x[i])) * y[i]  (SiLU gate times up projection)
void SiluMul(float* x, const float* y, int64_t n);
// dst[i] = the half float nearest src[i] (ties to even, as F16C's vcvtps2ph
// and gguf::FloatToHalf round).
void FloatsToHalves(const float* src, uint16_t* dst, int64_t n);
// dst[i] = the value of half float src[i] (exact).
void HalvesToFloats(const uint16_t* src, float* dst, int64_t n);
// Keys and values of one sequence in a paged cache of elements T (float, or
// uint16_t for IEEE half floats): row j of `k` (or `v`) is at
// ((table[j / block_size] * block_size + j % block_size) * stride).
template <typename T>
struct PagedRowsOf {
  const T* k;
  const T* v;
  const int32_t* table;
  int32_t block_size;
  int64_t stride;  // elements
};
using PagedRows = PagedRowsOf<float>;
using PagedHalfRows = PagedRowsOf<uint16_t>;
// The longest head AttendRow and AttendSpan take over half rows (they widen
// a row to floats on the stack where no vector loop reads it).
inline constexpr int64_t kMaxHalfRowDim = 512;
// Asks, a few cache lines at a time, for rows [first, last) of a paged key
// and value cache (whole rows: every KV head's part) to be brought in while
// other rows are being computed on. Asked for in one burst, scattered rows
// stall the core once its outstanding misses are at their limit, and the
// burst's time adds to the arithmetic's; spread over the current work's
// loads the two overlap (BM_Attention/1/640 took 20% less time and /16/640
// 16% less, A/B on the 2-core VM of the README's figures; with it off
// /16/640 takes 40% longer, 2026-12-05).
//
// Into L2 (prefetcht1), not L1: an item's rows (96 KiB for SmolLM2's 64 in
// float32, 48 KiB in half floats) are several times L1, so asked for into
// L1 they evicted the rows the current item was reading (prefetcht1 instead
// of t0: BM_Decode/16/640 19% less time and /1/640 8% less, medians of three
// alternated rounds; 128-token decodes, which have one item per thread,
// unchanged).
class alignas(64) RowPrefetcher {  // a cache line of its own: one per thread, written per row
 public:
  // Nothing to ask for.
  void Clear() { cur_ = end_ = nullptr, next_row_ = last_ = 0, second_ = nullptr; }
  // Whether any line is left to ask for.
  bool active() const { return cur_ < end_ || next_row_ < last_ || second_ != nullptr; }
  // Rows [first, last) of `k` and then `v` (`row_bytes` apart, placed as
  // PagedRowsOf places them), over about `visits` calls of Visit(1).
  void Reset(const void* k, const void* v, const int32_t* table, int32_t block_size, int64_t row_bytes,
             int32_t first, int32_t last, int64_t visits);
  // The next lines: `visits` times the share of one visit.
  void Visit(int32_t visits) {
    for (int64_t i = int64_t{visits} * lines_per_visit_; i > 0; --i) {
      const char* line = NextLine();
      if (line == nullptr) return;
      PrefetchT1(line);
    }
  }
  // The next line to ask for (its first byte), or null when none is left.
  const char* NextLine() {
    if (cur_ >= end_ && !NextRun()) return nullptr;
    const char* line = cur_;
    cur_ += 64;
    return line;
  }

 private:
  // Moves to the next run of rows contiguous in one block; false when done.
  bool NextRun();

  const char* cur_ = nullptr;  // next line of the current run
  const char* end_ = nullptr;
  const char* base_ = nullptr;    // the cache being walked
  const char* second_ = nullptr;  // the cache to walk next (v), or null
  const int32_t* table_ = nullptr;
  int32_t block_size_ = 1;
  int64_t row_bytes_ = 0;
  int32_t first_ = 0, next_row_ = 0, last_ = 0;
  int64_t lines_per_visit_ = 0;
};
// One query's attention over rows [0, n): out = softmax(q . k_j * scale) v_j.
// `scores` has room for n. The same arithmetic as Dot, ExpShiftSum and
// ScaleAdd (scale 1) one row at a time, so the result equals that loop bit for
// bit, with the output row kept in registers and no call per row. Over half
// rows: the same bits as over float rows holding the halves' values
// (dim <= kMaxHalfRowDim).
void AttendRow(const float* q, const PagedRows& rows, int32_t n, int64_t dim, float scale, float* scores,
               float* out);
void AttendRow(const float* q, const PagedHalfRows& rows, int32_t n, int64_t dim, float scale, float* scores,
               float* out);
// What MergeSpans needs of a span besides its output: the span's largest
// score and the sum of exp(score - max) over its rows.
struct SpanSums {
  float max;
  float sum;
};
// AttendRow over rows [begin, end) of a longer context. With `sums` null the
// output is normalized (AttendRow is the span [0, n)); otherwise it is left
// unnormalized, out = sum_j exp(s_j - max) v_j, and *sums says how to merge
// it with the context's other spans. `scores` has room for end - begin.
// `ahead`, when given, is visited once per key and value row read.
void AttendSpan(const float* q, const PagedRows& rows, int32_t begin, int32_t end, int64_t dim, float scale,
                float* scores, float* out, SpanSums* sums, RowPrefetcher* ahead = nullptr);
void AttendSpan(const float* q, const PagedHalfRows& rows, int32_t begin, int32_t end, int64_t dim, float scale,
                float* scores, float* out, SpanSums* sums, RowPrefetcher* ahead = nullptr);
// The attention over the union of `spans` spans from their unnormalized
// outputs (`outs`, span s at s * dim) and sums: each span's output weighted
// by exp(its max - the overall max), over the weighted sum of their sums.
void MergeSpans(int32_t spans, const SpanSums* sums, const float* outs, int64_t dim, float* out);
// Whether the AVX2 versions are in use.
bool UsingAvx2();
// Tests only: the portable versions from now on (true), or again what the
// CPU supports (false). Not for use while other threads call these.
void UsePortableForTesting(bool portable);

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_CPU_MATH_H_
