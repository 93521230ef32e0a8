// ThreadPool: a fixed set of threads for data-parallel loops. ParallelFor
// splits [0, count) into units that the pool threads and the calling thread
// run, and returns when all are done. Work is only ever submitted by one
// thread (the worker's compute thread), one loop at a time.
//
// A forward pass runs about five loops per layer, tens of microseconds apart.
// A thread that has finished its part spins for up to `kSpin` before it
// sleeps, so the next loop reaches it without a futex wake, which costs tens
// of microseconds on a VM; between steps the threads sleep.
//
// Each thread owns an equal, contiguous range of a loop's units and runs it
// from the front; a thread that has run out takes units from the back of the
// others' ranges. So each thread streams one contiguous stretch of a weight
// matrix (its prefetches run ahead into its own next unit), its claims touch
// a cache line that no other thread writes until the loop's tail, and units
// can be small enough (about kUnitsPerThread per thread) that the tail where
// one thread waits for another is short. (Chunks claimed in turn from one
// shared counter cost a contended cache line per chunk, so they had to be
// few: a batch-1 decode step's threads then idled about 6% of each loop,
// waiting out the last chunk.)
//
// The pool tolerates preemption: ParallelFor waits for the loop's units, not
// for its threads. A pool thread that is descheduled before it takes a unit
// (the scheduler and API processes share these cores in `tandem serve`)
// holds nothing up: the others take its range. A range is one word holding
// the loop's generation and the range's front and back, claimed by CAS, so a
// thread that runs again after its loop has finished sees the generation
// move on and takes nothing from a loop it did not see start.
//
// Thread-safe for one submitting thread; the pool threads only run units.
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
  // Units per thread in a loop of enough items.
  static constexpr int64_t kUnitsPerThread = 16;

  // `num_threads` counts the caller: 1 runs everything inline.
  // `on_loop_seen`, for tests only: called on pool thread `thread` after it
  // has seen a new loop and before it takes chunks of it (a test holds a
  // thread there to stand for preemption).
  explicit ThreadPool(int32_t num_threads, std::function<void(int32_t thread)> on_loop_seen = nullptr);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return num_threads_; }

  // Where the threads' time goes, for benchmarks: counted (in TSC ticks)
  // only while enabled, so that the hot path pays a predicted branch.
  struct Stats {
    int64_t loops = 0;        // ParallelFor calls that used the pool
    uint64_t loop_ticks = 0;  // the submitter's time inside them
    uint64_t busy_ticks = 0;  // every thread's time running (and claiming) units
  };
  void EnableStats(bool on) { stats_on_.store(on, std::memory_order_relaxed); }
  // Only between loops (the submitting thread).
  Stats stats() const;

  // Calls fn(begin, end, thread) over [0, count) in units of a whole
  // multiple of `grain` items (the last may be smaller); `thread` is in
  // [0, num_threads()) and identifies per-thread scratch space. Fewer than
  // two units' worth runs inline.
  void ParallelFor(int64_t count, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int32_t thread)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Inside the current loop's fn only: the thread whose own range holds
  // `item`, which runs it unless another thread has taken it (a loop
  // small enough to run inline is thread 0's). A thread can ask for the
  // inputs of an item it will likely run next.
  int32_t OwnerOf(int64_t item) const;

 private:
  void WorkerLoop(int32_t thread) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs units of loop `generation`, its own range's and then the others',
  // until none is left to claim.
  void RunUnits(uint32_t generation, int32_t thread) ABSL_LOCKS_EXCLUDED(mu_);
  // Claims a unit of `range` for loop `generation`, from the front (the
  // owner) or the back (a thief); -1 when none is left.
  static int64_t Claim(std::atomic<uint64_t>& range, uint32_t generation, bool front);
  // Polls `ready` for up to kSpin; whether it became true.
  template <typename Ready>
  static bool Spin(Ready ready);

  const int32_t num_threads_;
  const std::function<void(int32_t)> on_loop_seen_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Explicit signals rather than Await: this wake-up is on the model's hot
  // path. A thread sleeps only after counting itself in sleepers_ and then
  // checking its range's generation under mu_; the submitter publishes a
  // loop in the ranges and then reads sleepers_ (both sequentially
  // consistent), so it either sees the sleeper and signals under mu_ or the
  // sleeper sees the loop.
  absl::CondVar wake_;  // a new loop, or stop
  absl::CondVar done_;  // pending_ reached 0
  std::atomic<int32_t> sleepers_{0};
  std::atomic<bool> stop_{false};
  // Thread t's part of the current loop, one cache line each, so that a
  // pool thread that sees a new loop gets everything it needs in one
  // transfer from the submitting core: the loop's body, items and unit
  // (written by the submitting thread before the word), and the range word:
  // the loop's generation (high 32 bits), front (next 16) and back (low 16),
  // units [front, back). A pool thread polls its own word for a new
  // generation. Claiming a unit is a CAS that checks the generation, so a
  // late thread cannot claim a later loop's unit for the loop it saw; the
  // body is read only after a claim (acquire), which keeps the loop, and
  // these, alive until the unit is done.
  struct alignas(64) Range {
    std::atomic<uint64_t> word{0};
    const std::function<void(int64_t, int64_t, int32_t)>* fn = nullptr;
    int64_t count = 0;
    int64_t unit = 1;
  };
  std::vector<Range> ranges_;
  alignas(64) std::atomic<int64_t> pending_{0};  // units of the current loop not yet done
  // Whether the submitter sleeps on done_: the last unit's finisher signals
  // only then (the same ordering argument as sleepers_).
  std::atomic<bool> waiting_done_{false};
  uint32_t generation_ = 0;  // the submitting thread's last loop
  int64_t units_ = 1;        // the current loop's units; 0 when it runs inline
  std::atomic<bool> stats_on_{false};
  struct alignas(64) Ticks {
    std::atomic<uint64_t> busy{0};
  };
  std::vector<Ticks> busy_ticks_;  // per thread
  int64_t stat_loops_ = 0;
  uint64_t stat_loop_ticks_ = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_THREAD_POOL_H_
