// The sender's end of the compact control stream (proto/diff/step_diff.h):
// a step's per-row lists go out as a BatchDiff built in one pass straight
// from the engine's SchedulerOutput, instead of encoding every row into the
// full form and then diffing the message (that cost the engine thread about
// 56k instructions a step at 256 running). The bytes are the same as
// EncodeSchedulerOutput followed by StepDiffState::Compact.
//
// Thread-compatible.
#ifndef TANDEM_SCHEDULER_WIRE_COMPACT_STEP_H_
#define TANDEM_SCHEDULER_WIRE_COMPACT_STEP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "proto/diff/step_diff.h"
#include "scheduler/core/scheduler_output.h"
#include "tandem/v1/step.pb.h"

namespace tandem::scheduler {

class CompactStepEncoder {
 public:
  // A new epoch: nothing sent before counts.
  void Reset() { state_.Reset(); }

  // Completes `out`, which holds EncodeStepWithoutRows(step) (that part
  // needs no state, so a caller may encode it outside its lock): fills
  // `diff` and returns true, or, when the step does not fit the compact form,
  // adds the rows to `out` in full, clears `diff` and returns false.
  bool EncodeRows(const SchedulerOutput& step, v1::SchedulerOutput* out, v1::BatchDiff* diff);

  // The scheduled request ids of the step last encoded.
  absl::Span<const RequestId> rows() const { return ids_; }
  const wire::StepDiffState& state() const { return state_; }

 private:
  wire::StepDiffState state_;
  // Scratch, kept for its capacity.
  std::vector<int64_t> ids_;
  std::vector<int32_t> tokens_;
  std::vector<std::pair<int64_t, int32_t>> new_rows_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_COMPACT_STEP_H_
