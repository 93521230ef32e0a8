// FakeStageRunner: the worker's side of the step protocol with a model that
// costs nothing, for benchmarking the control plane (tandem-worker
// --fake-model; scheduler/README.md §6). It keeps the contract of
// ModelRunner and of the scheduler's FakeExecutor, minus the compute:
//
//  * a persistent batch: each SchedulerOutput is applied as a diff
//    (finished and preempted requests dropped, new and resumed ones added),
//    and a step whose num_computed_tokens disagree with the runner's is
//    refused;
//  * which rows sample is decided by common/sampling_rule.h;
//  * stage 0 feeds each row its tokens: a decode row's input is the token
//    this group sampled, which the scheduler never sends (placeholder
//    substitution); with pipeline stages it comes back from the last stage
//    over the worker-to-worker communicator, tagged with its step;
//  * the "hidden state" of a row is a running digest of every token of its
//    context (one 8-byte value per row, carried stage to stage over the
//    communicator); the last stage "samples" a token from it, so tokens
//    depend only on a request's context, whatever the batch;
//  * a request with logprobs >= 0 gets well-formed fake logprobs.
//
// The digest is kept per request and extended by the tokens each step
// computes, so a step costs O(rows), not O(context): what remains is the
// control plane's own cost. Block ids are accepted and not used. A request's
// state lives in a slot of a slab, found once per row when a step executes
// (when its diff is checked): a step's cached entries are mostly the last
// step's in the same order, so the slot is first guessed from there and
// checked by its id, and looked up by id only when the guess misses. The
// step's rows then name their slot and its generation, so sampling reaches
// it without another lookup (and a slot ended or reused since shows as a
// newer generation).
//
// Thread-compatible: the worker's compute thread.
#ifndef TANDEM_WORKER_SERVER_FAKE_STAGE_RUNNER_H_
#define TANDEM_WORKER_SERVER_FAKE_STAGE_RUNNER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/step.pb.h"
#include "worker/comm/communicator.h"

namespace tandem::worker {

struct FakeStageOptions {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t vocab_size = 32000;
  // Pipeline stages only (not owned): hidden digests r -> r + 1, sampled ids
  // last -> 0.
  Communicator* communicator = nullptr;
  absl::Duration peer_timeout = absl::Seconds(30);
};

class FakeStageRunner {
 public:
  explicit FakeStageRunner(FakeStageOptions options) : options_(options) {}

  absl::Status Execute(const v1::SchedulerOutput& step);
  // The last stage only: samples step `command.step_seq()` (the oldest
  // executed and not sampled) and returns the scheduler's message for it.
  absl::StatusOr<v1::ModelRunnerOutput> Sample(const v1::SampleCommand& command);

  size_t num_live_requests() const { return index_.size(); }
  // Tokens stage 0 knows for a live request (tests).
  std::vector<int32_t> Tokens(int64_t id) const;

 private:
  struct Slot {
    uint64_t generation = 0;      // 0: free
    int64_t id = 0;
    uint32_t entry = 0;           // its index in the last cached list naming it
    std::vector<int32_t> tokens;  // stage 0: prompt + sampled tokens received
    int32_t num_prompt = 0;
    int32_t total_len = 0;        // tokens known or being sampled
    int32_t num_computed = 0;
    uint64_t digest = 0;          // stage 0: of tokens [0, num_computed)
    int32_t logprobs = -1;
  };
  struct Row {
    int64_t id;
    uint32_t slot;
    uint64_t generation;
    bool samples;
    uint64_t digest;
  };
  struct Step {
    uint64_t seq;
    std::vector<Row> rows;  // the last stage: every row; stage 0: sampling rows
  };

  bool first_stage() const { return options_.rank == 0; }
  bool last_stage() const { return options_.rank == options_.world_size - 1; }
  absl::Status ApplyDiff(const v1::SchedulerOutput& step);
  absl::Status AddSlot(int64_t id, const int32_t* tokens, int32_t size, int32_t num_prompt, int32_t computed,
                       int32_t logprobs);
  void EraseSlot(int64_t id);
  // The live slot of `id`, or null.
  Slot* Find(int64_t id);
  // The row's slot if it still holds the row's request, or null.
  Slot* Live(const Row& row);
  // The slot of cached entry `i` (request `id`), guessed from the last
  // step's entries from `*cursor` on; kNoSlot when `id` is not live.
  uint32_t FindCached(int64_t id, uint32_t i, size_t* cursor);
  // Stage 0: receives from the last stage the sampled ids the slot lacks
  // for its next `count` tokens.
  absl::Status ReceiveTokens(Slot& slot, int32_t count);
  absl::Status ReceiveOldestTokens();
  void AppendToken(const Row& row, int32_t token);

  const FakeStageOptions options_;
  uint64_t next_generation_ = 1;
  static constexpr uint32_t kNoSlot = ~uint32_t{0};
  std::vector<Slot> slab_;
  std::vector<uint32_t> free_slots_;
  absl::flat_hash_map<int64_t, uint32_t> index_;  // live request -> its slot
  std::vector<uint32_t> cached_slots_;  // the step's cached rows' slots (kNoSlot: resumed)
  std::vector<uint32_t> last_cached_slots_;  // the step before's
  std::deque<Step> executed_;  // last stage: executed, not yet sampled
  std::deque<Step> incoming_;  // stage 0 of a pipeline: sampled ids not yet received
  std::vector<uint64_t> hidden_;
  std::vector<int32_t> token_message_;
  std::vector<int32_t> logprob_rows_;  // Sample's: each row's top-n, -1 for none
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_FAKE_STAGE_RUNNER_H_
