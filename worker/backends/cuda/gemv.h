// y = x W^T for the few rows of x a decode step has, with bf16 weights: one
// kernel reads each weight row once (a warp a row) and x in fp32, rounding
// each x value to bf16 as it goes, so the products are those of the cuBLAS
// path (x cast to bf16, bf16 x bf16 in fp32) without its cast kernel and
// without cuBLAS's small-m launches. A group of weights that share x (Q, K
// and V; gate and up) is one launch. At batch 1 the layer's seven GEMMs and
// four casts become four launches.
//
// Sums are fp32 in another order than cuBLAS's: within the bf16 bound of
// cuda_backend_test.cc's header, not bit-identical to the GEMM path.
//
// No CUDA header here: the stream is forward-declared.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_GEMV_H_
#define TANDEM_WORKER_BACKENDS_CUDA_GEMV_H_

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;

namespace tandem::worker {

// The most rows of x the kernel takes; larger m goes to cuBLAS.
inline constexpr int64_t kGemvMaxRows = 8;
inline constexpr int32_t kGemvMaxWeights = 3;

struct GemvOutput {
  const uint16_t* w;  // [rows, cols] bf16 bits
  int64_t rows;
  float* y;           // [m, rows]
};

struct GemvParams {
  const float* x;  // [m, cols]
  int64_t m;
  int64_t cols;
  int32_t count;  // 1..kGemvMaxWeights
  GemvOutput out[kGemvMaxWeights];
  bool accumulate;  // y += x W^T rather than y = x W^T
};

// Whether the kernel takes x and a weight of this shape: m in
// [1, kGemvMaxRows], cols a positive multiple of 8, x and w 16-byte aligned
// (a lane loads 8 bf16 and 8 floats at a time).
bool GemvApplies(const float* x, int64_t m, int64_t cols, const void* w);

// InvalidArgument when GemvApplies fails for x or a weight, or count is out
// of range.
absl::Status LaunchGemvBf16(const GemvParams& p, CUstream_st* stream);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_GEMV_H_
