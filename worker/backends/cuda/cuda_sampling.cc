// CudaBackend::Sample: the sampling kernel (sampling.h) on the compute
// stream. Every input and output is already in device memory (the runner
// uploads the rows, histories and mask rows through Upload); the sampled ids
// stay there.
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_backend_impl.h"
#include "worker/backends/cuda/sampling.h"

namespace tandem::worker {

absl::Status CudaBackend::Sample(const SampleParams& p) {
  TANDEM_RETURN_IF_ERROR(impl_->MakeCurrent());
  return LaunchSampling(p, compute_);
}

}  // namespace tandem::worker
