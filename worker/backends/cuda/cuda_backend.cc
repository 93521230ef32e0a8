// CudaBackend's mechanism: device selection, streams, memory, copies, weight
// loading and the launch of each kernel (elementwise.cu), GEMM (cuBLAS) and
// attention (paged_attention.cu). Sample lives in cuda_sampling.cc.
#include "worker/backends/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/gguf/ggml_types.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_backend_impl.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/elementwise.h"
#include "worker/backends/cuda/gemm_shape.h"
#include "worker/backends/cuda/gemv.h"
#include "worker/backends/cuda/paged_attention.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker {
namespace {

absl::Status Invalid(const char* what, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("cuda ", what, ": ", why));
}

std::string VersionString(int version) { return absl::StrCat(version / 1000, ".", version % 1000 / 10); }

// Device memory from the device's default pool, freed in stream order on the
// compute stream when the buffer goes.
class CudaBuffer : public DeviceBuffer {
 public:
  CudaBuffer(std::shared_ptr<CudaStreams> streams, void* data, size_t size)
      : streams_(std::move(streams)), data_(data), size_(size) {}
  ~CudaBuffer() override { cudaFreeAsync(data_, streams_->compute); }  // an error here has no one to go to
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<CudaStreams> streams_;
  void* data_;
  size_t size_;
};

// A device-to-host copy in flight: the copy stream copies into a pinned
// bounce buffer and records `done`; the first of Wait or a Done that finds
// `done` complete copies the bounce buffer to the caller's (pageable) `dst`.
// Wait and Done may run on any thread (the output thread); the lock makes the
// one host copy happen once.
class CudaDownloadEvent : public Event {
 public:
  CudaDownloadEvent(std::shared_ptr<PinnedPool> pool, void* bounce, size_t capacity, cudaEvent_t done, void* dst,
                    size_t bytes)
      : pool_(std::move(pool)), bounce_(bounce), capacity_(capacity), done_(done), dst_(dst), bytes_(bytes) {}

  // The bounce buffer and event go back to the pool even if the copy is still
  // running: the next download that takes them is ordered behind this one on
  // the copy stream, and re-recording an event is allowed.
  ~CudaDownloadEvent() override {
    pool_->GiveBuffer(bounce_, capacity_);
    pool_->GiveEvent(done_);
  }

  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!finished_) Finish(CudaStatus(cudaEventSynchronize(done_), "cudaEventSynchronize (download)"));
    return status_;
  }

  bool Done() override {
    absl::MutexLock lock(&mu_);
    if (finished_) return true;
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    Finish(CudaStatus(e, "cudaEventQuery (download)"));
    return true;
  }

 private:
  void Finish(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status.ok() && bytes_ > 0) std::memcpy(dst_, bounce_, bytes_);
    status_ = std::move(status);
    finished_ = true;
  }

  const std::shared_ptr<PinnedPool> pool_;
  void* const bounce_;
  const size_t capacity_;
  const cudaEvent_t done_;
  void* const dst_;
  const size_t bytes_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The device's properties for messages ("NVIDIA H200, sm_90").
std::string DeviceDescription(int32_t device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown device";
  return absl::StrCat(prop.name, ", sm_", prop.major, prop.minor);
}

absl::Status CheckLoadableType(const gguf::GgufTensor& tensor) {
  const uint32_t type = static_cast<uint32_t>(tensor.type);
  if (portable::IsDecodableType(type)) return absl::OkStatus();
  return Invalid("load", absl::StrCat("tensor ", tensor.name, " has type ", std::string(gguf::GgmlTypeName(type)),
                                      ", which the CUDA backend does not load"));
}

absl::Status Unusable(int32_t device, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device, " is not usable: ", why));
}

}  // namespace

// --- facilities of cuda_backend_impl.h ---

CudaStreams::~CudaStreams() {
  cudaSetDevice(device);
  for (cudaStream_t s : {compute, copy}) {
    if (s == nullptr) continue;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
}

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFreeAsync(data_, stream_);
}

