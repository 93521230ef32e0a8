// Kernels of elementwise.h. Each launcher checks its sizes on the host, skips
// the launch when there is nothing to do, and returns the launch's error.
// Index arithmetic is in int64_t wherever a product of sizes can pass 2^31.
#include "worker/backends/cuda/elementwise.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/portable/quant.h"
#include "worker/backends/portable/rope.h"

namespace tandem::worker {
namespace {

// Threads per CTA of every kernel here (a multiple of the warp size, which
// BlockSum requires).
constexpr int kThreads = 256;
// CTAs of a grid-stride loop: enough to fill an H200 (132 SMs x 2048
// threads) several times over; larger sizes loop.
constexpr int64_t kMaxGridStrideBlocks = 4096;
constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
// Rotary pairs a head may have (rope_dim 512; the table is 1 KiB of kernel
// parameters, within the 4 KiB every architecture accepts).
constexpr int32_t kMaxRopePairs = 256;

unsigned GridStrideBlocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGridStrideBlocks));
}

absl::Status Invalid(const char* kernel, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("cuda ", kernel, ": ", why));
}

// Sum of `v` over the CTA, returned to every thread. REQUIRES: blockDim.x is
// a multiple of 32 and at most 1024; called by every thread of the CTA, once
// per kernel (the shared array is not reused).
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void EmbeddingKernel(const void* table, bool bf16, int64_t rows, int64_t dim, const TokenId* ids,
                                float* out) {
  const int64_t t = blockIdx.x;
  const TokenId id = ids[t];
  const bool valid = id >= 0 && id < rows;
  const int64_t base = valid ? int64_t{id} * dim : 0;
  float* dst = out + t * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float v = 0.0f;
    if (valid) {
      v = bf16 ? portable::Bf16ToFloat(static_cast<const uint16_t*>(table)[base + c])
               : static_cast<const float*>(table)[base + c];
    }
    dst[c] = v;
  }
}

// In place is safe: every thread reads its elements for the sum before the
// barrier inside BlockSum, and afterwards writes only the elements it reads.
__global__ void RmsNormKernel(const float* x, const float* weight, float* out, int64_t dim, float eps) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* dst = out + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) sum += row[c] * row[c];
  sum = BlockSum(sum);
  const float scale = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = row[c] * scale * weight[c];
}

// inv_freq of every rotary pair, computed on the host (portable/rope.h says
// why) and passed by value with the launch: no upload, no device memory.
struct RopeInvFreqTable {
  float inv_freq[kMaxRopePairs];
};

// Rotates token t's heads of q and then k in place: the CTA's threads take
// the (head, pair) items.
__device__ void RotateToken(int64_t t, float* q, float* k, const int32_t* positions, int32_t num_heads,
                            int32_t num_kv_heads, int32_t head_dim, int32_t pairs, float freq_scale,
                            const RopeInvFreqTable& table) {
  const int32_t items = (num_heads + num_kv_heads) * pairs;
  if (items == 0) return;  // nothing rotates: positions may be null
  const int32_t position = positions[t];
  for (int32_t item = threadIdx.x; item < items; item += blockDim.x) {
    const int32_t h = item / pairs;
    const int32_t i = item % pairs;
    float* head = h < num_heads ? q + (t * num_heads + h) * head_dim
                                : k + (t * num_kv_heads + (h - num_heads)) * head_dim;
    float c, s;
    portable::RopeCosSin(position, freq_scale, table.inv_freq[i], &c, &s);
    portable::RopeRotatePair(head + 2 * i, head + 2 * i + 1, c, s);
  }
}

// Copies token t's rows of k and v into the cache at its slot (none when
// the slot is negative), the CTA's threads taking the columns.
__device__ void WriteTokenKv(int64_t t, float* cache_k, float* cache_v, const float* k, const float* v,
                             const int64_t* slots, int32_t kv_width) {
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int32_t c = threadIdx.x; c < kv_width; c += blockDim.x) {
    cache_k[slot * kv_width + c] = k[t * kv_width + c];
    cache_v[slot * kv_width + c] = v[t * kv_width + c];
  }
}

