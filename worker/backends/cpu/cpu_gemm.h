// Gemm: y[m x n] = x[m x k] * w[n x k]^T (+ y), float32, row-major, over a
// thread pool. This is every matmul of the model: activations times weight
// rows. Written here rather than taken from a BLAS because a BLAS's runtime
// CPU detection can miss (Debian's OpenBLAS 0.3.21 falls back to its SSE3
// kernels on newer Xeons, 8x slower), and one tuned shape is all we need.
//
// Blocking: threads take blocks of 64 weight rows, small enough to stay in
// L2 while every activation row streams past them; the inner kernel computes
// a 3 x 4 tile of dot products in 12 AVX2 accumulators.
//
// Thread-compatible: one caller at a time per pool.
#ifndef TANDEM_WORKER_BACKENDS_CPU_CPU_GEMM_H_
#define TANDEM_WORKER_BACKENDS_CPU_CPU_GEMM_H_

#include <cstdint>

#include "worker/backends/cpu/thread_pool.h"

namespace tandem::worker::cpu {

void Gemm(ThreadPool& pool, const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y,
          bool accumulate);

// One thread's part: `rows` rows of w against every row of x, y[i * ldy + j].
// Each output is computed the same way whatever m is.
void GemmRows(const float* x, int64_t m, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy,
              bool accumulate);

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_CPU_GEMM_H_