absl::StatusOr<void*> DeviceScratch::Ensure(size_t bytes) {
  if (bytes <= bytes_ && data_ != nullptr) return data_;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError("device scratch would grow inside a graph capture");
  }
  if (generation_ != nullptr) ++*generation_;
  const size_t grown = std::max({bytes, bytes_ + bytes_ / 2, size_t{256}});
  if (data_ != nullptr) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(data_, stream_), "cudaFreeAsync (scratch)"));
    data_ = nullptr;
    bytes_ = 0;
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&data_, grown, stream_), "cudaMallocAsync (scratch)"));
  bytes_ = grown;
  return data_;
}

StagingRing::~StagingRing() {
  for (Slot& slot : slots_) {
    if (slot.done != nullptr) {
      cudaEventSynchronize(slot.done);
      cudaEventDestroy(slot.done);
    }
  }
  // Copies recorded after the last closed slot's event: drain the stream
  // before its source memory goes.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (Slot& slot : slots_) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
}

absl::Status StagingRing::Init(cudaStream_t stream) {
  stream_ = stream;
  slots_.resize(kSlots);
  for (Slot& slot : slots_) {
    void* host = nullptr;
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&host, kSlotBytes, cudaHostAllocDefault),
                                      "cudaHostAlloc (staging ring)"));
    slot.host = static_cast<char*>(host);
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "cudaEventCreate (staging ring)"));
  }
  return absl::OkStatus();
}

absl::Status StagingRing::Advance() {
  Slot& closing = slots_[current_];
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(closing.done, stream_), "cudaEventRecord (staging ring)"));
  closing.pending = true;
  ++slots_closed_;
  current_ = (current_ + 1) % kSlots;
  used_ = 0;
  Slot& next = slots_[current_];
  if (next.pending) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(next.done), "cudaEventSynchronize (staging ring)"));
    next.pending = false;
  }
  return absl::OkStatus();
}

absl::Status StagingRing::Copy(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  while (bytes > 0) {
    if (used_ >= kSlotBytes) TANDEM_RETURN_IF_ERROR(Advance());
    const size_t n = std::min(bytes, kSlotBytes - used_);
    char* staged = slots_[current_].host + used_;
    std::memcpy(staged, in, n);
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(out, staged, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)"));
    used_ = std::min(kSlotBytes, (used_ + n + 63) / 64 * 64);
    out += n;
    in += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

PinnedPool::~PinnedPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [capacity, buffer] : buffers_) cudaFreeHost(buffer);
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
}

absl::StatusOr<void*> PinnedPool::TakeBuffer(size_t bytes, size_t* capacity) {
  size_t size = 4096;
  while (size < bytes) size *= 2;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].first == size) {
        void* buffer = buffers_[i].second;
        buffers_[i] = buffers_.back();
        buffers_.pop_back();
        *capacity = size;
        return buffer;
      }
    }
  }
  void* buffer = nullptr;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&buffer, size, cudaHostAllocDefault), "cudaHostAlloc (download)"));
  *capacity = size;
  return buffer;
}

