// ThreadPool: a fixed set of threads for data-parallel loops. ParallelFor
// splits [0, count) into chunks that the pool threads and the calling thread
// take in turn, and returns when all are done. Work is only ever submitted by
// one thread (the worker's compute thread), one loop at a time.
//
// Thread-safe for one submitting thread; the pool threads only run chunks.
#ifndef TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
#define TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::worker {

class ThreadPool {
 public:
  // `num_threads` counts the caller: 1 runs everything inline.
  explicit ThreadPool(int32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread) over [0, count) in chunks of at least
  // `grain` items; `thread` is in [0, num_threads()) and identifies per-thread
  // scratch space.
  void ParallelFor(int64_t count, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int32_t thread)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WorkerLoop(int32_t thread) ABSL_LOCKS_EXCLUDED(mu_);
  void RunChunks(int32_t thread);

  const int32_t num_threads_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Explicit signals rather than Await: this wake-up is on the model's hot
  // path, and CondVars measured no slower than std::condition_variable.
  absl::CondVar wake_;  // a new loop, or stop
  absl::CondVar done_;  // busy_ reached 0
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumps once per loop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int32_t busy_ ABSL_GUARDED_BY(mu_) = 0;  // pool threads still in the current loop
  // The current loop, valid while a ParallelFor runs: written by the
  // submitting thread before it bumps generation_, read by the pool threads
  // after they see the bump (mu_ orders both).
  const std::function<void(int64_t, int64_t, int32_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
