// CpuBackend: the reference backend, multithreaded, runs everywhere. "Device"
// memory is host memory; kernels run on the thread pool when they are
// enqueued, so the stream order is program order and every event is complete
// on return. Q4_0, Q4_1 and Q8_0 weights stay quantized, packed in groups of
// four rows (quant_gemm.h), and are multiplied by quant_gemm.h's kernels;
// other types are expanded to float32
// at load (see README, Performance, for the measurements).
//
// Thread-compatible: driven by one thread; uses its own pool internally.
#ifndef TANDEM_WORKER_BACKENDS_CPU_CPU_BACKEND_H_
#define TANDEM_WORKER_BACKENDS_CPU_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "worker/backends/backend.h"
#include "worker/backends/cpu/cpu_attention.h"
#include "worker/backends/cpu/huge_pages.h"
#include "worker/backends/cpu/quant_gemm.h"
#include "worker/backends/cpu/thread_pool.h"
#include "worker/backends/cpu/sampler.h"

namespace tandem::worker {

struct CpuBackendOptions {
  // A matmul on quantized weights with at least this many rows of x expands
  // the weights to float32 tile by tile (DequantGemm); fewer rows quantize x
  // to 8 bits (QuantGemm). The float path is faster from about 16 rows on,
  // but the two paths round differently, so a threshold makes a request's
  // tokens depend on what else shares its steps (chunked vs whole prefill,
  // alone vs batched: three of in_process_engine_test's tests fail at 16).
  // The default keeps every batch on QuantGemm; see README, Performance.
  int64_t float_gemm_min_rows = kDefaultFloatGemmMinRows;
  static constexpr int64_t kDefaultFloatGemmMinRows = int64_t{1} << 40;
  // The KV cache's element type (Backend::kv_type). Half floats: attention
  // reads half the bytes (decode at 640 cached tokens 13% less time at
  // batch 1 and 16% at batch 16; README, Performance, pass 13) and a cache
  // holds twice the tokens, as llama.cpp's default f16 cache does. Float32
  // for tests that compare with an unrounded reference.
  KvType kv_type = KvType::kF16;
};

class CpuBackend : public Backend {
 public:
  // `num_threads` <= 0 uses every hardware thread.
  explicit CpuBackend(int32_t num_threads, CpuBackendOptions options = {});

  std::string name() const override { return "cpu"; }
  int32_t num_threads() const override { return pool_.num_threads(); }
  // PagedAttention and WriteKv take either type; the model allocates this.
  KvType kv_type() const override { return options_.kv_type; }
  // For benchmarks: the pool's Stats.
  ThreadPool& pool() { return pool_; }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  absl::Status Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<Weight> LoadWeight(const gguf::GgufTensor& tensor) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> LoadVector(const gguf::GgufTensor& tensor) override;

  absl::Status Embedding(const EmbeddingParams& p) override;
  absl::Status Matmul(const MatmulParams& p) override;
  absl::Status MatmulGroup(const MatmulGroupParams& p) override;
  absl::Status RmsNorm(const RmsNormParams& p) override;
  absl::Status Rope(const RopeParams& p) override;
  absl::Status WriteKv(const WriteKvParams& p) override;
  absl::Status PagedAttention(const AttentionParams& p) override;
  absl::Status SiluMul(const SiluMulParams& p) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status GatherRows(const GatherRowsParams& p) override;
  absl::Status CopyTokens(const CopyTokensParams& p) override;
  absl::Status Sample(const SampleParams& p) override;

 private:
  const CpuBackendOptions options_;
  ThreadPool pool_;
  cpu::QuantGemmScratch quant_scratch_;              // Matmul's x, quantized
  std::vector<std::vector<float>> dequant_scratch_;  // DequantGemm's tiles
  std::vector<uint8_t> embedding_row_;               // Embedding's row unpacked
  cpu::HugePageArena weight_arena_;                  // quantized weights, in 2 MiB pages
  std::vector<SamplerScratch> sampler_scratch_;  // one per pool thread
  cpu::AttentionScratch attention_scratch_;
  // RoPE's tables, kept across calls: every layer of a step rotates at the
  // same positions, so the step computes its cos/sin once (see Rope).
  struct RopeTables {
    float freq_base = 0.0f;
    int32_t rope_dim = 0;
    std::vector<float> inv_freq;   // [rope_dim / 2] of freq_base and rope_dim
    float freq_scale = 0.0f;
    std::vector<int32_t> positions;  // the positions cos and sin are for
    std::vector<float> cos, sin;     // [positions, rope_dim / 2]
  };
  RopeTables rope_;
  void UpdateRopeTables(const RopeParams& p);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_CPU_BACKEND_H_