absl::StatusOr<cudaEvent_t> PinnedPool::TakeEvent() {
  {
    absl::MutexLock lock(&mu_);
    if (!events_.empty()) {
      cudaEvent_t event = events_.back();
      events_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate (download)"));
  return event;
}

void PinnedPool::GiveBuffer(void* buffer, size_t capacity) {
  absl::MutexLock lock(&mu_);
  buffers_.emplace_back(capacity, buffer);
}

void PinnedPool::GiveEvent(cudaEvent_t event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(event);
}

CudaBackend::Impl::~Impl() {
  if (streams == nullptr) return;
  cudaSetDevice(device);
  graphs.reset();  // drains the compute stream if a graph may run
  cudaStreamSynchronize(streams->compute);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (cublas_workspace != nullptr) cudaFree(cublas_workspace);
  if (compute_ready != nullptr) cudaEventDestroy(compute_ready);
  // The scratch buffers and the staging ring free themselves (members), then
  // `streams` drains and goes with its last owner.
}

absl::Status CudaBackend::Impl::Init(int32_t device_index) {
  device = device_index;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  streams = std::make_shared<CudaStreams>();
  streams->device = device;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&streams->compute, cudaStreamNonBlocking),
                                    "cudaStreamCreate (compute)"));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&streams->copy, cudaStreamNonBlocking), "cudaStreamCreate (copy)"));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming), "cudaEventCreate"));

  // Freed buffers stay in the pool for the next cudaMallocAsync instead of
  // going back to the driver at every synchronization; MemoryInfo trims it.
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool"));
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                                    "cudaMemPoolSetAttribute"));

  // cublasSetStream resets the workspace, so the workspace comes after it.
  // The default math mode: no TF32 for fp32 GEMMs (the exactness option).
  TANDEM_RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas), "cublasCreate"));
  TANDEM_RETURN_IF_ERROR(CublasStatus(cublasSetStream(cublas, streams->compute), "cublasSetStream"));
  TANDEM_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&cublas_workspace, kCublasWorkspaceBytes), "cudaMalloc (cuBLAS workspace)"));
  TANDEM_RETURN_IF_ERROR(
      CublasStatus(cublasSetWorkspace(cublas, cublas_workspace, kCublasWorkspaceBytes), "cublasSetWorkspace"));

  TANDEM_RETURN_IF_ERROR(staging.Init(streams->compute));
  graphs = std::make_unique<GraphCache>(streams->compute, kGraphCapacity);
  matmul_input.Bind(streams->compute, &scratch_generation);
  attention_workspace.Bind(streams->compute, &scratch_generation);
  for (DeviceScratch& s : sampling_scratch) s.Bind(streams->compute);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::MakeCurrent() const {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return absl::OkStatus();
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

// --- CudaBackend ---

absl::Status CudaDeviceUsable(int32_t device) {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return Unusable(device,
                    "no CUDA driver is installed (libcuda.so was not found); install the NVIDIA driver or run "
                    "with --backend cpu");
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    return Unusable(device, absl::StrCat("the CUDA driver supports CUDA ", VersionString(driver),
                                         ", older than this build's runtime (CUDA ", VersionString(runtime),
                                         "); update the NVIDIA driver"));
  }
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
    return Unusable(device, "no CUDA device found (is CUDA_VISIBLE_DEVICES set to an empty list?)");
  }
  if (e != cudaSuccess) return Unusable(device, std::string(CudaStatus(e, "cudaGetDeviceCount").message()));
  if (device < 0 || device >= count) {
    return Unusable(device, absl::StrCat("out of range: this machine has ", count, " CUDA device",
                                         count == 1 ? "" : "s", " (0 to ", count - 1, ")"));
  }
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device;
  absl::Status status = CudaStatus(cudaSetDevice(device), "cudaSetDevice (creating the context)");
  if (status.ok()) status = CheckKernelImage();
  if (restore) cudaSetDevice(previous);
  if (!status.ok()) return Unusable(device, absl::StrCat("(", DeviceDescription(device), ") ", status.message()));
  return absl::OkStatus();
}

CudaBackend::CudaBackend(const CudaBackendOptions& options, std::unique_ptr<Impl> impl, CUstream_st* compute,
                         CUstream_st* copy)
    : options_(options), impl_(std::move(impl)), compute_(compute), copy_(copy) {}

CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  TANDEM_RETURN_IF_ERROR(CudaDeviceUsable(options.device));
  auto impl = std::make_unique<Impl>();
  absl::Status status = impl->Init(options.device);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("setting up CUDA device ", options.device, ": ", status.message()));
  }
  CUstream_st* compute = impl->compute();
  CUstream_st* copy = impl->copy();
  return std::unique_ptr<CudaBackend>(new CudaBackend(options, std::move(impl), compute, copy));
}

int64_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

