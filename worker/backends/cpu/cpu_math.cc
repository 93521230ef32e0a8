#include "worker/backends/cpu/cpu_math.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "common/gguf/ggml_types.h"

namespace tandem::worker::cpu {
namespace {

float DotPortable(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void ScaleAddPortable(float* y, float scale, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * scale + a * x[i];
}

__attribute__((target("avx2,fma,f16c"))) float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

__attribute__((target("avx2,fma,f16c"))) inline float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Not inlined: with scale known to be 1 the compiler would fold y * 1 and
// contract the scalar tail differently from a call (AttendRow must equal it).
__attribute__((target("avx2,fma,f16c"), noinline)) void ScaleAddAvx2(float* y, float scale, float a,
                                                              const float* x, int64_t n) {
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 vy = _mm256_mul_ps(_mm256_loadu_ps(y + i), vs);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), vy));
  }
  for (; i < n; ++i) y[i] = y[i] * scale + a * x[i];
}

float ExpShiftSumPortable(float* x, float shift, int64_t n) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

void SiluMulPortable(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i])) * y[i];
}

// exp(x) as 2^k * e^r with r in [-ln2/2, ln2/2] and a degree-6 polynomial
// for e^r (Cephes' expf coefficients).
__attribute__((target("avx2,fma,f16c"))) __m256 Exp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - k ln2, with ln2 split in two for precision.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma,f16c"))) inline float ExpShiftSumAvx2(float* x, float shift, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = HorizontalSum(acc);
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

__attribute__((target("avx2,fma,f16c"))) void SiluMulAvx2(float* x, const float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(x + i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(x + i, _mm256_mul_ps(silu, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i])) * y[i];
}

// The loops below visit rows a block at a time (no division per row):
// block `blk` holds rows [blk * block_size, ...) at BlockBase.
template <typename T>
inline const T* BlockBase(const PagedRowsOf<T>& rows, const T* cache, int32_t blk) {
  return cache + int64_t{rows.table[blk]} * rows.block_size * rows.stride;
}

// Row j of `cache`; j is in block `blk`.
template <typename T>
inline const T* RowIn(const PagedRowsOf<T>& rows, const T* cache, int32_t blk, int32_t j) {
  return BlockBase(rows, cache, blk) + int64_t{j - blk * rows.block_size} * rows.stride;
}

void HalvesToFloatsPortable(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = gguf::HalfToFloat(src[i]);
}

// Row `row` as floats: itself, or widened into `buf` (room for dim).
inline const float* AsFloats(const float* row, int64_t /*dim*/, float* /*buf*/) { return row; }
inline const float* AsFloats(const uint16_t* row, int64_t dim, float* buf) {
  HalvesToFloatsPortable(row, buf, dim);
  return buf;
}

// Rows [begin, end): blocks begin / block_size on, the first one entered at
// begin's offset. The loops below share this shape (written out in each: a
// lambda would not inherit the AVX2 target).
template <typename T>
void AttendSpanPortable(const float* q, const PagedRowsOf<T>& rows, int32_t begin, int32_t end, int64_t dim,
                        float scale, float* scores, float* out, SpanSums* sums, RowPrefetcher* /*ahead*/) {
  float buf[std::is_same_v<T, float> ? 1 : kMaxHalfRowDim];  // a half row, widened
  float max = -INFINITY;
  for (int32_t blk = begin / rows.block_size, j = begin; j < end; ++blk) {
    const T* key = RowIn(rows, rows.k, blk, j);
    for (const int32_t stop = std::min(end, (blk + 1) * rows.block_size); j < stop; ++j, key += rows.stride) {
      scores[j - begin] = DotPortable(q, AsFloats(key, dim, buf), dim) * scale;
      max = std::max(max, scores[j - begin]);
    }
  }
  const float sum = ExpShiftSumPortable(scores, max, end - begin);
  const float inv_sum = sums == nullptr ? 1.0f / sum : 1.0f;
  if (sums != nullptr) *sums = {max, sum};
  std::fill(out, out + dim, 0.0f);
  for (int32_t blk = begin / rows.block_size, j = begin; j < end; ++blk) {
    const T* value = RowIn(rows, rows.v, blk, j);
    for (const int32_t stop = std::min(end, (blk + 1) * rows.block_size); j < stop; ++j, value += rows.stride) {
      ScaleAddPortable(out, 1.0f, scores[j - begin] * inv_sum, AsFloats(value, dim, buf), dim);
    }
  }
}

