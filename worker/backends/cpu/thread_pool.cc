#include "worker/backends/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace tandem::worker {
namespace {

// word_'s fields.
constexpr int64_t kMaxChunks = 0xffff;
uint32_t Generation(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
int64_t Chunks(uint64_t word) { return static_cast<int64_t>((word >> 16) & kMaxChunks); }
int64_t NextChunk(uint64_t word) { return static_cast<int64_t>(word & kMaxChunks); }
uint64_t LoopWord(uint32_t generation, int64_t chunks) {
  return uint64_t{generation} << 32 | static_cast<uint64_t>(chunks) << 16;
}

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads, std::function<void(int32_t)> on_loop_seen)
    : num_threads_(std::max(1, num_threads)), on_loop_seen_(std::move(on_loop_seen)) {
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

void ThreadPool::RunChunks(uint32_t generation, int32_t thread) {
  uint64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    if (Generation(word) != generation || NextChunk(word) >= Chunks(word)) return;
    // Success means loop `generation` is still running and this chunk is
    // ours: the loop cannot finish (nor fn_ change) until it is done.
    if (!word_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      continue;
    }
    const int64_t begin = NextChunk(word) * chunk_;
    (*fn_)(begin, std::min(begin + chunk_, count_), thread);
    if (pending_.fetch_sub(1) == 1 && waiting_done_.load()) {
      absl::MutexLock lock(&mu_);
      done_.Signal();
    }
    ++word;  // the CAS's next expected value; a failure reloads it
  }
}

void ThreadPool::WorkerLoop(int32_t thread) {
  uint32_t seen = 0;
  for (;;) {
    auto news = [&] { return stop_.load() || Generation(word_.load()) != seen; };
    if (!Spin(news)) {
      absl::MutexLock lock(&mu_);
      sleepers_.fetch_add(1);
      while (!news()) wake_.Wait(&mu_);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = Generation(word_.load(std::memory_order_acquire));
    if (on_loop_seen_) on_loop_seen_(thread);
    RunChunks(seen, thread);
  }
}

void ThreadPool::ParallelFor(int64_t count, int64_t grain,
                             const std::function<void(int64_t, int64_t, int32_t)>& fn) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || count <= grain) {
    fn(0, count, 0);
    return;
  }
  // A few chunks per thread balance uneven work (and a preempted thread's
  // share) without much contention.
  const int64_t target = std::min({count / grain, int64_t{num_threads_} * 4, kMaxChunks});
  chunk_ = (count + target - 1) / target;
  const int64_t chunks = (count + chunk_ - 1) / chunk_;
  fn_ = &fn;
  count_ = count;
  pending_.store(chunks, std::memory_order_relaxed);
  ++generation_;
  word_.store(LoopWord(generation_, chunks));  // publishes the fields above
  if (sleepers_.load() > 0) {
    absl::MutexLock lock(&mu_);
    wake_.SignalAll();
  }
  RunChunks(generation_, 0);
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!Spin(done)) {
    absl::MutexLock lock(&mu_);
    waiting_done_.store(true);
    while (!done()) done_.Wait(&mu_);
    waiting_done_.store(false);
  }
  fn_ = nullptr;
}

}  // namespace tandem::worker