absl::StatusOr<CudaMemoryInfo> CudaBackend::MemoryInfo() const {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  // Memory freed into the pool (load-time temporaries) counts as free.
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(compute_), "cudaStreamSynchronize"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMemPoolTrimTo(impl_->pool, 0), "cudaMemPoolTrimTo"));
  CudaMemoryInfo info;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo"));
  return info;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::Allocate(size_t bytes) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  void* data = nullptr;
  // At least one byte, so that data() is a real address even for empty buffers.
  absl::Status status = CudaStatus(cudaMallocAsync(&data, std::max<size_t>(bytes, 1), compute_), "cudaMallocAsync");
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("allocating ", bytes, " bytes: ", status.message()));
  }
  return std::make_unique<CudaBuffer>(impl_->streams, data, bytes);
}

absl::Status CudaBackend::Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  if (offset > dst.size() || bytes > dst.size() - offset) {
    return Invalid("upload", absl::StrCat(bytes, " bytes at offset ", offset, " pass the end of a buffer of ",
                                          dst.size()));
  }
  if (bytes == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return impl_->UploadAsync(static_cast<char*>(dst.data()) + offset, src, bytes);
}

absl::StatusOr<std::unique_ptr<Event>> CudaBackend::DownloadAsync(const void* src, void* dst, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  size_t capacity = 0;
  TANDEM_ASSIGN_OR_RETURN(void* bounce, impl_->pinned->TakeBuffer(bytes, &capacity));
  auto taken = impl_->pinned->TakeEvent();
  if (!taken.ok()) {
    impl_->pinned->GiveBuffer(bounce, capacity);
    return taken.status();
  }
  // From here the event owns the buffer and the completion event.
  auto event = std::make_unique<CudaDownloadEvent>(impl_->pinned, bounce, capacity, *taken, dst, bytes);
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(impl_->compute_ready, compute_), "cudaEventRecord (download)"));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaStreamWaitEvent(copy_, impl_->compute_ready, 0), "cudaStreamWaitEvent (download)"));
  if (bytes > 0) {
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(bounce, src, bytes, cudaMemcpyDeviceToHost, copy_), "cudaMemcpyAsync (download)"));
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(*taken, copy_), "cudaEventRecord (download done)"));
  return event;
}

absl::Status CudaBackend::Synchronize() {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(compute_), "cudaStreamSynchronize (compute)"));
  return CudaStatus(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (copy)");
}

absl::StatusOr<Weight> CudaBackend::LoadWeight(const gguf::GgufTensor& tensor) {
  if (tensor.shape.size() != 2) return Invalid("load", absl::StrCat("tensor ", tensor.name, " is not a matrix"));
  const uint32_t type = static_cast<uint32_t>(tensor.type);
  TANDEM_RETURN_IF_ERROR(CheckLoadableType(tensor));
  Weight w;
  w.cols = tensor.shape[0];
  w.rows = tensor.shape[1];
  if (w.cols <= 0 || w.rows <= 0 || w.cols % gguf::BlockElements(tensor.type) != 0) {
    return Invalid("load", absl::StrCat("tensor ", tensor.name, " has shape [", w.cols, ", ", w.rows, "]"));
  }
  const int64_t raw_bytes = w.rows * gguf::RowBytes(tensor.type, w.cols);
  if (tensor.num_bytes < raw_bytes || tensor.data == nullptr) {
    return Invalid("load", absl::StrCat("tensor ", tensor.name, " holds ", tensor.num_bytes, " bytes, not ",
                                        raw_bytes));
  }
  const bool bf16 = options_.weight_type == CudaWeightType::kBf16;
  const size_t element_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> raw, Allocate(static_cast<size_t>(raw_bytes)));
  TANDEM_RETURN_IF_ERROR(Upload(*raw, 0, tensor.data, static_cast<size_t>(raw_bytes)));
  TANDEM_ASSIGN_OR_RETURN(w.buffer, Allocate(static_cast<size_t>(w.rows * w.cols) * element_bytes));
  TANDEM_RETURN_IF_ERROR(LaunchDequantize(type, raw->data(), w.rows * w.cols, w.buffer->data(), bf16, compute_));
  w.format = bf16 ? kCudaWeightBf16 : kCudaWeightFp32;
  impl_->weight_bytes += static_cast<int64_t>(w.buffer->size());
  return w;  // `raw` is freed in stream order, after the dequantization
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::LoadVector(const gguf::GgufTensor& tensor) {
  const uint32_t type = static_cast<uint32_t>(tensor.type);
  TANDEM_RETURN_IF_ERROR(CheckLoadableType(tensor));
  const int64_t n = tensor.num_elements;
  if (n <= 0 || n % gguf::BlockElements(tensor.type) != 0 || tensor.data == nullptr ||
      tensor.num_bytes < gguf::RowBytes(tensor.type, n)) {
    return Invalid("load", absl::StrCat("tensor ", tensor.name, " has ", n, " elements in ", tensor.num_bytes,
                                        " bytes"));
  }
  const size_t raw_bytes = static_cast<size_t>(gguf::RowBytes(tensor.type, n));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> raw, Allocate(raw_bytes));
  TANDEM_RETURN_IF_ERROR(Upload(*raw, 0, tensor.data, raw_bytes));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> out, Allocate(static_cast<size_t>(n) * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(LaunchDequantize(type, raw->data(), n, out->data(), /*to_bf16=*/false, compute_));
  impl_->weight_bytes += static_cast<int64_t>(out->size());
  return out;
}

