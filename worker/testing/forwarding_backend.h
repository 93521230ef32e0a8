// ForwardingBackend: a Backend that passes every call to another, for test
// doubles that change one behavior (when copies complete, what they count)
// and keep the rest real.
//
// Thread-compatible, as the backend it wraps. Test-only.
#ifndef TANDEM_WORKER_TESTING_FORWARDING_BACKEND_H_
#define TANDEM_WORKER_TESTING_FORWARDING_BACKEND_H_

#include <memory>
#include <string>

#include "worker/backends/backend.h"

namespace tandem::worker::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() { return *inner_; }

  std::string name() const override { return inner_->name(); }
  int32_t num_threads() const override { return inner_->num_threads(); }
  KvType kv_type() const override { return inner_->kv_type(); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  absl::Status Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override {
    return inner_->Upload(dst, offset, src, bytes);
  }
  absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) override {
    return inner_->DownloadAsync(src, dst, bytes);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::StatusOr<Weight> LoadWeight(const gguf::GgufTensor& t) override { return inner_->LoadWeight(t); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> LoadVector(const gguf::GgufTensor& t) override {
    return inner_->LoadVector(t);
  }
  absl::Status Embedding(const EmbeddingParams& p) override { return inner_->Embedding(p); }
  absl::Status Matmul(const MatmulParams& p) override { return inner_->Matmul(p); }
  absl::Status MatmulGroup(const MatmulGroupParams& p) override { return inner_->MatmulGroup(p); }
  absl::Status RmsNorm(const RmsNormParams& p) override { return inner_->RmsNorm(p); }
  absl::Status Rope(const RopeParams& p) override { return inner_->Rope(p); }
  absl::Status WriteKv(const WriteKvParams& p) override { return inner_->WriteKv(p); }
  absl::Status RopeWriteKv(const RopeParams& rope, const WriteKvParams& kv) override {
    return inner_->RopeWriteKv(rope, kv);
  }
  absl::Status PagedAttention(const AttentionParams& p) override { return inner_->PagedAttention(p); }
  absl::Status SiluMul(const SiluMulParams& p) override { return inner_->SiluMul(p); }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return inner_->CopyOnDevice(dst, src, bytes);
  }
  absl::Status GatherRows(const GatherRowsParams& p) override { return inner_->GatherRows(p); }
  absl::Status CopyTokens(const CopyTokensParams& p) override { return inner_->CopyTokens(p); }
  absl::Status Sample(const SampleParams& p) override { return inner_->Sample(p); }
  absl::Status RunRecorded(const std::vector<int64_t>& key, absl::FunctionRef<absl::Status()> body) override {
    return inner_->RunRecorded(key, body);
  }

 private:
  const std::unique_ptr<Backend> inner_;
};

}  // namespace tandem::worker::testing

#endif  // TANDEM_WORKER_TESTING_FORWARDING_BACKEND_H_
