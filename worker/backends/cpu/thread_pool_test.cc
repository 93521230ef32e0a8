// ThreadPool: every item of every loop runs exactly once, whether the pool
// threads are still spinning when a loop arrives or have gone to sleep.
#include "worker/backends/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

void ExpectEachItemOnce(ThreadPool& pool, int64_t count, int64_t grain) {
  std::vector<std::atomic<int32_t>> hits(count);
  std::atomic<int32_t> bad_thread{0};
  pool.ParallelFor(count, grain, [&](int64_t begin, int64_t end, int32_t thread) {
    if (thread < 0 || thread >= pool.num_threads()) bad_thread.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i << " of " << count;
  EXPECT_EQ(bad_thread.load(), 0);
}

TEST(ThreadPoolTest, BackToBackLoopsRunEveryItemOnce) {
  for (int32_t threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int loop = 0; loop < 2000; ++loop) ExpectEachItemOnce(pool, 1 + loop % 37, 1 + loop % 3);
  }
}

TEST(ThreadPoolTest, LoopsAfterTheThreadsSleepRunEveryItemOnce) {
  ThreadPool pool(3);
  for (int loop = 0; loop < 20; ++loop) {
    // Longer than the spin: the pool threads block and must be woken.
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(4 * ThreadPool::kSpin));
    ExpectEachItemOnce(pool, 100, 1);
  }
}

TEST(ThreadPoolTest, ReturnsOnlyAfterSlowPoolThreadsFinish) {
  ThreadPool pool(2);
  for (int loop = 0; loop < 20; ++loop) {
    std::vector<std::atomic<int32_t>> hits(64);
    pool.ParallelFor(64, 1, [&](int64_t begin, int64_t end, int32_t thread) {
      // The pool thread gets chunks (the caller's are slow too) and takes
      // long enough over one that the caller runs out first and must wait.
      std::this_thread::sleep_for(std::chrono::microseconds(thread == 0 ? 100 : 1000));
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (int i = 0; i < 64; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
}

TEST(ThreadPoolTest, DestroyedWhileItsThreadsSpinOrSleep) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(4);
    ExpectEachItemOnce(pool, 16, 1);
    if (i % 2) std::this_thread::sleep_for(absl::ToChronoMicroseconds(4 * ThreadPool::kSpin));
  }
}

}  // namespace
}  // namespace tandem::worker
