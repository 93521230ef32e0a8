// ThreadPool: a fixed set of threads for data-parallel loops. ParallelFor
// splits [0, count) into chunks that the pool threads and the calling thread
// take in turn, and returns when all are done. Work is only ever submitted by
// one thread (the worker's compute thread), one loop at a time.
//
// Thread-safe for one submitting thread; the pool threads only run chunks.
#ifndef TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
#define TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
                   const std::function<void(int64_t begin, int64_t end, int32_t thread)>& fn);

 private:
  void WorkerLoop(int32_t thread);
  void RunChunks(int32_t thread);

  const int32_t num_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;   // guarded by mu_: bumps once per loop
  bool stop_ = false;         // guarded by mu_
  int32_t busy_ = 0;          // guarded by mu_: pool threads still in the current loop
  // The current loop, valid while a ParallelFor runs.
  const std::function<void(int64_t, int64_t, int32_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
