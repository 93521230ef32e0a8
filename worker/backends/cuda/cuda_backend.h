// CudaBackend: the Backend on one NVIDIA GPU. Kernels are enqueued on one
// compute stream; device-to-host copies go on a separate copy stream that
// waits for the compute stream with an event, so a step's sampled ids travel
// to the host while the next step computes. Weights are dequantized at load
// (bf16 by default, fp32 as an exactness option) and multiplied through
// cuBLAS with fp32 accumulation; activations and the KV cache are fp32, in
// the CPU backend's layout ([num_blocks, block_size, kv_heads, head_dim] per
// layer; block 0 is the null block).
//
// This header includes no CUDA header, so CPU code may see it: the stream
// and handle types are forward-declared.
//
// Thread-compatible: the worker's compute thread drives it; Event::Wait may
// be called from another thread (the output thread).
#ifndef TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_
#define TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backends/backend.h"

struct CUstream_st;

namespace tandem::worker {

enum class CudaWeightType { kBf16, kFp32 };

struct CudaBackendOptions {
  int32_t device = 0;
  CudaWeightType weight_type = CudaWeightType::kBf16;
  // RunRecorded records CUDA graphs (cuda_graphs.h); false runs every pass
  // eagerly (vLLM's --enforce-eager).
  bool graphs = true;
};

// What RunRecorded did (cuda_graphs.h).
struct CudaGraphCounts {
  int64_t eager = 0;
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t failed_captures = 0;
};

struct CudaMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

// OK when `device` can run kernels; otherwise FailedPrecondition naming the
// cause (no driver, no device, the index out of range), never a crash.
absl::Status CudaDeviceUsable(int32_t device);

class CudaBackend : public Backend {
 public:
  // Selects the device, creates the streams and the cuBLAS handle.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  // Free and total memory of the device now (after the weights: the KV cache
  // is sized from this with --gpu-memory-utilization).
  absl::StatusOr<CudaMemoryInfo> MemoryInfo() const;
  int32_t device() const { return options_.device; }
  // Bytes of weights loaded so far (LoadWeight and LoadVector), as stored on
  // the device (bf16 or fp32).
  int64_t weight_bytes() const;
  CUstream_st* compute_stream() const { return compute_; }
  CudaGraphCounts graph_counts() const;
  CUstream_st* copy_stream() const { return copy_; }

  // Backend: see backend.h.
  std::string name() const override { return "cuda"; }
  int32_t num_threads() const override { return 1; }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  // Copies `src` into a pinned staging slot and enqueues the copy on the
  // compute stream: `src` may be reused as soon as this returns.
  absl::Status Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override;
  // The copy stream waits for the compute stream, then copies `src` into a
  // pinned bounce buffer. `dst` (pageable is fine) receives the bytes when
  // this event's own Wait() returns or Done() first returns true, on that
  // caller's thread; another download's completion does not fill it, and an
  // event destroyed before either drops the copy. `src` must stay allocated
  // until the event is done (the copy stream reads it).
  absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<Weight> LoadWeight(const gguf::GgufTensor& tensor) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> LoadVector(const gguf::GgufTensor& tensor) override;
  absl::Status Embedding(const EmbeddingParams& p) override;
  absl::Status Matmul(const MatmulParams& p) override;
  // One cast of x to bf16 for the group's GEMMs (not one per weight).
  absl::Status MatmulGroup(const MatmulGroupParams& p) override;
  absl::Status RmsNorm(const RmsNormParams& p) override;
  absl::Status Rope(const RopeParams& p) override;
  absl::Status WriteKv(const WriteKvParams& p) override;
  absl::Status RopeWriteKv(const RopeParams& rope, const WriteKvParams& kv) override;
  absl::Status PagedAttention(const AttentionParams& p) override;
  absl::Status SiluMul(const SiluMulParams& p) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status GatherRows(const GatherRowsParams& p) override;
  absl::Status CopyTokens(const CopyTokensParams& p) override;
  absl::Status Sample(const SampleParams& p) override;
  absl::Status RunRecorded(const std::vector<int64_t>& key, absl::FunctionRef<absl::Status()> body) override;

 private:
  // Matmul's checks, x as the GEMM reads it (cast to bf16 into scratch for
  // bf16 weights), and the GEMM.
  absl::Status CheckMatmul(const Weight& w, int64_t m) const;
  absl::StatusOr<const void*> MatmulInput(const Weight& w, const float* x, int64_t m);
  absl::Status Gemm(const Weight& w, const void* x, int64_t m, float* y, bool accumulate);
  class Impl;
  CudaBackend(const CudaBackendOptions& options, std::unique_ptr<Impl> impl, CUstream_st* compute,
              CUstream_st* copy);

  const CudaBackendOptions options_;
  std::unique_ptr<Impl> impl_;  // cuBLAS handle, staging ring, workspaces
  CUstream_st* const compute_;
  CUstream_st* const copy_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_
