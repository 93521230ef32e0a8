// FakeExecutor: a deterministic in-memory model runner for tests and
// `tandem trace`. It is a real implementation of the worker's side of the
// protocol, minus the neural network:
//
//  * a persistent batch: it keeps each request's tokens and block table and
//    applies every SchedulerOutput as a diff (finished/preempted ids dropped,
//    new and resumed requests added, new block ids appended);
//  * paged "KV": every position's cell, addressed through the block table the
//    scheduler allocated, holds a hash of the token there and of the cell
//    before it. A step reads the previous cell through the block table, so a
//    wrong block, a block reused while still live, or a bad prefix-cache hit
//    changes every later token;
//  * placeholder substitution: a decode row's input is the token this
//    executor sampled itself in the previous step; the scheduler sends none;
//  * which rows sample is decided by common/sampling_rule.h, as on a worker;
//  * "sampling" maps the last cell to a token id (respecting a grammar mask),
//    unless `force_token` overrides it (to place EOS at a given position);
//  * a request with SamplingParams::logprobs = n >= 0 gets well-formed fake
//    logprobs: a value <= 0 derived from the cell, and n top entries led by
//    the sampled token itself, the others being the next ids with values
//    1, 2, ... lower.
//
// Tokens therefore depend only on a request's context, which is what lets
// sync, async and preempting runs be compared token for token.
//
// Thread-compatible: called from the engine thread only.
#ifndef TANDEM_SCHEDULER_TESTING_FAKE_EXECUTOR_H_
#define TANDEM_SCHEDULER_TESTING_FAKE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/core/executor.h"

namespace tandem::scheduler {

// One sampled token, as the executor produced it.
struct SampleRecord {
  RequestId id = 0;
  int32_t position = 0;  // index of the token in the request's sequence
  TokenId token = 0;
};

struct FakeExecutorOptions {
  int32_t num_blocks = 4096;
  int32_t block_size = 16;
  int32_t vocab_size = 32000;
  // Overrides the sampled token of output number `output_index` (1-based) of
  // request `id`; nullopt keeps the rule's token.
  std::function<std::optional<TokenId>(RequestId id, int32_t output_index)> force_token;
  // Appends "execute N", "sample N", "collect N" to `call_log` if set.
  std::vector<std::string>* call_log = nullptr;
  // Appends every sampled token if set.
  std::vector<SampleRecord>* sample_log = nullptr;
};

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(FakeExecutorOptions options);

  absl::Status Execute(const SchedulerOutput& step) override;
  absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) override;
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) override;

  // The token the rule produces after a context whose last cell is `cell`.
  TokenId RuleToken(uint64_t cell) const;
  // Requests the executor holds state for (tests: finished ones are dropped).
  size_t num_slots() const { return slots_.size(); }

 private:
  struct Slot {
    std::vector<TokenId> tokens;  // prompt + every token sampled here
    int32_t num_prompt_tokens = 0;
    std::vector<BlockId> blocks;
    int32_t logprobs = -1;  // SamplingParams::logprobs
  };
  struct PendingRow {
    RequestId id;
    bool samples;
    uint64_t last_cell;
  };
  struct PendingStep {
    StepSeq seq;
    std::vector<PendingRow> rows;
    bool sampled = false;
    ModelRunnerOutput output;
  };

  absl::Status ApplyDiff(const SchedulerOutput& step);
  absl::StatusOr<uint64_t> Forward(RequestId id, Slot& slot, int32_t start, int32_t count);
  absl::StatusOr<uint64_t*> Cell(const Slot& slot, int32_t position);
  void Log(const char* what, StepSeq seq);

  FakeExecutorOptions options_;
  std::vector<uint64_t> kv_;  // one cell per (block, offset)
  absl::flat_hash_map<RequestId, Slot> slots_;
  std::deque<PendingStep> pending_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_TESTING_FAKE_EXECUTOR_H_
