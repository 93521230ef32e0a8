// CUDA graphs for Backend::RunRecorded: a step's forward pass is hundreds of
// small launches (about twenty a layer), and at small batches the host's
// time to make them, not the device's to run them, set the step's time.
// Recorded once, a pass is one cudaGraphLaunch.
//
// When a key is first seen its body runs directly (eagerly): that run loads
// lazily loaded kernels, lets cuBLAS choose its kernels and grows the
// backend's scratch to the shape's size, none of which may happen inside a
// capture. The second time, the body is captured on the compute stream
// (thread-local mode: other threads' CUDA calls go on) and the graph
// instantiated and launched; from then on, launched. A capture that fails
// (the body's error, or scratch that had to grow, reported as
// FailedPrecondition by DeviceScratch) enqueued nothing: the body then runs
// eagerly, and the key is tried again next time, up to kMaxFailures times;
// a capture CUDA refuses marks the key eager for good.
//
// `generation` is the backend's scratch generation: scratch that grew since
// a graph was captured may have moved, so the graph is captured again.
// Capacity bounds the keys kept (least recently used go; the stream is
// drained before a graph in use is destroyed).
//
// Thread-compatible: the compute thread's.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_CUDA_GRAPHS_H_
#define TANDEM_WORKER_BACKENDS_CUDA_CUDA_GRAPHS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace tandem::worker {

struct GraphStats {
  int64_t eager = 0;      // bodies run directly
  int64_t captures = 0;   // graphs captured and instantiated
  int64_t replays = 0;    // graph launches, captures' first launches included
  int64_t failed_captures = 0;
};

class GraphCache {
 public:
  static constexpr int32_t kMaxFailures = 3;
  GraphCache(cudaStream_t stream, size_t capacity) : stream_(stream), capacity_(capacity) {}
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache();

  absl::Status Run(const std::vector<int64_t>& key, uint64_t generation, absl::FunctionRef<absl::Status()> body);
  const GraphStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t seen = 0;
    int32_t failures = 0;
    bool eager_only = false;
    uint64_t generation = 0;
    uint64_t last_use = 0;
    cudaGraphExec_t exec = nullptr;
  };
  void Destroy(Entry& e);
  void EvictOne();

  cudaStream_t stream_;
  size_t capacity_;
  uint64_t clock_ = 0;
  absl::flat_hash_map<std::vector<int64_t>, Entry> entries_;
  GraphStats stats_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_CUDA_GRAPHS_H_
