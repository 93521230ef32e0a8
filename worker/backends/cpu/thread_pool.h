// ThreadPool: a fixed set of threads for data-parallel loops. ParallelFor
// splits [0, count) into chunks that the pool threads and the calling thread
// take in turn, and returns when all are done. Work is only ever submitted by
// one thread (the worker's compute thread), one loop at a time.
//
// A forward pass runs a dozen loops per layer, a few microseconds apart. A
// thread that has finished its part spins for up to `kSpin` before it sleeps,
// so the next loop (or the last chunk's end) reaches it without a futex wake,
// which costs tens of microseconds on a VM; between steps the threads sleep.
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
#include "absl/time/time.h"

namespace tandem::worker {

class ThreadPool {
 public:
  // How long a thread polls for the next loop or the end of the current one
  // before it blocks.
  static constexpr absl::Duration kSpin = absl::Microseconds(50);

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
  // Polls `ready` for up to kSpin; whether it became true.
  template <typename Ready>
  static bool Spin(Ready ready);

  const int32_t num_threads_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Explicit signals rather than Await: this wake-up is on the model's hot
  // path. A thread blocks only after checking the atomics below under mu_,
  // and they change under mu_ before a signal, so no wake-up is lost.
  absl::CondVar wake_;  // a new loop, or stop
  absl::CondVar done_;  // busy_ reached 0
  std::atomic<uint64_t> generation_{0};  // bumps once per loop
  std::atomic<bool> stop_{false};
  std::atomic<int32_t> busy_{0};  // pool threads still in the current loop
  // The current loop, valid while a ParallelFor runs: written by the
  // submitting thread before it bumps generation_ (release), read by the pool
  // threads after they see the bump (acquire).
  const std::function<void(int64_t, int64_t, int32_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