// Eight consecutive elements as floats.
__attribute__((target("avx2,fma,f16c"))) inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma,f16c"))) inline __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// q . row r for the eight rows at `rows` + r * stride (dim a multiple of 8):
// one accumulator per row, reduced together (three rounds of pairwise adds)
// instead of a horizontal sum per row.
template <typename T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 Dot8Avx2(const float* q, const T* rows, int64_t stride,
                                                                 int64_t dim) {
  // Unrolled so that the accumulators live in registers (-O2 keeps such a
  // loop and its array in memory: a store-to-load round trip per FMA).
  __m256 acc[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 x = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(x, Load8(rows + r * stride + i), acc[r]);
  }
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7].
  const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]);
  const __m256 h23 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]);
  const __m256 h67 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23);  // rows 0-3: low half's lanes 0-3 + high half's
  const __m256 h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

__attribute__((target("avx2,fma,f16c"))) inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// out = sum_j (weights[j - begin] * inv_sum) v_j over kVectors * 8 floats
// held in registers (y * 1 + a x is y + a x exactly: ScaleAddAvx2 with
// scale 1).
template <int kVectors, bool kAhead, typename T>
__attribute__((target("avx2,fma,f16c"))) void AccumulateRowsAvx2(const PagedRowsOf<T>& rows, int32_t begin,
                                                                  int32_t end, const float* weights, float inv_sum,
                                                                  float* out, RowPrefetcher& ahead) {
  // Unrolled: see Dot8Avx2.
  __m256 acc[kVectors];
#pragma GCC unroll 16
  for (int i = 0; i < kVectors; ++i) acc[i] = _mm256_setzero_ps();
  for (int32_t blk = begin / rows.block_size, j = begin; j < end; ++blk) {
    const T* value = RowIn(rows, rows.v, blk, j);
    for (const int32_t stop = std::min(end, (blk + 1) * rows.block_size); j < stop; ++j, value += rows.stride) {
      if constexpr (kAhead) ahead.Visit(1);
      const __m256 a = _mm256_set1_ps(weights[j - begin] * inv_sum);
#pragma GCC unroll 16
      for (int i = 0; i < kVectors; ++i) acc[i] = _mm256_fmadd_ps(a, Load8(value + 8 * i), acc[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kVectors; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// With kAhead, `ahead` is visited per row; without, it is not touched (the
// visits cost a short span's loops about a tenth of their time).
template <bool kAhead, typename T>
__attribute__((target("avx2,fma,f16c"))) void AttendSpanAvx2(const float* q, const PagedRowsOf<T>& rows,
                                                              int32_t begin, int32_t end, int64_t dim, float scale,
                                                              float* scores, float* out, SpanSums* sums,
                                                              RowPrefetcher& ahead) {
  float buf[std::is_same_v<T, float> ? 1 : kMaxHalfRowDim];  // rows outside the vector loops, widened
  float max = -INFINITY;
  __m256 max8 = _mm256_set1_ps(-INFINITY);
  const __m256 scale8 = _mm256_set1_ps(scale);
  for (int32_t blk = begin / rows.block_size, j = begin; j < end; ++blk) {
    const T* key = RowIn(rows, rows.k, blk, j);
    for (const int32_t stop = std::min(end, (blk + 1) * rows.block_size); j < stop;) {
      // Eight rows at a time where eight aligned ones remain in the block:
      // which rows go together depends on positions only, so a query's
      // scores do not depend on the batch.
      if (dim % 8 == 0 && (j - blk * rows.block_size) % 8 == 0 && j + 8 <= stop) {
        if constexpr (kAhead) ahead.Visit(8);
        const __m256 s8 = _mm256_mul_ps(Dot8Avx2(q, key, rows.stride, dim), scale8);
        _mm256_storeu_ps(scores + (j - begin), s8);
        max8 = _mm256_max_ps(max8, s8);
        j += 8;
        key += 8 * rows.stride;
        continue;
      }
      if constexpr (kAhead) ahead.Visit(1);
      scores[j - begin] = DotAvx2(q, AsFloats(key, dim, buf), dim) * scale;
      max = std::max(max, scores[j - begin]);
      ++j;
      key += rows.stride;
    }
  }
  max = std::max(max, HorizontalMax(max8));
  const float sum = ExpShiftSumAvx2(scores, max, end - begin);
  const float inv_sum = sums == nullptr ? 1.0f / sum : 1.0f;
  if (sums != nullptr) *sums = {max, sum};
  if (dim == 64) return AccumulateRowsAvx2<8, kAhead>(rows, begin, end, scores, inv_sum, out, ahead);
  if (dim == 128) return AccumulateRowsAvx2<16, kAhead>(rows, begin, end, scores, inv_sum, out, ahead);
  std::fill(out, out + dim, 0.0f);
  for (int32_t blk = begin / rows.block_size, j = begin; j < end; ++blk) {
    const T* value = RowIn(rows, rows.v, blk, j);
    for (const int32_t stop = std::min(end, (blk + 1) * rows.block_size); j < stop; ++j, value += rows.stride) {
      if constexpr (kAhead) ahead.Visit(1);
      ScaleAddAvx2(out, 1.0f, scores[j - begin] * inv_sum, AsFloats(value, dim, buf), dim);
    }
  }
}

template <typename T>
void AttendSpanAvx2(const float* q, const PagedRowsOf<T>& rows, int32_t begin, int32_t end, int64_t dim,
                    float scale, float* scores, float* out, SpanSums* sums, RowPrefetcher* ahead) {
  if (ahead != nullptr && ahead->active()) {
    return AttendSpanAvx2<true>(q, rows, begin, end, dim, scale, scores, out, sums, *ahead);
  }
  RowPrefetcher none;
  AttendSpanAvx2<false>(q, rows, begin, end, dim, scale, scores, out, sums, none);
}

void FloatsToHalvesPortable(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = gguf::FloatToHalf(src[i]);
}

__attribute__((target("avx2,fma,f16c"))) void FloatsToHalvesAvx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  FloatsToHalvesPortable(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void HalvesToFloatsAvx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  HalvesToFloatsPortable(src + i, dst + i, n - i);
}

template <typename T>
using AttendSpanFn = void (*)(const float*, const PagedRowsOf<T>&, int32_t, int32_t, int64_t, float, float*, float*,
                              SpanSums*, RowPrefetcher*);

struct Dispatch {
  bool avx2;
  float (*dot)(const float*, const float*, int64_t);
  void (*scale_add)(float*, float, float, const float*, int64_t);
  float (*exp_shift_sum)(float*, float, int64_t);
  void (*silu_mul)(float*, const float*, int64_t);
  void (*floats_to_halves)(const float*, uint16_t*, int64_t);
  void (*halves_to_floats)(const uint16_t*, float*, int64_t);
  AttendSpanFn<float> attend_span;
  AttendSpanFn<uint16_t> attend_span_half;
};

constexpr Dispatch kAvx2{true,          DotAvx2,
                         ScaleAddAvx2,  ExpShiftSumAvx2,
                         SiluMulAvx2,   FloatsToHalvesAvx2,
                         HalvesToFloatsAvx2, AttendSpanAvx2<float>,
                         AttendSpanAvx2<uint16_t>};
constexpr Dispatch kPortable{false,
                             DotPortable,
                             ScaleAddPortable,
                             ExpShiftSumPortable,
                             SiluMulPortable,
                             FloatsToHalvesPortable,
                             HalvesToFloatsPortable,
                             AttendSpanPortable<float>,
                             AttendSpanPortable<uint16_t>};

// What the CPU supports, unless a test chose the portable versions.
std::atomic<const Dispatch*> g_table{nullptr};

const Dispatch& Detected() {
  static const Dispatch* const table = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")
               ? &kAvx2 : &kPortable;
  }();
  return *table;
}

const Dispatch& Table() {
  const Dispatch* chosen = g_table.load(std::memory_order_relaxed);
  return chosen != nullptr ? *chosen : Detected();
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return Table().dot(a, b, n); }
void ScaleAdd(float* y, float scale, float a, const float* x, int64_t n) { Table().scale_add(y, scale, a, x, n); }
float ExpShiftSum(float* x, float shift, int64_t n) { return Table().exp_shift_sum(x, shift, n); }
void SiluMul(float* x, const float* y, int64_t n) { Table().silu_mul(x, y, n); }
void FloatsToHalves(const float* src, uint16_t* dst, int64_t n) { Table().floats_to_halves(src, dst, n); }
void HalvesToFloats(const uint16_t* src, float* dst, int64_t n) { Table().halves_to_floats(src, dst, n); }
void AttendRow(const float* q, const PagedRows& rows, int32_t n, int64_t dim, float scale, float* scores,
               float* out) {
  Table().attend_span(q, rows, 0, n, dim, scale, scores, out, nullptr, nullptr);
}
void AttendRow(const float* q, const PagedHalfRows& rows, int32_t n, int64_t dim, float scale, float* scores,
               float* out) {
  Table().attend_span_half(q, rows, 0, n, dim, scale, scores, out, nullptr, nullptr);
}
void AttendSpan(const float* q, const PagedRows& rows, int32_t begin, int32_t end, int64_t dim, float scale,
                float* scores, float* out, SpanSums* sums, RowPrefetcher* ahead) {
  Table().attend_span(q, rows, begin, end, dim, scale, scores, out, sums, ahead);
}
void AttendSpan(const float* q, const PagedHalfRows& rows, int32_t begin, int32_t end, int64_t dim, float scale,
                float* scores, float* out, SpanSums* sums, RowPrefetcher* ahead) {
  Table().attend_span_half(q, rows, begin, end, dim, scale, scores, out, sums, ahead);
}
void RowPrefetcher::Reset(const void* k, const void* v, const int32_t* table, int32_t block_size, int64_t row_bytes,
                          int32_t first, int32_t last, int64_t visits) {
  base_ = static_cast<const char*>(k);
  second_ = static_cast<const char*>(v);
  table_ = table;
  block_size_ = block_size;
  row_bytes_ = row_bytes;
  first_ = next_row_ = first;
  last_ = last;
  cur_ = end_ = nullptr;
  const int64_t lines = 2 * int64_t{last - first} * ((row_bytes_ + 63) / 64);
  lines_per_visit_ = visits > 0 ? (lines + visits - 1) / visits : lines;
}
bool RowPrefetcher::NextRun() {
  if (next_row_ >= last_) {
    if (second_ == nullptr) return false;
    base_ = second_;
    second_ = nullptr;
    next_row_ = first_;
    if (next_row_ >= last_) return false;
  }
  const int32_t blk = next_row_ / block_size_;
  const int32_t stop = std::min(last_, (blk + 1) * block_size_);
  cur_ = base_ + (int64_t{table_[blk]} * block_size_ + next_row_ % block_size_) * row_bytes_;
  end_ = cur_ + int64_t{stop - next_row_} * row_bytes_;
  next_row_ = stop;
  return true;
}
void MergeSpans(int32_t spans, const SpanSums* sums, const float* outs, int64_t dim, float* out) {
  float max = -INFINITY;
  for (int32_t s = 0; s < spans; ++s) max = std::max(max, sums[s].max);
  float total = 0.0f;
  for (int32_t s = 0; s < spans; ++s) total += std::exp(sums[s].max - max) * sums[s].sum;
  const float inv_total = 1.0f / total;
  std::fill(out, out + dim, 0.0f);
  for (int32_t s = 0; s < spans; ++s) {
    ScaleAdd(out, 1.0f, std::exp(sums[s].max - max) * inv_total, outs + s * dim, dim);
  }
}
bool UsingAvx2() { return Table().avx2; }
void UsePortableForTesting(bool portable) {
  g_table.store(portable ? &kPortable : nullptr, std::memory_order_relaxed);
}

}  // namespace tandem::worker::cpu
