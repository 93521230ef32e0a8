// The one mapping from CUDA runtime, cuBLAS and NCCL results to absl::Status,
// for every file of tandem that calls them (the CUDA backend's .cc and .cu
// files, the NCCL communicator). Codes follow what the caller can do about it:
//   ResourceExhausted   device or pinned memory ran out
//   FailedPrecondition  no driver, no device, a device this build cannot run
//                       on, a library not initialized: fix the machine
//   InvalidArgument     a bad value or handle passed to the library (our bug
//                       or a caller's)
//   Unavailable         NCCL's peers or network failed (the group re-forms)
//   Internal            anything else (a kernel fault, a launch failure)
// The message is "<what>: <library's name of the error>: <its description>".
//
// This header includes the CUDA headers: only CUDA code sees it (cuda_backend.h
// and nccl_communicator.h, which CPU code includes, do not include it). The
// NCCL mapping exists when the build found NCCL (TANDEM_CUDA_STATUS_HAS_NCCL,
// set by the tandem_cuda_status target).
//
// Thread-safe: pure functions.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_
#define TANDEM_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

#if TANDEM_CUDA_STATUS_HAS_NCCL
#include <nccl.h>
#endif

namespace tandem::worker {

// OK for cudaSuccess. `what` names the call or operation that failed.
absl::Status CudaStatus(cudaError_t error, const char* what);
// OK for CUBLAS_STATUS_SUCCESS.
absl::Status CublasStatus(cublasStatus_t status, const char* what);
// The error of the last kernel launch on this thread (cudaGetLastError), as
// a Status naming `kernel`; call it right after each <<<...>>> launch.
absl::Status LaunchStatus(const char* kernel);

#if TANDEM_CUDA_STATUS_HAS_NCCL
// OK for ncclSuccess; adds ncclGetLastError's detail when NCCL has one.
absl::Status NcclStatus(ncclResult_t result, const char* what);
#endif

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_
