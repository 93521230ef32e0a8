#include "worker/backends/cpu/cpu_gemm.h"

#include <immintrin.h>

#include <algorithm>

#include "worker/backends/cpu/cpu_math.h"

namespace tandem::worker::cpu {
namespace {

constexpr int64_t kRowBlock = 64;  // weight rows per task

__attribute__((target("avx2,fma"))) inline float Sum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// y[i][j] (+)= dot(x_i, w_j) for an MR x NR tile.
template <int MR, int NR>
__attribute__((target("avx2,fma"))) void Tile(const float* x, int64_t k, const float* w, float* y, int64_t ldy,
                                               bool accumulate) {
  // Fully unrolled so that the 12 accumulators live in registers.
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 xv[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * k + p);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = _mm256_loadu_ps(w + j * k + p);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = Sum(acc[i][j]);
      for (int64_t q = p; q < k; ++q) s += x[i * k + q] * w[j * k + q];
      float& out = y[i * ldy + j];
      out = accumulate ? out + s : s;
    }
  }
}

template <int MR>
__attribute__((target("avx2,fma"))) void RowTiles(const float* x, int64_t k, const float* w, int64_t rows,
                                                   float* y, int64_t ldy, bool accumulate) {
  int64_t j = 0;
  for (; j + 4 <= rows; j += 4) Tile<MR, 4>(x, k, w + j * k, y + j, ldy, accumulate);
  for (; j < rows; ++j) Tile<MR, 1>(x, k, w + j * k, y + j, ldy, accumulate);
}

// `rows` rows of w against every row of x; y's rows are `ldy` apart.
__attribute__((target("avx2,fma"))) void RowsAvx2(const float* x, int64_t m, const float* w, int64_t rows,
                                                   int64_t k, float* y, int64_t ldy, bool accumulate) {
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) RowTiles<3>(x + i * k, k, w, rows, y + i * ldy, ldy, accumulate);
  if (m - i == 2) RowTiles<2>(x + i * k, k, w, rows, y + i * ldy, ldy, accumulate);
  if (m - i == 1) RowTiles<1>(x + i * k, k, w, rows, y + i * ldy, ldy, accumulate);
}

void RowsPortable(const float* x, int64_t m, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy,
                  bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      const float s = Dot(x + i * k, w + j * k, k);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + s : s;
    }
  }
}

}  // namespace

void GemmRows(const float* x, int64_t m, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy,
              bool accumulate) {
  if (UsingAvx2()) {
    RowsAvx2(x, m, w, rows, k, y, ldy, accumulate);
  } else {
    RowsPortable(x, m, w, rows, k, y, ldy, accumulate);
  }
}

void Gemm(ThreadPool& pool, const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y,
          bool accumulate) {
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  pool.ParallelFor(blocks, 1, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t w_begin = b * kRowBlock;
      const int64_t w_end = std::min(n, w_begin + kRowBlock);
      GemmRows(x, m, w + w_begin * k, w_end - w_begin, k, y + w_begin, n, accumulate);
    }
  });
}

}  // namespace tandem::worker::cpu
