// The CUDA backend's small kernels: host launchers that take backend.h's
// params structs (device pointers, host sizes) and a stream, check the sizes
// on the host (InvalidArgument naming the kernel and the bad value), enqueue
// the kernel and return the launch's error through cuda_status.h. Nothing
// here waits for the device. Semantics are CpuBackend's (backend.h); where a
// device cannot report a bad value the kernel's behaviour is stated.
//
// No CUDA header here: the stream is forward-declared.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_ELEMENTWISE_H_
#define TANDEM_WORKER_BACKENDS_CUDA_ELEMENTWISE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/backend.h"

struct CUstream_st;

namespace tandem::worker {

// Weight::format of the CUDA backend's weights: row-major [rows, cols].
inline constexpr int32_t kCudaWeightBf16 = 1;  // bf16 bits (uint16_t)
inline constexpr int32_t kCudaWeightFp32 = 2;  // float

// out[i, :] = table[ids[i], :] as float (a bf16 table is widened exactly).
// An id outside [0, rows) gives a row of zeros (the device cannot return an
// error; the CPU backend returns InvalidArgument).
absl::Status LaunchEmbedding(const EmbeddingParams& p, CUstream_st* stream);

// One CTA per row: the sum of squares in float, then x * scale * weight.
absl::Status LaunchRmsNorm(const RmsNormParams& p, CUstream_st* stream);

// portable/rope.h's rotation of every (token, head, pair) of q and k, in
// place, with inv_freq computed here on the host. rope_dim at most 512.
absl::Status LaunchRope(const RopeParams& p, CUstream_st* stream);

// cache.k/v[slots[t], :] = k/v[t, :]; a negative slot is skipped.
absl::Status LaunchWriteKv(const WriteKvParams& p, CUstream_st* stream);

// LaunchRope(rope) then LaunchWriteKv(kv) in one kernel (Backend::RopeWriteKv).
// InvalidArgument, besides either's, when kv does not write rope's keys
// (kv.k != rope.k, other num_tokens, kv_width != num_kv_heads * head_dim).
absl::Status LaunchRopeWriteKv(const RopeParams& rope, const WriteKvParams& kv, CUstream_st* stream);

// out = gate / (1 + exp(-gate)) * up, elementwise (out may be gate or up).
absl::Status LaunchSiluMul(const SiluMulParams& p, CUstream_st* stream);

// out[i, :] = x[rows[i], :]. REQUIRES: out does not overlap x (the CPU
// backend copies row by row; the device copies rows in any order).
absl::Status LaunchGatherRows(const GatherRowsParams& p, CUstream_st* stream);

// dst[dst_index[i]] = src[src_index[i]] (a null index means i). REQUIRES: dst
// does not overlap src, and dst_index has no repeats (threads write at once).
absl::Status LaunchCopyTokens(const CopyTokensParams& p, CUstream_st* stream);

// out[i] = element i of `n` elements of ggml `type` at `raw` (the GGUF
// tensor's bytes, on the device), decoded by portable/quant.h; stored as bf16
// (round to nearest even) when `to_bf16`, else as float. InvalidArgument for
// a type quant.h does not decode or n not a whole number of blocks.
absl::Status LaunchDequantize(uint32_t type, const void* raw, int64_t n, void* out, bool to_bf16,
                              CUstream_st* stream);

// out[i] = bf16(x[i]), round to nearest even (portable::FloatToBf16).
absl::Status LaunchCastToBf16(const float* x, int64_t n, uint16_t* out, CUstream_st* stream);

// OK when this build holds code the current device can run (SASS for its
// architecture or PTX it can compile); FailedPrecondition otherwise.
absl::Status CheckKernelImage();

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_ELEMENTWISE_H_