// One CTA per token.
__global__ void RopeKernel(float* q, float* k, const int32_t* positions, int32_t num_heads, int32_t num_kv_heads,
                           int32_t head_dim, int32_t pairs, float freq_scale, RopeInvFreqTable table) {
  RotateToken(blockIdx.x, q, k, positions, num_heads, num_kv_heads, head_dim, pairs, freq_scale, table);
}

__global__ void WriteKvKernel(float* cache_k, float* cache_v, const float* k, const float* v, const int64_t* slots,
                              int32_t kv_width) {
  WriteTokenKv(blockIdx.x, cache_k, cache_v, k, v, slots, kv_width);
}

// Both, one CTA per token: the token's k row is rotated by its CTA, so a
// barrier is all that stands between rotating it and copying it (one launch
// and one pass over k a layer, where the two kernels make two of each).
__global__ void RopeWriteKvKernel(float* q, float* k, const float* v, const int32_t* positions,
                                  const int64_t* slots, float* cache_k, float* cache_v, int32_t num_heads,
                                  int32_t num_kv_heads, int32_t head_dim, int32_t pairs, float freq_scale,
                                  RopeInvFreqTable table) {
  const int64_t t = blockIdx.x;
  RotateToken(t, q, k, positions, num_heads, num_kv_heads, head_dim, pairs, freq_scale, table);
  __syncthreads();
  WriteTokenKv(t, cache_k, cache_v, k, v, slots, num_kv_heads * head_dim);
}

__global__ void SiluMulKernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void GatherRowsKernel(const float* x, const int32_t* rows, int64_t dim, float* out) {
  const int64_t i = blockIdx.x;
  const float* src = x + int64_t{rows[i]} * dim;
  float* dst = out + i * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = src[c];
}

__global__ void CopyTokensKernel(TokenId* dst, const int32_t* dst_index, const TokenId* src, const int32_t* src_index,
                                 int32_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    dst[dst_index != nullptr ? dst_index[i] : i] = src[src_index != nullptr ? src_index[i] : i];
  }
}

__global__ void DequantizeKernel(uint32_t type, const uint8_t* raw, int64_t n, void* out, bool to_bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = portable::DecodeElement(type, raw, i);
    if (to_bf16) {
      static_cast<uint16_t*>(out)[i] = portable::FloatToBf16(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

__global__ void CastToBf16Kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = portable::FloatToBf16(x[i]);
  }
}

}  // namespace

absl::Status LaunchEmbedding(const EmbeddingParams& p, CUstream_st* stream) {
  if (p.num_tokens < 0) return Invalid("embedding", absl::StrCat("num_tokens ", p.num_tokens));
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.table == nullptr || p.table->buffer == nullptr) return Invalid("embedding", "no table");
  const int32_t format = p.table->format;
  if (format != kCudaWeightBf16 && format != kCudaWeightFp32) {
    return Invalid("embedding", absl::StrCat("the table's format ", format, " is not the CUDA backend's"));
  }
  if (p.ids == nullptr || p.out == nullptr) return Invalid("embedding", "null ids or out");
  EmbeddingKernel<<<p.num_tokens, kThreads, 0, stream>>>(p.table->buffer->data(), format == kCudaWeightBf16,
                                                         p.table->rows, p.table->cols, p.ids, p.out);
  return LaunchStatus("EmbeddingKernel");
}

absl::Status LaunchRmsNorm(const RmsNormParams& p, CUstream_st* stream) {
  if (p.rows < 0 || p.rows > kMaxGridX || p.dim <= 0) {
    return Invalid("rms_norm", absl::StrCat("rows ", p.rows, ", dim ", p.dim));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr) return Invalid("rms_norm", "null pointer");
  RmsNormKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p.x, p.weight, p.out, p.dim, p.eps);
  return LaunchStatus("RmsNormKernel");
}

