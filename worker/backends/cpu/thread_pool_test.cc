// ThreadPool: every item of every loop runs exactly once, whether the pool
// threads are still spinning when a loop arrives, have gone to sleep, or are
// held up (preempted) and arrive after the loop has finished.
#include "worker/backends/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

void ExpectEachItemOnce(ThreadPool& pool, int64_t count, int64_t grain) {
  std::vector<std::atomic<int32_t>> hits(count);
  std::atomic<int32_t> bad_thread{0};
  std::atomic<int32_t> unaligned{0};  // a unit not a whole multiple of `grain` items, but the last
  pool.ParallelFor(count, grain, [&](int64_t begin, int64_t end, int32_t thread) {
    if (thread < 0 || thread >= pool.num_threads()) bad_thread.fetch_add(1);
    if (begin % grain != 0 || ((end - begin) % grain != 0 && end != count)) unaligned.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i << " of " << count;
  EXPECT_EQ(bad_thread.load(), 0);
  EXPECT_EQ(unaligned.load(), 0);
}

TEST(ThreadPoolTest, BackToBackLoopsRunEveryItemOnce) {
  for (int32_t threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int loop = 0; loop < 2000; ++loop) ExpectEachItemOnce(pool, 1 + loop % 37, 1 + loop % 3);
  }
}

// SiluMul's shape at 39 prompt tokens: 59,904 floats in units of 4,096 (its
// vector code's tail would otherwise fall mid-array and change bits).
TEST(ThreadPoolTest, UnitsAreWholeGrains) {
  for (int32_t threads : {2, 3}) {
    ThreadPool pool(threads);
    ExpectEachItemOnce(pool, 39 * 1536, 4096);
    ExpectEachItemOnce(pool, 1000, 7);
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

// A pool thread that saw a loop and was then descheduled (held here) must not
// hold up that loop or the ones after it, and when it runs again it must not
// take chunks of a loop that has finished.
TEST(ThreadPoolTest, LoopsFinishWithoutAHeldThreadThatLaterArrivesHarmlessly) {
  constexpr int kLoops = 200;
  constexpr int kItems = 64;
  absl::Notification release;
  std::atomic<bool> held{false};
  std::vector<std::atomic<int32_t>> hits((kLoops + 1) * kItems);
  {
    ThreadPool pool(2, [&](int32_t) {
      if (!held.exchange(true)) release.WaitForNotification();
    });
    // With `meet`, the caller's chunks wait (polling, bounded) until the pool
    // thread has taken one, so the loop shows whether it takes part.
    auto run_loop = [&](int loop, bool meet) {
      std::atomic<bool> on_pool_thread{false};
      pool.ParallelFor(kItems, 1, [&, loop](int64_t begin, int64_t end, int32_t thread) {
        if (thread == 1) on_pool_thread.store(true);
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        while (meet && !on_pool_thread.load() && absl::Now() < deadline) std::this_thread::yield();
        for (int64_t i = begin; i < end; ++i) hits[loop * kItems + i].fetch_add(1);
      });
      return on_pool_thread.load();
    };
    std::atomic<bool> finished{false};
    std::thread submitter([&] {
      run_loop(0, /*meet=*/false);
      while (!held.load()) std::this_thread::yield();  // the pool thread saw a loop and is held
      for (int loop = 1; loop < kLoops; ++loop) run_loop(loop, /*meet=*/false);
      finished.store(true);
    });
    // Polls the state; the deadline only turns a hang into a failure.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!finished.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    const bool finished_while_held = finished.load();
    release.Notify();
    submitter.join();
    EXPECT_TRUE(finished_while_held) << "ParallelFor waited for a thread that took no chunk";
    // The held thread runs again with the first loop's view; it must take
    // no chunk of a finished loop and take part in the next one.
    EXPECT_TRUE(run_loop(kLoops, /*meet=*/true)) << "the released thread never took a chunk";
  }
  for (int i = 0; i < (kLoops + 1) * kItems; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "loop " << i / kItems << " item " << i % kItems;
  }
}

TEST(ThreadPoolTest, LessThanTwoUnitsRunsInlineOnTheCaller) {
  ThreadPool pool(4);
  std::vector<std::vector<int64_t>> calls;  // begin, end, thread
  pool.ParallelFor(15, 8, [&](int64_t begin, int64_t end, int32_t thread) {
    calls.push_back({begin, end, thread});
    EXPECT_EQ(pool.OwnerOf(begin), 0);
    EXPECT_EQ(pool.OwnerOf(end - 1), 0);
  });
  EXPECT_EQ(calls, (std::vector<std::vector<int64_t>>{{0, 15, 0}}));
}

// With the pool threads held at the loop's start, the caller runs its own
// range front to back and then the others' from the back: each thread's own
// share is one ascending stretch of the items.
TEST(ThreadPoolTest, TheCallerRunsItsRangeInOrderThenTakesTheOthersFromTheBack) {
  absl::Notification release;
  ThreadPool pool(2, [&](int32_t) { release.WaitForNotification(); });
  std::vector<int64_t> begins;
  std::vector<int32_t> owners;  // OwnerOf each unit's first and last item
  pool.ParallelFor(32 * ThreadPool::kUnitsPerThread, 1, [&](int64_t begin, int64_t end, int32_t thread) {
    if (thread != 0) return;
    begins.push_back(begin);
    owners.push_back(pool.OwnerOf(begin));
    owners.push_back(pool.OwnerOf(end - 1));
  });
  release.Notify();
  // OwnerOf names the range each unit came from: the caller's, then the
  // pool thread's that it took.
  std::vector<int32_t> expected_owners(32, 0);
  expected_owners.resize(64, 1);
  EXPECT_EQ(owners, expected_owners);
  // 32 units of 16 items: 0..15 the caller's, 16..31 the pool thread's.
  std::vector<int64_t> expected;
  for (int64_t unit = 0; unit < 16; ++unit) expected.push_back(unit * 16);
  for (int64_t unit = 31; unit >= 16; --unit) expected.push_back(unit * 16);
  EXPECT_EQ(begins, expected);
}

TEST(ThreadPoolTest, StatsCountPoolLoopsAndTheirBusyTime) {
  ThreadPool pool(2);
  pool.ParallelFor(64, 1, [](int64_t, int64_t, int32_t) {});  // before stats: not counted
  pool.EnableStats(true);
  for (int loop = 0; loop < 10; ++loop) ExpectEachItemOnce(pool, 64, 1);
  pool.ParallelFor(4, 8, [](int64_t, int64_t, int32_t) {});  // inline: not a pool loop
  const ThreadPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.loops, 10);
  EXPECT_GT(stats.loop_ticks, 0u);
  EXPECT_GT(stats.busy_ticks, 0u);
  // Busy time is spent inside loops, at most by both threads throughout.
  EXPECT_LE(stats.busy_ticks, 2 * stats.loop_ticks);
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
