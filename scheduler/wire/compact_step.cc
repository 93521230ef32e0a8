#include "scheduler/wire/compact_step.h"

#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {

bool CompactStepEncoder::EncodeRows(const SchedulerOutput& step, v1::SchedulerOutput* out, v1::BatchDiff* diff) {
  // The rows are an array of structs; the diff wants their ids and counts.
  const size_t n = step.scheduled.size();
  ids_.resize(n);
  tokens_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    ids_[r] = step.scheduled[r].id;
    tokens_[r] = step.scheduled[r].num_tokens;
  }
  new_rows_.clear();
  for (const NewRequestData& data : step.new_requests) new_rows_.emplace_back(data.id, data.num_computed_tokens);
  wire::SortNewRows(&new_rows_);
  const CachedRequestData& c = step.cached;
  wire::StepRows rows;
  rows.step_seq = step.step_seq;
  rows.ids = ids_;
  rows.tokens = tokens_;
  rows.cached_ids = c.request_ids;
  rows.cached_resumed = c.resumed;
  rows.cached_computed = c.num_computed_tokens;
  rows.cached_block_offsets = c.new_block_offsets;
  rows.new_rows = new_rows_;
  if (state_.CompactRows(rows, diff)) return true;
  EncodeStepRows(step, out);
  (void)state_.Record(*out);
  return false;
}

}  // namespace tandem::scheduler
