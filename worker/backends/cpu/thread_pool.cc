#include "worker/backends/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace tandem::worker {
namespace {

// A range word's fields.
constexpr int64_t kMaxUnits = 0xffff;
uint32_t Generation(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
int64_t Front(uint64_t word) { return static_cast<int64_t>((word >> 16) & kMaxUnits); }
int64_t Back(uint64_t word) { return static_cast<int64_t>(word & kMaxUnits); }
uint64_t RangeWord(uint32_t generation, int64_t front, int64_t back) {
  return uint64_t{generation} << 32 | static_cast<uint64_t>(front) << 16 | static_cast<uint64_t>(back);
}

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads, std::function<void(int32_t)> on_loop_seen)
    : num_threads_(std::max(1, num_threads)),
      on_loop_seen_(std::move(on_loop_seen)),
      ranges_(num_threads_),
      busy_ticks_(num_threads_) {
  for (int32_t t = 1; t < num_threads_; ++t) threads_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_.store(true);
    wake_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

template <typename Ready>
bool ThreadPool::Spin(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(kSpin);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    _mm_pause();
    if (i % 16 == 15 && std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

int64_t ThreadPool::Claim(std::atomic<uint64_t>& range, uint32_t generation, bool front) {
  uint64_t word = range.load(std::memory_order_acquire);
  for (;;) {
    if (Generation(word) != generation || Front(word) >= Back(word)) return -1;
    // Success means loop `generation` is still running and this unit is
    // ours: the loop cannot finish (nor its Range fields change) until it is
    // done. One unit at a time, so that a thread preempted in the middle of
    // its range holds up no more than one unit.
    const uint64_t claimed = front ? word + (uint64_t{1} << 16) : word - 1;
    if (range.compare_exchange_weak(word, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return front ? Front(word) : Back(word) - 1;
    }
  }
}

void ThreadPool::RunUnits(uint32_t generation, int32_t thread) {
  int64_t done = 0;
  const bool stats = stats_on_.load(std::memory_order_relaxed);
  const uint64_t start = stats ? __rdtsc() : 0;
  // This thread's copy of the loop, read after a claim of loop `generation`
  // (its own range's word carried that generation, so the copy is that
  // loop's).
  const Range& own = ranges_[thread];
  auto run = [&](int64_t unit) {
    const int64_t begin = unit * own.unit;
    (*own.fn)(begin, std::min(begin + own.unit, own.count), thread);
    ++done;
  };
  for (int64_t unit; (unit = Claim(ranges_[thread].word, generation, /*front=*/true)) >= 0;) run(unit);
  for (int32_t i = 1; i < num_threads_; ++i) {
    std::atomic<uint64_t>& other = ranges_[(thread + i) % num_threads_].word;
    for (int64_t unit; (unit = Claim(other, generation, /*front=*/false)) >= 0;) run(unit);
  }
  if (done > 0 && stats) busy_ticks_[thread].busy.fetch_add(__rdtsc() - start, std::memory_order_relaxed);
  // Counted once, at the end: a shared counter touched per unit would cost
  // the cache line that the ranges avoid.
  if (done > 0 && pending_.fetch_sub(done) == done && waiting_done_.load()) {
    absl::MutexLock lock(&mu_);
    done_.Signal();
  }
}

void ThreadPool::WorkerLoop(int32_t thread) {
  uint32_t seen = 0;
  const std::atomic<uint64_t>& word = ranges_[thread].word;
  for (;;) {
    auto news = [&] { return stop_.load() || Generation(word.load()) != seen; };
    if (!Spin(news)) {
      absl::MutexLock lock(&mu_);
      sleepers_.fetch_add(1);
      while (!news()) wake_.Wait(&mu_);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = Generation(word.load(std::memory_order_acquire));
    if (on_loop_seen_) on_loop_seen_(thread);
    RunUnits(seen, thread);
  }
}

void ThreadPool::ParallelFor(int64_t count, int64_t grain,
                             const std::function<void(int64_t, int64_t, int32_t)>& fn) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t target = std::min({count / grain, int64_t{num_threads_} * kUnitsPerThread, kMaxUnits});
  if (num_threads_ == 1 || target < 2) {
    units_ = 0;  // inline: OwnerOf says 0
    fn(0, count, 0);
    return;
  }
  const bool stats = stats_on_.load(std::memory_order_relaxed);
  const uint64_t start = stats ? __rdtsc() : 0;
  // Whole multiples of the grain: a caller whose items are vector lanes
  // (SiluMul's grain of 4096 floats) gets the same bits whatever the split.
  const int64_t unit = ((count + target - 1) / target + grain - 1) / grain * grain;
  const int64_t units = (count + unit - 1) / unit;
  units_ = units;
  pending_.store(units, std::memory_order_relaxed);
  ++generation_;
  // Thread 0's range first: a pool thread that sees its own may steal from it.
  for (int32_t t = 0; t < num_threads_; ++t) {
    Range& r = ranges_[t];
    r.fn = &fn;
    r.count = count;
    r.unit = unit;
    const uint64_t word = RangeWord(generation_, units * t / num_threads_, units * (t + 1) / num_threads_);
    // The pool threads' words sequentially consistent: they publish the
    // fields above, and order the publication before reading sleepers_.
    r.word.store(word, t == 0 ? std::memory_order_relaxed : std::memory_order_seq_cst);
  }
  if (sleepers_.load() > 0) {
    absl::MutexLock lock(&mu_);
    wake_.SignalAll();
  }
  RunUnits(generation_, 0);
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!Spin(done)) {
    absl::MutexLock lock(&mu_);
    waiting_done_.store(true);
    while (!done()) done_.Wait(&mu_);
    waiting_done_.store(false);
  }
  if (stats) {
    ++stat_loops_;
    stat_loop_ticks_ += __rdtsc() - start;
  }
}

int32_t ThreadPool::OwnerOf(int64_t item) const {
  if (units_ == 0) return 0;
  // Thread t's range is units [units * t / threads, units * (t + 1) / threads).
  const int64_t unit = item / ranges_[0].unit;
  int32_t t = static_cast<int32_t>(unit * num_threads_ / units_);
  while (t + 1 < num_threads_ && units_ * (t + 1) / num_threads_ <= unit) ++t;
  while (t > 0 && units_ * t / num_threads_ > unit) --t;
  return t;
}

ThreadPool::Stats ThreadPool::stats() const {
  Stats s;
  s.loops = stat_loops_;
  s.loop_ticks = stat_loop_ticks_;
  for (const Ticks& t : busy_ticks_) s.busy_ticks += t.busy.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tandem::worker
