#include "worker/backends/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::worker {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", std::string(cudaGetErrorName(error)), ": ",
                                     std::string(cudaGetErrorString(error)));
  switch (error) {
    case cudaErrorMemoryAllocation: return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorStubLibrary:              // the driver stub, no real driver
    case cudaErrorDevicesUnavailable:       // exclusive-process mode, taken
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:   // built for another architecture
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInitializationError: return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:     // a launch shape out of limits
    case cudaErrorInvalidMemcpyDirection: return absl::InvalidArgumentError(message);
    default: return absl::InternalError(message);  // faults, launch failures, ...
  }
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", std::string(cublasGetStatusName(status)), ": ",
                                     std::string(cublasGetStatusString(status)));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED: return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED: return absl::FailedPreconditionError(message);
    case CUBLAS_STATUS_INVALID_VALUE: return absl::InvalidArgumentError(message);
    default: return absl::InternalError(message);  // execution failed, internal error
  }
}

absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

#if TANDEM_CUDA_STATUS_HAS_NCCL
absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", std::string(ncclGetErrorString(result)));
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&message, " (", std::string(detail), ")");
  switch (result) {
    case ncclInvalidArgument: return absl::InvalidArgumentError(message);
    case ncclInvalidUsage: return absl::FailedPreconditionError(message);
    case ncclSystemError:  // sockets, shared memory, the network
    case ncclRemoteError:  // a peer failed or went away
    case ncclInProgress: return absl::UnavailableError(message);
    default: return absl::InternalError(message);  // unhandled CUDA error, internal error
  }
}
#endif

}  // namespace tandem::worker
