// FakeExecutor: a deterministic in-memory model runner for tests and
// `tandem trace`. It is a real implementation of the worker's side of the
// protocol, with a fake model whose tokens depend on the KV it reads:
//
//  * a persistent batch: it keeps each request's tokens and block table and
//    applies every SchedulerOutput as a diff (finished/preempted ids dropped,
//    new and resumed requests added, new block ids appended);
//  * a paged KV store, one cell per (block, offset), written only by the
//    steps that compute it, at the slot the request's block table gives.
//    A row attends to every position before and in it: it reads positions
//    [0, C) through the block table (prefix-cache hits included), and each
//    position it computes holds a hash of its token, its position and the
//    digest of everything attended before it (as a deeper layer's K/V does);
//  * the sampled token is a function of the digest of every attended cell,
//    so a block reused while another request's KV is still needed, a
//    prefix-cache hit on blocks whose KV was never written (or was written
//    for other tokens), or a wrong block table changes the output;
//  * a step's writes are in flight until the step is collected: they are
//    applied when it executes (later steps read them) and land again when it
//    is collected, as a write from a slower stage or transport would. A
//    block handed to another request before its last writer was processed
//    (a missing fence, scheduler/README.md §4.6) is overwritten under it;
//  * placeholder substitution: a decode row's input is the token this
//    executor sampled itself in the previous step; the scheduler sends none;
//  * which rows sample is decided by common/sampling_rule.h, as on a worker;
//  * "sampling" maps the digest to a token id (respecting a grammar mask),
//    unless `force_token` overrides it (to place EOS at a given position);
//  * a request with SamplingParams::logprobs = n >= 0 gets well-formed fake
//    logprobs: a value <= 0 derived from the digest, and n top entries led by
//    the sampled token itself, the others being the next ids with values
//    1, 2, ... lower.
//
// With correct scheduling, tokens therefore depend only on a request's
// context, which is what lets sync, async and preempting runs be compared
// token for token (scheduler_differential_test, tools/bench/scheduler_fuzz).
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

  // The token the rule produces after a context whose digest is `digest`.
  TokenId RuleToken(uint64_t digest) const;
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
    uint64_t digest;  // of every cell the row attended to
  };
  struct KvWrite {
    size_t cell;
    uint64_t value;
  };
  struct PendingStep {
    StepSeq seq;
    std::vector<PendingRow> rows;
    std::vector<KvWrite> writes;  // land again when the step is collected
    bool sampled = false;
    ModelRunnerOutput output;
  };

  absl::Status ApplyDiff(const SchedulerOutput& step);
  // Computes positions [start, start + count) of a request: reads [0, start),
  // writes the new cells (recording them in `writes`) and returns the digest.
  absl::StatusOr<uint64_t> Forward(RequestId id, const Slot& slot, int32_t start, int32_t count,
                                   std::vector<KvWrite>* writes);
  absl::StatusOr<size_t> CellIndex(const Slot& slot, int32_t position) const;
  void Log(const char* what, StepSeq seq);

  FakeExecutorOptions options_;
  std::vector<uint64_t> kv_;  // one cell per (block, offset); 0 = never written
  absl::flat_hash_map<RequestId, Slot> slots_;
  std::deque<PendingStep> pending_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_TESTING_FAKE_EXECUTOR_H_
