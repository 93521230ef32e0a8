// What the CUDA backend's tests share: host <-> backend copies through the
// Backend interface, the same data on CpuBackend and a CudaBackend, an error
// ratio, and the fixture of the tests that need a device (each skips, naming
// why, where no device is usable). Test-only.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_CUDA_TEST_UTIL_H_
#define TANDEM_WORKER_BACKENDS_CUDA_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/gguf/random_llama.h"
#include "gtest/gtest.h"
#include "worker/backends/backend.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/cuda/cuda_backend.h"

namespace tandem::worker::cuda_test {

// SmolLM2-135M's shapes (30 layers, hidden 576, 9 query / 3 KV heads,
// intermediate 1536, vocabulary 49152), random weights, fp32 in the file.
inline gguf::RandomLlamaOptions SmolLm2ShapedOptions(uint32_t seed) {
  gguf::RandomLlamaOptions options;
  options.layers = 30;
  options.hidden = 576;
  options.heads = 9;
  options.kv_heads = 3;
  options.intermediate = 1536;
  options.vocab = 49152;
  options.context = 2048;
  options.seed = seed;
  return options;
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// A buffer on `b` holding `host` (one byte when it is empty).
template <typename T>
std::unique_ptr<DeviceBuffer> Put(Backend& b, const std::vector<T>& host) {
  auto buffer = b.Allocate(std::max<size_t>(1, host.size() * sizeof(T)));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!host.empty()) {
    EXPECT_TRUE(b.Upload(**buffer, 0, host.data(), host.size() * sizeof(T)).ok());
  }
  return std::move(buffer).value();
}

// `n` elements at `src` on `b`, once the copy has completed.
template <typename T>
std::vector<T> Get(Backend& b, const void* src, size_t n) {
  std::vector<T> host(n);
  auto event = b.DownloadAsync(src, host.data(), n * sizeof(T));
  EXPECT_TRUE(event.ok()) << event.status();
  if (event.ok()) {
    EXPECT_TRUE((*event)->Wait().ok());
  }
  return host;
}

// The same host data on both backends.
template <typename T>
struct Both {
  std::unique_ptr<DeviceBuffer> cpu, gpu;
  T* c() { return cpu->as<T>(); }
  T* g() { return gpu->as<T>(); }
};

// Largest |a - b| / (atol + rtol |b|); <= 1 passes.
inline double WorstRatio(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double{got[i]} - want[i]) / (atol + rtol * std::abs(double{want[i]})));
  }
  return worst;
}

// A CpuBackend and two CudaBackends on device 0 (fp32 and bf16 weights).
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status usable = CudaDeviceUsable(0);
    if (!usable.ok()) GTEST_SKIP() << "no usable CUDA device: " << usable.message();
    auto fp32 = CudaBackend::Create({0, CudaWeightType::kFp32});
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    gpu_ = std::move(fp32).value();
    auto bf16 = CudaBackend::Create({0, CudaWeightType::kBf16});
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    gpu_bf16_ = std::move(bf16).value();
  }

  template <typename T>
  Both<T> Mirror(const std::vector<T>& host) {
    return {Put(cpu_, host), Put(*gpu_, host)};
  }
  template <typename T>
  std::vector<T> CpuResult(Both<T>& b, size_t n) {
    return Get<T>(cpu_, b.cpu->data(), n);
  }
  template <typename T>
  std::vector<T> GpuResult(Both<T>& b, size_t n) {
    return Get<T>(*gpu_, b.gpu->data(), n);
  }

  CpuBackend cpu_{2};
  std::unique_ptr<CudaBackend> gpu_;       // fp32 weights
  std::unique_ptr<CudaBackend> gpu_bf16_;  // bf16 weights
};

}  // namespace tandem::worker::cuda_test

#endif  // TANDEM_WORKER_BACKENDS_CUDA_CUDA_TEST_UTIL_H_