namespace {

// The rotation's checks (InvalidArgument naming `kernel`); sets `*work` when
// it rotates anything, and fills the table.
absl::Status CheckRope(const char* kernel, const RopeParams& p, RopeInvFreqTable* table, bool* work) {
  if (p.rope_dim % 2 != 0 || p.rope_dim < 0 || p.rope_dim > p.head_dim || p.rope_dim / 2 > kMaxRopePairs) {
    return Invalid(kernel, absl::StrCat("bad rotary dimension ", p.rope_dim, " of head_dim ", p.head_dim,
                                        " (at most ", 2 * kMaxRopePairs, ")"));
  }
  if (p.num_tokens < 0 || p.num_heads < 0 || p.num_kv_heads < 0) {
    return Invalid(kernel, absl::StrCat("num_tokens ", p.num_tokens, ", heads ", p.num_heads, "/", p.num_kv_heads));
  }
  if (int64_t{p.num_heads + p.num_kv_heads} * (p.rope_dim / 2) > std::numeric_limits<int32_t>::max()) {
    return Invalid(kernel, "too many heads");
  }
  *work = p.num_tokens > 0 && p.rope_dim > 0 && p.num_heads + p.num_kv_heads > 0;
  if (!*work) return absl::OkStatus();
  if (p.positions == nullptr || (p.num_heads > 0 && p.q == nullptr) || (p.num_kv_heads > 0 && p.k == nullptr)) {
    return Invalid(kernel, "null pointer");
  }
  const int32_t pairs = p.rope_dim / 2;
  for (int32_t i = 0; i < pairs; ++i) table->inv_freq[i] = portable::RopeInvFreq(p.freq_base, i, p.rope_dim);
  for (int32_t i = pairs; i < kMaxRopePairs; ++i) table->inv_freq[i] = 0.0f;
  return absl::OkStatus();
}

// The cache write's checks; sets `*work` when it writes anything.
absl::Status CheckWriteKv(const char* kernel, const WriteKvParams& p, bool* work) {
  if (p.num_tokens < 0 || p.kv_width <= 0) {
    return Invalid(kernel, absl::StrCat("num_tokens ", p.num_tokens, ", kv_width ", p.kv_width));
  }
  *work = p.num_tokens > 0;
  if (!*work) return absl::OkStatus();
  if (p.cache.k == nullptr || p.cache.v == nullptr || p.k == nullptr || p.v == nullptr || p.slots == nullptr) {
    return Invalid(kernel, "null pointer");
  }
  if (p.cache.type != KvType::kF32) return Invalid(kernel, "the cache is not float32");
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchRope(const RopeParams& p, CUstream_st* stream) {
  RopeInvFreqTable table;
  bool work = false;
  TANDEM_RETURN_IF_ERROR(CheckRope("rope", p, &table, &work));
  if (!work) return absl::OkStatus();
  RopeKernel<<<p.num_tokens, kThreads / 2, 0, stream>>>(p.q, p.k, p.positions, p.num_heads, p.num_kv_heads,
                                                        p.head_dim, p.rope_dim / 2, p.freq_scale, table);
  return LaunchStatus("RopeKernel");
}

absl::Status LaunchWriteKv(const WriteKvParams& p, CUstream_st* stream) {
  bool work = false;
  TANDEM_RETURN_IF_ERROR(CheckWriteKv("write_kv", p, &work));
  if (!work) return absl::OkStatus();
  WriteKvKernel<<<p.num_tokens, kThreads, 0, stream>>>(static_cast<float*>(p.cache.k), static_cast<float*>(p.cache.v), p.k, p.v, p.slots, p.kv_width);
  return LaunchStatus("WriteKvKernel");
}

absl::Status LaunchRopeWriteKv(const RopeParams& rope, const WriteKvParams& kv, CUstream_st* stream) {
  RopeInvFreqTable table;
  bool rotates = false, writes = false;
  TANDEM_RETURN_IF_ERROR(CheckRope("rope_write_kv", rope, &table, &rotates));
  TANDEM_RETURN_IF_ERROR(CheckWriteKv("rope_write_kv", kv, &writes));
  if (kv.k != rope.k || kv.num_tokens != rope.num_tokens ||
      int64_t{kv.kv_width} != int64_t{rope.num_kv_heads} * rope.head_dim) {
    return Invalid("rope_write_kv", absl::StrCat("the cache takes other keys than the rotation's (", kv.num_tokens,
                                                 " tokens of width ", kv.kv_width, " against ", rope.num_tokens,
                                                 " of ", rope.num_kv_heads, " x ", rope.head_dim, ")"));
  }
  if (!writes) return absl::OkStatus();
  if (rope.num_heads > 0 && rope.q == nullptr) return Invalid("rope_write_kv", "null pointer");
  RopeWriteKvKernel<<<rope.num_tokens, kThreads, 0, stream>>>(
      rope.q, rope.k, kv.v, rope.positions, kv.slots, static_cast<float*>(kv.cache.k), static_cast<float*>(kv.cache.v), rope.num_heads, rope.num_kv_heads,
      rope.head_dim, rotates ? rope.rope_dim / 2 : 0, rope.freq_scale, table);
  return LaunchStatus("RopeWriteKvKernel");
}

absl::Status LaunchSiluMul(const SiluMulParams& p, CUstream_st* stream) {
  if (p.rows < 0 || p.dim < 0) return Invalid("silu_mul", absl::StrCat("rows ", p.rows, ", dim ", p.dim));
  const int64_t n = p.rows * p.dim;
  if (n == 0) return absl::OkStatus();
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) return Invalid("silu_mul", "null pointer");
  SiluMulKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(p.gate, p.up, p.out, n);
  return LaunchStatus("SiluMulKernel");
}

absl::Status LaunchGatherRows(const GatherRowsParams& p, CUstream_st* stream) {
  if (p.num_rows < 0 || p.dim < 0) {
    return Invalid("gather_rows", absl::StrCat("num_rows ", p.num_rows, ", dim ", p.dim));
  }
  if (p.num_rows == 0 || p.dim == 0) return absl::OkStatus();
  if (p.x == nullptr || p.rows == nullptr || p.out == nullptr) return Invalid("gather_rows", "null pointer");
  GatherRowsKernel<<<p.num_rows, kThreads, 0, stream>>>(p.x, p.rows, p.dim, p.out);
  return LaunchStatus("GatherRowsKernel");
}

absl::Status LaunchCopyTokens(const CopyTokensParams& p, CUstream_st* stream) {
  if (p.count < 0) return Invalid("copy_tokens", absl::StrCat("count ", p.count));
  if (p.count == 0) return absl::OkStatus();
  if (p.dst == nullptr || p.src == nullptr) return Invalid("copy_tokens", "null pointer");
  CopyTokensKernel<<<GridStrideBlocks(p.count), kThreads, 0, stream>>>(p.dst, p.dst_index, p.src, p.src_index,
                                                                        p.count);
  return LaunchStatus("CopyTokensKernel");
}

absl::Status LaunchDequantize(uint32_t type, const void* raw, int64_t n, void* out, bool to_bf16,
                              CUstream_st* stream) {
  if (!portable::IsDecodableType(type)) return Invalid("dequantize", absl::StrCat("ggml type ", type));
  const bool quantized = type == portable::kGgmlQ8_0 || type == portable::kGgmlQ4_0 || type == portable::kGgmlQ4_1;
  if (n < 0 || (quantized && n % portable::kQuantBlockElements != 0)) {
    return Invalid("dequantize", absl::StrCat(n, " elements is not a whole number of blocks"));
  }
  if (n == 0) return absl::OkStatus();
  if (raw == nullptr || out == nullptr) return Invalid("dequantize", "null pointer");
  DequantizeKernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(type, static_cast<const uint8_t*>(raw), n, out,
                                                                 to_bf16);
  return LaunchStatus("DequantizeKernel");
}

absl::Status LaunchCastToBf16(const float* x, int64_t n, uint16_t* out, CUstream_st* stream) {
  if (n < 0) return Invalid("cast_to_bf16", absl::StrCat("n ", n));
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || out == nullptr) return Invalid("cast_to_bf16", "null pointer");
  CastToBf16Kernel<<<GridStrideBlocks(n), kThreads, 0, stream>>>(x, n, out);
  return LaunchStatus("CastToBf16Kernel");
}

absl::Status CheckKernelImage() {
  cudaFuncAttributes attributes;
  return CudaStatus(cudaFuncGetAttributes(&attributes, CastToBf16Kernel),
                    "this build's kernels on the current device (cudaFuncGetAttributes)");
}

}  // namespace tandem::worker
