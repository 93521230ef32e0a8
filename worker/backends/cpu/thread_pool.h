// ThreadPool: a fixed set of threads for data-parallel loops. ParallelFor
// splits [0, count) into chunks that the pool threads and the calling thread
// take in turn, and returns when all are done. Work is only ever submitted by
// one thread (the worker's compute thread), one loop at a time.
//
// A forward pass runs about five loops per layer, tens of microseconds apart.
// A thread that has finished its part spins for up to `kSpin` before it
// sleeps, so the next loop reaches it without a futex wake, which costs tens
// of microseconds on a VM; between steps the threads sleep.
//
// The pool tolerates preemption: ParallelFor waits for the loop's chunks, not
// for its threads. A pool thread that is descheduled before it takes a chunk
// (the scheduler and API processes share these cores in `tandem serve`)
// holds nothing up: the others take its share. Chunks are claimed by a CAS on
// one word holding the loop's generation, its chunk count and the next chunk,
// so a thread that runs again after its loop has finished sees the
// generation move on and takes nothing from a loop it did not see start.
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
  // `on_loop_seen`, for tests only: called on pool thread `thread` after it
  // has seen a new loop and before it takes chunks of it (a test holds a
  // thread there to stand for preemption).
  explicit ThreadPool(int32_t num_threads, std::function<void(int32_t thread)> on_loop_seen = nullptr);
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
  // Runs chunks of loop `generation` until none is left to claim.
  void RunChunks(uint32_t generation, int32_t thread) ABSL_LOCKS_EXCLUDED(mu_);
  // Polls `ready` for up to kSpin; whether it became true.
  template <typename Ready>
  static bool Spin(Ready ready);

  const int32_t num_threads_;
  const std::function<void(int32_t)> on_loop_seen_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Explicit signals rather than Await: this wake-up is on the model's hot
  // path. A thread sleeps only after counting itself in sleepers_ and then
  // checking the word under mu_; the submitter publishes a loop and then
  // reads sleepers_ (both sequentially consistent), so it either sees the
  // sleeper and signals under mu_ or the sleeper sees the loop.
  absl::CondVar wake_;  // a new loop, or stop
  absl::CondVar done_;  // pending_ reached 0
  std::atomic<int32_t> sleepers_{0};
  std::atomic<bool> stop_{false};
  // The current loop: generation (high 32 bits), chunk count (next 16) and
  // the next unclaimed chunk (low 16). Claiming a chunk is a CAS that checks
  // the generation, so a late thread cannot claim a later loop's chunk for
  // the loop it saw.
  std::atomic<uint64_t> word_{0};
  std::atomic<int64_t> pending_{0};  // chunks of the current loop not yet done
  // Whether the submitter sleeps on done_: the last chunk's finisher signals
  // only then (the same ordering argument as sleepers_).
  std::atomic<bool> waiting_done_{false};
  uint32_t generation_ = 0;  // the submitting thread's last loop
  // The current loop's body, written by the submitting thread before it
  // publishes word_ (release) and read by a pool thread only after it has
  // claimed a chunk of that loop (acquire), which keeps the loop, and these,
  // alive until the chunk is done.
  const std::function<void(int64_t, int64_t, int32_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 1;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
