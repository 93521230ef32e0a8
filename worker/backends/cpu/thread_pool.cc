#include "worker/backends/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace tandem::worker {

ThreadPool::ThreadPool(int32_t num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int32_t t = 1; t < num_threads_; ++t) threads_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_.store(true);
  }
  wake_.SignalAll();
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

void ThreadPool::RunChunks(int32_t thread) {
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= count_) return;
    (*fn_)(begin, std::min(begin + chunk_, count_), thread);
  }
}

void ThreadPool::WorkerLoop(int32_t thread) {
  uint64_t seen = 0;
  for (;;) {
    auto news = [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; };
    if (!Spin(news)) {
      absl::MutexLock lock(&mu_);
      while (!news()) wake_.Wait(&mu_);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    RunChunks(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      absl::MutexLock lock(&mu_);
      done_.Signal();
    }
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
  // A few chunks per thread balance uneven work without much contention.
  const int64_t chunks = std::min<int64_t>(count / grain, int64_t{num_threads_} * 4);
  fn_ = &fn;
  count_ = count;
  chunk_ = (count + chunks - 1) / chunks;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.SignalAll();  // cheap when every thread is still spinning
  RunChunks(0);
  auto done = [&] { return busy_.load(std::memory_order_acquire) == 0; };
  if (!Spin(done)) {
    absl::MutexLock lock(&mu_);
    while (!done()) done_.Wait(&mu_);
  }
  fn_ = nullptr;
}

}  // namespace tandem::worker
