#include "worker/backends/cpu/cpu_math.h"

#include <immintrin.h>

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

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t n) {
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

__attribute__((target("avx2,fma"))) void ScaleAddAvx2(float* y, float scale, float a, const float* x,
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

struct Dispatch {
  bool avx2;
  float (*dot)(const float*, const float*, int64_t);
  void (*scale_add)(float*, float, float, const float*, int64_t);
};

const Dispatch& Table() {
  static const Dispatch table = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return avx2 ? Dispatch{true, DotAvx2, ScaleAddAvx2} : Dispatch{false, DotPortable, ScaleAddPortable};
  }();
  return table;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return Table().dot(a, b, n); }
void ScaleAdd(float* y, float scale, float a, const float* x, int64_t n) { Table().scale_add(y, scale, a, x, n); }
bool UsingAvx2() { return Table().avx2; }

}  // namespace tandem::worker::cpu
