#include "worker/backends/cuda/cuda_graphs.h"

#include <limits>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_status.h"

namespace tandem::worker {

GraphCache::~GraphCache() {
  bool any = false;
  for (auto& [key, e] : entries_) any = any || e.exec != nullptr;
  if (any) cudaStreamSynchronize(stream_);  // a graph may still run
  for (auto& [key, e] : entries_) Destroy(e);
}

void GraphCache::Destroy(Entry& e) {
  if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  e.exec = nullptr;
}

void GraphCache::EvictOne() {
  auto oldest = entries_.end();
  uint64_t when = std::numeric_limits<uint64_t>::max();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.last_use < when) when = it->second.last_use, oldest = it;
  }
  if (oldest == entries_.end()) return;
  if (oldest->second.exec != nullptr) cudaStreamSynchronize(stream_);
  Destroy(oldest->second);
  entries_.erase(oldest);
}

absl::Status GraphCache::Run(const std::vector<int64_t>& key, uint64_t generation,
                             absl::FunctionRef<absl::Status()> body) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= capacity_) EvictOne();
    it = entries_.emplace(key, Entry{}).first;
  }
  Entry& e = it->second;
  e.last_use = ++clock_;
  if (e.exec != nullptr && e.generation == generation) {
    ++stats_.replays;
    return CudaStatus(cudaGraphLaunch(e.exec, stream_), "cudaGraphLaunch");
  }
  if (e.exec != nullptr) {  // scratch moved since: record again
    cudaStreamSynchronize(stream_);
    Destroy(e);
  }
  if (e.eager_only || ++e.seen < 2) {
    ++stats_.eager;
    return body();
  }

  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
  const absl::Status captured = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  cudaError_t made = cudaErrorUnknown;
  if (captured.ok() && ended == cudaSuccess && graph != nullptr) made = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    // Nothing of the capture ran: run the body as it is.
    cudaGetLastError();  // the failed capture's error is not the next launch's
    ++stats_.failed_captures;
    // CUDA refused a body that ran without error: it would again.
    if (captured.ok() || ++e.failures >= kMaxFailures) e.eager_only = true;
    e.seen = 1;
    ++stats_.eager;
    return body();
  }
  e.exec = exec;
  e.generation = generation;
  ++stats_.captures;
  ++stats_.replays;
  return CudaStatus(cudaGraphLaunch(e.exec, stream_), "cudaGraphLaunch");
}

}  // namespace tandem::worker
