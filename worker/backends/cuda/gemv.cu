// Kernel of gemv.h.
#include "worker/backends/cuda/gemv.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 8;  // per CTA; a warp computes one output row
constexpr int kVec = 8;    // bf16 weights (and x floats) a lane takes at a time
constexpr int kBatch = 4;  // weight loads a lane has in flight

struct GemvArgs {
  const float* x;
  int64_t m;
  int64_t cols;
  int32_t count;
  const uint16_t* w[kGemvMaxWeights];
  int64_t rows[kGemvMaxWeights];
  float* y[kGemvMaxWeights];
  bool accumulate;
};

// x rounded to bf16 as the cuBLAS path's cast rounds it (to nearest even).
__device__ float RoundToBf16(float v) { return portable::Bf16ToFloat(portable::FloatToBf16(v)); }

// M: the rows of x the kernel is instantiated for (a.m <= M).
template <int M>
__global__ void __launch_bounds__(kWarps* kWarpSize) GemvBf16Kernel(GemvArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  int wi = 0;
  while (wi < a.count && row >= a.rows[wi]) row -= a.rows[wi++];
  if (wi >= a.count) return;  // past the last weight's rows
  const uint16_t* w = a.w[wi] + row * a.cols;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  // kBatch of the lane's 16-byte weight loads are issued before any is used:
  // a row is only 2 to 6 such loads a lane (576 to 1536 columns), and one
  // at a time the warp would wait a memory latency for each.
  constexpr int64_t kStride = kWarpSize * kVec;
  for (int64_t c0 = int64_t{lane} * kVec; c0 < a.cols; c0 += kBatch * kStride) {
    uint4 packed[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = c0 + u * kStride;
      if (c < a.cols) packed[u] = __ldg(reinterpret_cast<const uint4*>(w + c));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = c0 + u * kStride;
      if (c >= a.cols) break;
      // Each 32-bit word holds two bf16: the lower half is the earlier column.
      const uint32_t words[4] = {packed[u].x, packed[u].y, packed[u].z, packed[u].w};
      float wf[kVec];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wf[2 * k] = __uint_as_float(words[k] << 16);
        wf[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (i >= a.m) break;
        const float4 x0 = *reinterpret_cast<const float4*>(a.x + i * a.cols + c);
        const float4 x1 = *reinterpret_cast<const float4*>(a.x + i * a.cols + c + 4);
        const float xs[kVec] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[i] = fmaf(RoundToBf16(xs[k]), wf[k], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], offset);
  }
  if (lane != 0) return;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (i >= a.m) break;
    float* y = a.y[wi] + i * a.rows[wi] + row;
    *y = a.accumulate ? *y + acc[i] : acc[i];
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvApplies(const float* x, int64_t m, int64_t cols, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && cols > 0 && cols % kVec == 0 && Aligned16(x) && Aligned16(w);
}

absl::Status LaunchGemvBf16(const GemvParams& p, CUstream_st* stream) {
  if (p.count < 1 || p.count > kGemvMaxWeights) {
    return absl::InvalidArgumentError(absl::StrCat("cuda gemv: ", p.count, " weights (1 to ", kGemvMaxWeights, ")"));
  }
  GemvArgs a{p.x, p.m, p.cols, p.count, {}, {}, {}, p.accumulate};
  int64_t total_rows = 0;
  for (int32_t i = 0; i < p.count; ++i) {
    if (!GemvApplies(p.x, p.m, p.cols, p.out[i].w) || p.out[i].rows <= 0 || p.out[i].y == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cuda gemv: m ", p.m, ", cols ", p.cols, ", rows ",
                                                     p.out[i].rows, " or the alignment of x or w"));
    }
    a.w[i] = p.out[i].w;
    a.rows[i] = p.out[i].rows;
    a.y[i] = p.out[i].y;
    total_rows += p.out[i].rows;
  }
  const unsigned blocks = static_cast<unsigned>((total_rows + kWarps - 1) / kWarps);
  const dim3 threads(kWarps * kWarpSize);
  if (p.m == 1) {
    GemvBf16Kernel<1><<<blocks, threads, 0, stream>>>(a);
  } else if (p.m == 2) {
    GemvBf16Kernel<2><<<blocks, threads, 0, stream>>>(a);
  } else if (p.m <= 4) {
    GemvBf16Kernel<4><<<blocks, threads, 0, stream>>>(a);
  } else {
    GemvBf16Kernel<8><<<blocks, threads, 0, stream>>>(a);
  }
  return LaunchStatus("GemvBf16Kernel");
}

}  // namespace tandem::worker
