#include "worker/backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/gguf/ggml_types.h"
#include "common/status_macros.h"
#include "worker/backends/cpu/cpu_gemm.h"
#include "worker/backends/cpu/cpu_math.h"

namespace tandem::worker {
namespace {

// 64-byte aligned host memory.
class HostBuffer : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes)
      : size_(bytes), data_(std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64))) {}
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t size() const override { return size_; }
  bool ok() const { return data_ != nullptr; }

 private:
  size_t size_;
  void* data_;
};

class DoneEvent : public Event {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
  bool Done() override { return true; }
};

absl::Status Invalid(const char* kernel, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("cpu ", kernel, ": ", why));
}

}  // namespace

CpuBackend::CpuBackend(int32_t num_threads, CpuBackendOptions options)
    : options_(options),
      pool_(num_threads > 0 ? num_threads : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()))),
      sampler_scratch_(pool_.num_threads()) {}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::Allocate(size_t bytes) {
  // The KV cache and float weights, streamed every step: in huge pages too
  // (SmolLM2 decode batch 1 about 10% faster than with only the weights in
  // them, six alternated pairs). Made resident here, page by page, rather
  // than at first use: left to the first write of a block, the step that
  // first reaches a new 2 MiB page of the cache faults it in for each of
  // the 60 layer buffers at once and takes several times as long (ITL p99
  // 434-452 ms on a fresh server against 174-183 once every page was in,
  // 16 streams with a 128-token budget). The whole --kv-cache-memory is
  // resident from the start, as a GPU's cache is.
  if (bytes >= cpu::kHugePageBytes) {
    std::unique_ptr<DeviceBuffer> buffer = cpu::HugePageArena::AllocateAlone(bytes);
    if (buffer == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
    auto* bytes_at = static_cast<volatile uint8_t*>(buffer->data());
    for (size_t at = 0; at < bytes; at += 4096) bytes_at[at] = 0;  // fresh anonymous memory is zero already
    return buffer;
  }
  auto buffer = std::make_unique<HostBuffer>(bytes);
  if (!buffer->ok()) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  return buffer;
}

absl::Status CpuBackend::Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  if (offset + bytes > dst.size()) return Invalid("upload", "past the end of the buffer");
  std::memcpy(static_cast<char*>(dst.data()) + offset, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Event>> CpuBackend::DownloadAsync(const void* src, void* dst, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return std::make_unique<DoneEvent>();
}

absl::StatusOr<Weight> CpuBackend::LoadWeight(const gguf::GgufTensor& tensor) {
  if (tensor.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name, " is not a matrix"));
  }
  Weight w;
  w.cols = tensor.shape[0];
  w.rows = tensor.shape[1];
  const auto type = static_cast<int32_t>(tensor.type);
  if (cpu::IsQuantizedFormat(type) && w.cols % 32 == 0) {
    // Kept quantized, packed in pairs of groups of rows as the kernels read
    // them (runs of whole pairs in parallel), the matrices one after the
    // other in huge pages.
    const auto bytes = static_cast<size_t>(cpu::PackedWeightBytes(type, w.rows, w.cols));
    w.buffer = weight_arena_.Allocate(bytes);
    if (w.buffer == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
    auto* out = w.buffer->as<uint8_t>();
    const int64_t row_bytes = cpu::QuantizedRowBytes(type, w.cols);
    const int64_t pairs = (w.rows + cpu::kPackRows - 1) / cpu::kPackRows;
    pool_.ParallelFor(pairs, 8, [&](int64_t begin, int64_t end, int32_t) {
      const int64_t first = begin * cpu::kPackRows;
      const int64_t rows = std::min(w.rows, end * cpu::kPackRows) - first;
      cpu::PackWeightRows(type, tensor.data + first * row_bytes, rows, w.cols, out + first * row_bytes);
    });
    w.format = type;
    return w;
  }
  auto buffer = Allocate(static_cast<size_t>(w.rows * w.cols) * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  w.buffer = std::move(buffer).value();
  w.format = static_cast<int32_t>(gguf::GgmlType::kF32);
  float* out = w.buffer->as<float>();
  const int64_t row_bytes = gguf::RowBytes(tensor.type, w.cols);
  absl::Status status;
  pool_.ParallelFor(w.rows, 64, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t r = begin; r < end; ++r) {
      absl::Status s = gguf::DequantizeRow(tensor.type, tensor.data + r * row_bytes, out + r * w.cols, w.cols);
      if (!s.ok()) status = s;  // every failing row reports the same cause
    }
  });
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name, ": ", status.message()));
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::LoadVector(const gguf::GgufTensor& tensor) {
  auto buffer = Allocate(static_cast<size_t>(tensor.num_elements) * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  absl::Status s = gguf::DequantizeRow(tensor.type, tensor.data, (*buffer)->as<float>(), tensor.num_elements);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name, ": ", s.message()));
  return buffer;
}

