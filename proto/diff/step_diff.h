// The compact form of the control stream (issue 13 item 6): at steady-state
// decode a running request costs about nothing down and one token up.
//
// Down: a step's per-row lists (scheduling order, tokens per row, and the
// cached entries' ids, resumed flags, computed counts and block counts) are
// sent as a BatchDiff (worker_service.proto) against what both ends predict
// from the steps before: the order of one of the last few steps minus the
// rows that left plus the ones that joined, one token per row, a computed
// count of what the request had plus what it was last scheduled for, not
// resumed, no new blocks. Only what differs from that travels. The base can
// be any of the last kMaxBase steps, so with PP 2, where a request decodes
// every other step, the step two back is the base.
//
// Up: a result's rows are the step's scheduled rows in order, so its request
// ids stay home, and when every row sampled at most one token, a bit per row
// replaces the counts.
//
// Each end of a stream keeps one StepDiffState, fed every step in stream
// order (CompactRows or Compact on the sender, Expand or Record on each
// receiver), and resets it with the group's epoch. Predictions are deterministic functions
// of the steps seen, so both ends agree; a diff that does not fit what the
// receiver holds is refused with InvalidArgument, never guessed at.
//
// Lives beside the generated protocol because both the scheduler
// (scheduler/wire/) and the worker (worker/server/) use it and neither may
// include the other (tools/check_layering.sh).
//
// Thread-compatible.
#ifndef TANDEM_PROTO_DIFF_STEP_DIFF_H_
#define TANDEM_PROTO_DIFF_STEP_DIFF_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "tandem/v1/worker_service.pb.h"

namespace tandem::wire {

// One step's rows as the sender holds them (the scheduler's own arrays), so
// that the diff is built in one pass without encoding every row first.
struct StepRows {
  uint64_t step_seq = 0;
  absl::Span<const int64_t> ids;     // the scheduled rows, in order
  absl::Span<const int32_t> tokens;  // tokens scheduled per row
  // The cached entries, parallel lists; entry j's new blocks number
  // cached_block_offsets[j + 1] - cached_block_offsets[j].
  absl::Span<const int64_t> cached_ids;
  absl::Span<const uint8_t> cached_resumed;
  absl::Span<const int32_t> cached_computed;
  absl::Span<const int32_t> cached_block_offsets;
  // The new requests' (id, num_computed_tokens), in ascending id order; of
  // entries with the same id the last counts (SortNewRows does both).
  absl::Span<const std::pair<int64_t, int32_t>> new_rows;
};

// Sorts new requests' (id, computed) by id, keeping the order of equal ids.
void SortNewRows(std::vector<std::pair<int64_t, int32_t>>* rows);

class StepDiffState {
 public:
  // Bases a diff may name (the steps before, most recent first).
  static constexpr int kMaxBase = 4;
  // Steps whose rows are kept: bases, and results still to come back.
  static constexpr int kHistory = 16;

  StepDiffState();

  // A new epoch: nothing sent before counts.
  void Reset();

  // Sender: moves the per-row lists of the full-form `step` into `diff` and
  // clears them. Returns false (the step left in full form, `diff` cleared)
  // when its cached entries are not its non-new scheduled rows in order.
  bool Compact(v1::SchedulerOutput* step, v1::BatchDiff* diff);
  // Sender, from the scheduler's arrays: fills `diff` with exactly what
  // Compact would for the same step. Returns false (nothing remembered,
  // `diff` cleared) when the step does not fit the compact form; the caller
  // then sends it in full and Records it.
  bool CompactRows(const StepRows& rows, v1::BatchDiff* diff);
  // Receiver: rebuilds the per-row lists of a compacted step.
  absl::Status Expand(const v1::BatchDiff& diff, v1::SchedulerOutput* step);
  // Receiver of a step in full form: remembers it for the diffs that follow.
  absl::Status Record(const v1::SchedulerOutput& step);

  // The scheduled request ids of a step still in the history; null if not.
  const std::vector<int64_t>* Rows(uint64_t step_seq) const;

 private:
  struct Step {
    uint64_t step_seq = 0;
    std::vector<int64_t> ids;
    // What each row's request will have computed after this step; -1 unknown.
    std::vector<int32_t> next_computed;
  };
  // How `ids` starts from base `base` (1-based): its removed positions, the
  // rows kept, and the cost in list entries; gives up once over `limit`.
  struct Match {
    int base = 0;
    int64_t cost = 0;
  };
  Match TryBase(int base, absl::Span<const int64_t> ids, int64_t limit);
  const Step* Base(int base) const;  // 1: the previous step
  // Sorts the new requests' ids into new_ids_ for IsNew.
  void CollectNewIds(const v1::SchedulerOutput& step);
  bool IsNew(int64_t id) const;
  // The computed count of each row (the cached entry's or the new request's;
  // -1 if neither), into computed_.
  void RowComputed(const v1::SchedulerOutput& step);
  void Remember(uint64_t step_seq, absl::Span<const int64_t> ids, absl::Span<const int32_t> tokens);
  // Makes room for the newest step and returns it, its ids set.
  Step& Advance(uint64_t step_seq, absl::Span<const int64_t> ids);

  std::vector<Step> ring_;  // kHistory entries; the newest at head_
  int head_ = 0;
  int count_ = 0;
  // Scratch, kept for its capacity.
  std::vector<int64_t> new_ids_;
  std::vector<int32_t> computed_;
  std::vector<int32_t> predicted_;
  std::vector<int64_t> ids_;
  std::vector<int32_t> tokens_;
  // Compact's view of a full-form step, for CompactRows.
  std::vector<uint8_t> resumed_;
  std::vector<int32_t> block_offsets_;
  std::vector<std::pair<int64_t, int32_t>> new_rows_;
};

// Result side (stateless): drops the request ids, and the counts when a bit
// per row says the same.
void CompactResult(v1::StepResult* result);
// Gives a compact result back its request ids (the step's scheduled rows)
// and counts; a full-form result is left as it is.
absl::Status ExpandResult(absl::Span<const int64_t> rows, v1::StepResult* result);

}  // namespace tandem::wire

#endif  // TANDEM_PROTO_DIFF_STEP_DIFF_H_
