// How the backend's row-major y = x · Wᵀ is asked of cuBLAS, which is
// column-major. Host-only arithmetic, no CUDA header: cuda_backend_test.cc
// checks it on the CPU with a column-major reference GEMM.
//
// The backend stores, row-major,
//   x [m, cols]   (activations: m tokens of cols inputs),
//   W [rows, cols] (a weight: rows output features),
//   y [m, rows] = x · Wᵀ.
// A row-major [r, c] array with leading dimension c is, read column-major,
// the [c, r] matrix that is its transpose. So cuBLAS sees
//   W as col-major [cols, rows] = Wᵀ   (lda = cols),
//   x as col-major [cols, m]    = xᵀ   (ldb = cols),
//   y as col-major [rows, m]    = yᵀ   (ldc = rows),
// and yᵀ = (x · Wᵀ)ᵀ = W · xᵀ = op(A) · op(B) with A = W's array,
// op(A) = Aᵀ (transa = T: undoes the reading's transpose), B = x's array,
// op(B) = B (transb = N). In cuBLAS's names, C[M, N] = op(A)[M, K] · op(B)[K, N]
// with M = rows, N = m, K = cols.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_GEMM_SHAPE_H_
#define TANDEM_WORKER_BACKENDS_CUDA_GEMM_SHAPE_H_

#include <cstdint>

namespace tandem::worker {

// cublasGemmEx's shape arguments for y[m, rows] = x[m, cols] · W[rows, cols]ᵀ,
// with A = W and B = x.
struct GemmShape {
  bool transa = false;  // op(A) = Aᵀ
  bool transb = false;  // op(B) = Bᵀ
  int64_t m = 0;        // rows of op(A) and C
  int64_t n = 0;        // columns of op(B) and C
  int64_t k = 0;        // columns of op(A), rows of op(B)
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
};

inline GemmShape RowMajorXWtShape(int64_t m, int64_t rows, int64_t cols) {
  GemmShape g;
  g.transa = true;
  g.transb = false;
  g.m = rows;
  g.n = m;
  g.k = cols;
  g.lda = cols;
  g.ldb = cols;
  g.ldc = rows;
  return g;
}

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_GEMM_SHAPE_H_
