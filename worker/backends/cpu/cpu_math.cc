#include "worker/backends/cpu/cpu_math.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

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

__attribute__((target("avx2,fma"))) float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

__attribute__((target("avx2,fma"))) inline float DotAvx2(const float* a, const float* b, int64_t n) {
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
__attribute__((target("avx2,fma"), noinline)) void ScaleAddAvx2(float* y, float scale, float a, const float* x,
                                                        int64_t n) {
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
__attribute__((target("avx2,fma"))) __m256 Exp(__m256 x) {
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

__attribute__((target("avx2,fma"))) inline float ExpShiftSumAvx2(float* x, float shift, int64_t n) {
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

__attribute__((target("avx2,fma"))) void SiluMulAvx2(float* x, const float* y, int64_t n) {
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
inline const float* BlockBase(const PagedRows& rows, const float* cache, int32_t blk) {
  return cache + int64_t{rows.table[blk]} * rows.block_size * rows.stride;
}

void AttendRowPortable(const float* q, const PagedRows& rows, int32_t n, int64_t dim, float scale, float* scores,
                       float* out) {
  float max = -INFINITY;
  for (int32_t start = 0, blk = 0; start < n; start += rows.block_size, ++blk) {
    const float* key = BlockBase(rows, rows.k, blk);
    for (int32_t j = start; j < std::min(n, start + rows.block_size); ++j, key += rows.stride) {
      scores[j] = DotPortable(q, key, dim) * scale;
      max = std::max(max, scores[j]);
    }
  }
  const float inv_sum = 1.0f / ExpShiftSumPortable(scores, max, n);
  std::fill(out, out + dim, 0.0f);
  for (int32_t start = 0, blk = 0; start < n; start += rows.block_size, ++blk) {
    const float* value = BlockBase(rows, rows.v, blk);
    for (int32_t j = start; j < std::min(n, start + rows.block_size); ++j, value += rows.stride) {
      ScaleAddPortable(out, 1.0f, scores[j] * inv_sum, value, dim);
    }
  }
}

// out = sum_j (weights[j] * inv_sum) v_j over kVectors * 8 floats held in
// registers (y * 1 + a x is y + a x exactly: ScaleAddAvx2 with scale 1).
template <int kVectors>
__attribute__((target("avx2,fma"))) void AccumulateRowsAvx2(const PagedRows& rows, int32_t n, const float* weights,
                                                             float inv_sum, float* out) {
  __m256 acc[kVectors];
  for (int i = 0; i < kVectors; ++i) acc[i] = _mm256_setzero_ps();
  for (int32_t start = 0, blk = 0; start < n; start += rows.block_size, ++blk) {
    const float* value = BlockBase(rows, rows.v, blk);
    for (int32_t j = start; j < std::min(n, start + rows.block_size); ++j, value += rows.stride) {
      const __m256 a = _mm256_set1_ps(weights[j] * inv_sum);
      for (int i = 0; i < kVectors; ++i) acc[i] = _mm256_fmadd_ps(a, _mm256_loadu_ps(value + 8 * i), acc[i]);
    }
  }
  for (int i = 0; i < kVectors; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

__attribute__((target("avx2,fma"))) void AttendRowAvx2(const float* q, const PagedRows& rows, int32_t n,
                                                         int64_t dim, float scale, float* scores, float* out) {
  float max = -INFINITY;
  for (int32_t start = 0, blk = 0; start < n; start += rows.block_size, ++blk) {
    const float* key = BlockBase(rows, rows.k, blk);
    for (int32_t j = start; j < std::min(n, start + rows.block_size); ++j, key += rows.stride) {
      scores[j] = DotAvx2(q, key, dim) * scale;
      max = std::max(max, scores[j]);
    }
  }
  const float inv_sum = 1.0f / ExpShiftSumAvx2(scores, max, n);
  if (dim == 64) return AccumulateRowsAvx2<8>(rows, n, scores, inv_sum, out);
  if (dim == 128) return AccumulateRowsAvx2<16>(rows, n, scores, inv_sum, out);
  std::fill(out, out + dim, 0.0f);
  for (int32_t start = 0, blk = 0; start < n; start += rows.block_size, ++blk) {
    const float* value = BlockBase(rows, rows.v, blk);
    for (int32_t j = start; j < std::min(n, start + rows.block_size); ++j, value += rows.stride) {
      ScaleAddAvx2(out, 1.0f, scores[j] * inv_sum, value, dim);
    }
  }
}

struct Dispatch {
  bool avx2;
  float (*dot)(const float*, const float*, int64_t);
  void (*scale_add)(float*, float, float, const float*, int64_t);
  float (*exp_shift_sum)(float*, float, int64_t);
  void (*silu_mul)(float*, const float*, int64_t);
  void (*attend_row)(const float*, const PagedRows&, int32_t, int64_t, float, float*, float*);
};

const Dispatch& Table() {
  static const Dispatch table = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return avx2 ? Dispatch{true, DotAvx2, ScaleAddAvx2, ExpShiftSumAvx2, SiluMulAvx2, AttendRowAvx2}
                : Dispatch{false, DotPortable, ScaleAddPortable, ExpShiftSumPortable, SiluMulPortable,
                           AttendRowPortable};
  }();
  return table;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return Table().dot(a, b, n); }
void ScaleAdd(float* y, float scale, float a, const float* x, int64_t n) { Table().scale_add(y, scale, a, x, n); }
float ExpShiftSum(float* x, float shift, int64_t n) { return Table().exp_shift_sum(x, shift, n); }
void SiluMul(float* x, const float* y, int64_t n) { Table().silu_mul(x, y, n); }
void AttendRow(const float* q, const PagedRows& rows, int32_t n, int64_t dim, float scale, float* scores,
               float* out) {
  Table().attend_row(q, rows, n, dim, scale, scores, out);
}
bool UsingAvx2() { return Table().avx2; }

}  // namespace tandem::worker::cpu
