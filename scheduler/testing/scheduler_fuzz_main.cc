// scheduler_fuzz: the differential campaign of scheduler/README.md §10 at
// scale, outside the default test run (scheduler_differential_test runs a
// sample of it in CI). Workload i uses seed S + i
// (scheduler/testing/differential.h): random configs with small pools, FCFS
// and priority, prefix caching on and off, arrivals, aborts and stop strings,
// run synchronously at queue depth 1 as the reference and in every mode
// (sync behind batch queues of 2-4, async at depths 2-4, pipeline cadences 2
// and 3), with the invariant checker at every step boundary.
//
//   build/bin/scheduler_fuzz --workloads 10000 --seed 0
//
// Prints workloads run, engine runs, steps checked and mismatches; exits 1
// after a mismatch, printing each one with the command that reproduces it.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "scheduler/testing/differential.h"

namespace tandem::scheduler::testing {
namespace {

struct Args {
  uint32_t workloads = 10000;
  uint32_t seed = 0;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    uint32_t* target = flag == "--workloads" ? &args->workloads : flag == "--seed" ? &args->seed : nullptr;
    if (target == nullptr || i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], target)) {
      std::fprintf(stderr, "usage: scheduler_fuzz [--workloads N] [--seed S]  (bad or unknown: %s)\n", argv[i]);
      return false;
    }
    ++i;
  }
  return true;
}

int Run(const Args& args) {
  constexpr int64_t kMaxPrinted = 10;
  const auto start = std::chrono::steady_clock::now();
  DifferentialTally tally;
  for (uint32_t i = 0; i < args.workloads; ++i) {
    const uint32_t seed = args.seed + i;
    absl::Status s = RunDifferential(MakeRandomWorkload(seed), DifferentialOptions{}, &tally);
    if (!s.ok() && tally.mismatches <= kMaxPrinted) {
      std::printf("MISMATCH %s\n  reproduce: scheduler_fuzz --seed %u --workloads 1\n",
                  std::string(s.message()).c_str(), seed);
    }
    if ((i + 1) % 1000 == 0) {
      std::fprintf(stderr, "%u/%u workloads, %lld mismatches\n", i + 1, args.workloads,
                   static_cast<long long>(tally.mismatches));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("workloads %lld (seeds %u..%u), engine runs %lld, steps checked %lld, mismatches %lld\n",
              static_cast<long long>(tally.workloads), args.seed, args.seed + args.workloads - 1,
              static_cast<long long>(tally.runs), static_cast<long long>(tally.steps_checked),
              static_cast<long long>(tally.mismatches));
  std::printf("exercised: %lld preemptions, %lld stale tokens delivered, %lld aborted requests, %lld stop strings "
              "and %lld stop tokens (reference), %lld wasted rows; %.1f s\n",
              static_cast<long long>(tally.preemptions), static_cast<long long>(tally.stale_tokens),
              static_cast<long long>(tally.aborted), static_cast<long long>(tally.stop_strings),
              static_cast<long long>(tally.stopped), static_cast<long long>(tally.wasted_rows), seconds);
  return tally.mismatches == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem::scheduler::testing

int main(int argc, char** argv) {
  tandem::scheduler::testing::Args args;
  if (!tandem::scheduler::testing::ParseArgs(argc, argv, &args)) return 2;
  return tandem::scheduler::testing::Run(args);
}