absl::Status CpuBackend::Embedding(const EmbeddingParams& p) {
  const int64_t dim = p.table->cols;
  const bool quantized = cpu::IsQuantizedFormat(p.table->format);
  const int64_t row_bytes = quantized ? cpu::QuantizedRowBytes(p.table->format, dim) : dim * int64_t{sizeof(float)};
  const auto* table = static_cast<const uint8_t*>(p.table->buffer->data());
  for (int32_t i = 0; i < p.num_tokens; ++i) {
    const TokenId id = p.ids[i];
    if (id < 0 || id >= p.table->rows) return Invalid("embedding", absl::StrCat("token id ", id, " out of range"));
    if (quantized) {
      // The row back in its GGUF blocks (LoadWeight packed it with its group).
      embedding_row_.resize(row_bytes);
      cpu::UnpackWeightRow(p.table->format, table, dim, id, embedding_row_.data());
      TANDEM_RETURN_IF_ERROR(gguf::DequantizeRow(static_cast<gguf::GgmlType>(p.table->format),
                                                 embedding_row_.data(), p.out + i * dim, dim));
    } else {
      std::memcpy(p.out + i * dim, table + id * row_bytes, dim * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Matmul(const MatmulParams& p) {
  const Weight& w = *p.w;
  const auto* data = static_cast<const uint8_t*>(w.buffer->data());
  if (!cpu::IsQuantizedFormat(w.format)) {
    cpu::Gemm(pool_, p.x, p.m, reinterpret_cast<const float*>(data), w.rows, w.cols, p.y, p.accumulate);
  } else if (p.m >= options_.float_gemm_min_rows) {
    cpu::DequantGemm(pool_, p.x, p.m, data, w.format, w.rows, w.cols, p.y, p.accumulate, &dequant_scratch_);
  } else {
    const cpu::QuantGemmOutput output{data, w.format, w.rows, p.y, p.accumulate};
    cpu::QuantGemmFloat(pool_, p.x, p.m, w.cols, &output, 1, &quant_scratch_);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MatmulGroup(const MatmulGroupParams& p) {
  if (p.count < 1 || p.count > MatmulGroupParams::kMaxWeights) return Invalid("matmul group", "1 to 3 weights");
  const int64_t cols = p.w[0]->cols;
  bool fused = p.m < options_.float_gemm_min_rows;
  for (int32_t i = 0; i < p.count; ++i) fused = fused && cpu::IsQuantizedFormat(p.w[i]->format) && p.w[i]->cols == cols;
  if (!fused) return Backend::MatmulGroup(p);
  // One loop over every weight's rows.
  cpu::QuantGemmOutput outputs[MatmulGroupParams::kMaxWeights];
  for (int32_t i = 0; i < p.count; ++i) {
    const Weight& w = *p.w[i];
    outputs[i] = {static_cast<const uint8_t*>(w.buffer->data()), w.format, w.rows, p.y[i], /*accumulate=*/false};
  }
  cpu::QuantGemmFloat(pool_, p.x, p.m, cols, outputs, p.count, &quant_scratch_);
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const RmsNormParams& p) {
  pool_.ParallelFor(p.rows, 8, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.x + r * p.dim;
      float* out = p.out + r * p.dim;
      const float mean_square = cpu::Dot(x, x, p.dim) / static_cast<float>(p.dim);
      const float scale = 1.0f / std::sqrt(mean_square + p.eps);
      for (int64_t i = 0; i < p.dim; ++i) out[i] = x[i] * scale * p.weight[i];
    }
  });
  return absl::OkStatus();
}

// Recomputes only what changed since the last call: inv_freq when the
// model's base or dimension does, cos/sin when the positions do (once a step,
// not once a layer). The same float operations as computing them in place.
void CpuBackend::UpdateRopeTables(const RopeParams& p) {
  RopeTables& r = rope_;
  const int32_t pairs = p.rope_dim / 2;
  const bool same_freq = r.freq_base == p.freq_base && r.rope_dim == p.rope_dim;
  if (!same_freq) {
    r.freq_base = p.freq_base;
    r.rope_dim = p.rope_dim;
    r.inv_freq.resize(pairs);
    for (int32_t i = 0; i < pairs; ++i) {
      r.inv_freq[i] = std::pow(p.freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(p.rope_dim));
    }
  }
  const int32_t* positions = p.positions;
  if (same_freq && r.freq_scale == p.freq_scale && r.positions.size() == static_cast<size_t>(p.num_tokens) &&
      std::equal(positions, positions + p.num_tokens, r.positions.begin())) {
    return;
  }
  r.freq_scale = p.freq_scale;
  r.positions.assign(positions, positions + p.num_tokens);
  r.cos.resize(int64_t{p.num_tokens} * pairs);
  r.sin.resize(int64_t{p.num_tokens} * pairs);
  pool_.ParallelFor(p.num_tokens, 4, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[t]) * p.freq_scale;
      for (int32_t i = 0; i < pairs; ++i) {
        r.cos[t * pairs + i] = std::cos(pos * r.inv_freq[i]);
        r.sin[t * pairs + i] = std::sin(pos * r.inv_freq[i]);
      }
    }
  });
}

absl::Status CpuBackend::Rope(const RopeParams& p) {
  if (p.rope_dim % 2 != 0 || p.rope_dim > p.head_dim) return Invalid("rope", "bad rotary dimension");
  UpdateRopeTables(p);
  const int32_t pairs = p.rope_dim / 2;
  pool_.ParallelFor(p.num_tokens, 4, [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = rope_.cos.data() + t * pairs;
      const float* sin = rope_.sin.data() + t * pairs;
      // GGUF Llama weights are permuted for adjacent-pair rotation (ggml's
      // "normal" RoPE), not the rotate-half layout of the HF checkpoints.
      auto rotate = [&](float* head) {
        for (int32_t i = 0; i < pairs; ++i) {
          const float a = head[2 * i];
          const float b = head[2 * i + 1];
          head[2 * i] = a * cos[i] - b * sin[i];
          head[2 * i + 1] = a * sin[i] + b * cos[i];
        }
      };
      for (int32_t h = 0; h < p.num_heads; ++h) rotate(p.q + (t * p.num_heads + h) * p.head_dim);
      for (int32_t h = 0; h < p.num_kv_heads; ++h) rotate(p.k + (t * p.num_kv_heads + h) * p.head_dim);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::WriteKv(const WriteKvParams& p) {
  const size_t width = p.kv_width;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    if (p.slots[t] < 0) continue;  // as the device kernels: a padded row
    const size_t slot = static_cast<size_t>(p.slots[t]);
    const float* k = p.k + t * width;
    const float* v = p.v + t * width;
    if (p.cache.type == KvType::kF32) {
      std::memcpy(static_cast<float*>(p.cache.k) + slot * width, k, width * sizeof(float));
      std::memcpy(static_cast<float*>(p.cache.v) + slot * width, v, width * sizeof(float));
    } else {
      cpu::FloatsToHalves(k, static_cast<uint16_t*>(p.cache.k) + slot * width, p.kv_width);
      cpu::FloatsToHalves(v, static_cast<uint16_t*>(p.cache.v) + slot * width, p.kv_width);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedAttention(const AttentionParams& p) {
  const absl::Status status = cpu::PagedAttention(pool_, p, &attention_scratch_);
  return status.ok() ? status : Invalid("attention", std::string(status.message()));
}

absl::Status CpuBackend::SiluMul(const SiluMulParams& p) {
  if (p.out != p.gate) std::memmove(p.out, p.gate, static_cast<size_t>(p.rows * p.dim) * sizeof(float));
  pool_.ParallelFor(p.rows * p.dim, 4096, [&](int64_t begin, int64_t end, int32_t) {
    cpu::SiluMul(p.out + begin, p.up + begin, end - begin);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatherRows(const GatherRowsParams& p) {
  for (int32_t i = 0; i < p.num_rows; ++i) {
    std::memmove(p.out + int64_t{i} * p.dim, p.x + int64_t{p.rows[i]} * p.dim, p.dim * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyTokens(const CopyTokensParams& p) {
  for (int32_t i = 0; i < p.count; ++i) {
    p.dst[p.dst_index ? p.dst_index[i] : i] = p.src[p.src_index ? p.src_index[i] : i];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Sample(const SampleParams& p) {
  TANDEM_RETURN_IF_ERROR(ValidateSampleParams(p));
  pool_.ParallelFor(p.num_rows, 1, [&](int64_t begin, int64_t end, int32_t thread) {
    for (int64_t r = begin; r < end; ++r) {
      SampledToken s = SampleLogits(p, static_cast<int32_t>(r), &sampler_scratch_[thread]);
      p.tokens[r] = s.token;
      if (p.logprobs == nullptr) continue;
      float* lp = p.logprobs + r * (1 + p.max_top);
      TokenId* ids = p.top_ids + r * p.max_top;
      lp[0] = s.logprob;
      for (int32_t i = 0; i < p.max_top; ++i) {
        const bool has = i < static_cast<int32_t>(s.top.size());
        ids[i] = has ? s.top[i].first : -1;
        lp[1 + i] = has ? s.top[i].second : 0.0f;
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace tandem::worker