absl::Status CudaBackend::Embedding(const EmbeddingParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchEmbedding(p, compute_);
}

absl::Status CudaBackend::CheckMatmul(const Weight& w, int64_t m) const {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (w.buffer == nullptr) return Invalid("matmul", "no weight");
  if (m < 0 || m > kIntMax || w.rows <= 0 || w.rows > kIntMax || w.cols <= 0 || w.cols > kIntMax) {
    return Invalid("matmul", absl::StrCat("shape m ", m, ", weight ", w.rows, " x ", w.cols));
  }
  if (w.format != kCudaWeightBf16 && w.format != kCudaWeightFp32) {
    return Invalid("matmul", absl::StrCat("weight format ", w.format, " is not the CUDA backend's"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const void*> CudaBackend::MatmulInput(const Weight& w, const float* x, int64_t m) {
  if (w.format != kCudaWeightBf16) return static_cast<const void*>(x);
  // bf16 x bf16 products accumulated in fp32 (CUBLAS_COMPUTE_32F): x is
  // rounded to bf16 first, as the weight was at load.
  const int64_t n = m * w.cols;
  TANDEM_ASSIGN_OR_RETURN(void* x16, impl_->matmul_input.Ensure(static_cast<size_t>(n) * sizeof(uint16_t)));
  TANDEM_RETURN_IF_ERROR(LaunchCastToBf16(x, n, static_cast<uint16_t*>(x16), compute_));
  return static_cast<const void*>(x16);
}

absl::Status CudaBackend::Gemm(const Weight& w, const void* x, int64_t m, float* y, bool accumulate) {
  const GemmShape g = RowMajorXWtShape(m, w.rows, w.cols);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType_t ab_type = w.format == kCudaWeightBf16 ? CUDA_R_16BF : CUDA_R_32F;
  return CublasStatus(
      cublasGemmEx(impl_->cublas, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, g.transb ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, w.buffer->data(),
                   ab_type, static_cast<int>(g.lda), x, ab_type, static_cast<int>(g.ldb), &beta, y, CUDA_R_32F,
                   static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

absl::Status CudaBackend::Matmul(const MatmulParams& p) {
  if (p.w == nullptr) return Invalid("matmul", "no weight");
  TANDEM_RETURN_IF_ERROR(CheckMatmul(*p.w, p.m));
  if (p.m == 0) return absl::OkStatus();
  if (p.x == nullptr || p.y == nullptr) return Invalid("matmul", "null x or y");
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  if (p.w->format == kCudaWeightBf16 && GemvApplies(p.x, p.m, p.w->cols, p.w->buffer->data())) {
    return LaunchGemvBf16(
        {p.x, p.m, p.w->cols, 1, {{p.w->buffer->as<uint16_t>(), p.w->rows, p.y}}, p.accumulate}, compute_);
  }
  TANDEM_ASSIGN_OR_RETURN(const void* x, MatmulInput(*p.w, p.x, p.m));
  return Gemm(*p.w, x, p.m, p.y, p.accumulate);
}

static_assert(kGemvMaxWeights == MatmulGroupParams::kMaxWeights, "a group is one GEMV launch");

absl::Status CudaBackend::MatmulGroup(const MatmulGroupParams& p) {
  if (p.count < 1 || p.count > MatmulGroupParams::kMaxWeights) return Invalid("matmul", "a group of 1 to 3 weights");
  for (int32_t i = 0; i < p.count; ++i) {
    if (p.w[i] == nullptr) return Invalid("matmul", "no weight");
    TANDEM_RETURN_IF_ERROR(CheckMatmul(*p.w[i], p.m));
    if (p.w[i]->cols != p.w[0]->cols || p.w[i]->format != p.w[0]->format) {
      return Invalid("matmul", "a group's weights differ in columns or format");
    }
    if (p.y[i] == nullptr) return Invalid("matmul", "null y");
  }
  if (p.m == 0) return absl::OkStatus();
  if (p.x == nullptr) return Invalid("matmul", "null x");
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  bool gemv = p.w[0]->format == kCudaWeightBf16;
  for (int32_t i = 0; i < p.count; ++i) gemv = gemv && GemvApplies(p.x, p.m, p.w[i]->cols, p.w[i]->buffer->data());
  if (gemv) {  // the group in one launch
    GemvParams g{p.x, p.m, p.w[0]->cols, p.count, {}, /*accumulate=*/false};
    for (int32_t i = 0; i < p.count; ++i) g.out[i] = {p.w[i]->buffer->as<uint16_t>(), p.w[i]->rows, p.y[i]};
    return LaunchGemvBf16(g, compute_);
  }
  TANDEM_ASSIGN_OR_RETURN(const void* x, MatmulInput(*p.w[0], p.x, p.m));
  for (int32_t i = 0; i < p.count; ++i) TANDEM_RETURN_IF_ERROR(Gemm(*p.w[i], x, p.m, p.y[i], false));
  return absl::OkStatus();
}

absl::Status CudaBackend::RunRecorded(const std::vector<int64_t>& key, absl::FunctionRef<absl::Status()> body) {
  if (!options_.graphs) return body();
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return impl_->graphs->Run(key, impl_->scratch_generation, body);
}

CudaGraphCounts CudaBackend::graph_counts() const {
  const GraphStats& s = impl_->graphs->stats();
  return {s.eager, s.captures, s.replays, s.failed_captures};
}

absl::Status CudaBackend::RmsNorm(const RmsNormParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchRmsNorm(p, compute_);
}

absl::Status CudaBackend::Rope(const RopeParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchRope(p, compute_);
}

absl::Status CudaBackend::WriteKv(const WriteKvParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchWriteKv(p, compute_);
}

absl::Status CudaBackend::RopeWriteKv(const RopeParams& rope, const WriteKvParams& kv) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchRopeWriteKv(rope, kv, compute_);
}

absl::Status CudaBackend::PagedAttention(const AttentionParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  const size_t bytes = PagedAttentionWorkspaceBytes(p);
  void* workspace = nullptr;
  if (bytes > 0) {
    TANDEM_ASSIGN_OR_RETURN(workspace, impl_->attention_workspace.Ensure(bytes));
  }
  return LaunchPagedAttention(p, workspace, bytes, compute_);
}

absl::Status CudaBackend::SiluMul(const SiluMulParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchSiluMul(p, compute_);
}

absl::Status CudaBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  const auto* s = static_cast<const char*>(src);
  const auto* d = static_cast<const char*>(dst);
  if (d < s + bytes && s < d + bytes) return Invalid("copy", "overlapping source and destination");
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_), "cudaMemcpyAsync (device)");
}

absl::Status CudaBackend::GatherRows(const GatherRowsParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchGatherRows(p, compute_);
}

absl::Status CudaBackend::CopyTokens(const CopyTokensParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchCopyTokens(p, compute_);
}

}  // namespace tandem::worker
