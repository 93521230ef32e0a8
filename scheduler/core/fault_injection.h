// Deliberate scheduler defects, to prove that the tests can fail: the
// differential test must tell a broken scheduler from a correct one by its
// tokens alone (scheduler/testing/fault_injection_test.cc).
//
// The faults exist only in the test-only library tandem_scheduler_core_faults,
// compiled with TANDEM_SCHEDULER_FAULT_INJECTION. Everywhere else
// kFaultInjection is false, every `kFaultInjection && fault_ == ...` folds to
// false, and InjectFaultForTest() has no effect.
#ifndef TANDEM_SCHEDULER_CORE_FAULT_INJECTION_H_
#define TANDEM_SCHEDULER_CORE_FAULT_INJECTION_H_

namespace tandem::scheduler {

#ifdef TANDEM_SCHEDULER_FAULT_INJECTION
inline constexpr bool kFaultInjection = true;
#else
inline constexpr bool kFaultInjection = false;
#endif

enum class SchedulerFault {
  kNone,
  // Fencing: a request's blocks go back to the pool at once even while a
  // step in flight may still write them (scheduler/README.md §4.6).
  kNoFence,
  // Hash registration: when a step is planned, every block the request's
  // known tokens fill is registered, also the part of a prefill that this
  // step does not compute (§4.5: only KV an emitted step computes).
  kEarlyHashes,
  // Block freeing: freeing a request's blocks drops every reference on them,
  // so a block shared through a prefix-cache hit returns to the pool while
  // other requests still read it.
  kFreeSharedBlocks,
};

inline const char* SchedulerFaultName(SchedulerFault fault) {
  switch (fault) {
    case SchedulerFault::kNone: return "none";
    case SchedulerFault::kNoFence: return "no fence";
    case SchedulerFault::kEarlyHashes: return "early hashes";
    case SchedulerFault::kFreeSharedBlocks: return "free shared blocks";
  }
  return "?";
}

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_FAULT_INJECTION_H_
