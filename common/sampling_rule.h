// The one rule that decides whether a scheduled row produces a sampled token
// (scheduler/README.md §4.2). The scheduler uses it to reserve a placeholder,
// the worker uses it to decide which rows sample. Two rules that disagree are
// the root of placeholder underflow (vLLM issues 30142, 57562), so both sides
// call this function and nothing else.
#ifndef TANDEM_COMMON_SAMPLING_RULE_H_
#define TANDEM_COMMON_SAMPLING_RULE_H_

#include <cstdint>

namespace tandem {

// `computed_before`: tokens already computed or scheduled before this step;
// `scheduled`: tokens scheduled in this step; `sequence_length`: every token
// the request has, committed or still in flight (scheduler: N + ph before this
// step's placeholder; worker: prompt + every token it has sampled).
// A row samples iff the step reaches the end of the sequence; otherwise it is a
// prefill chunk and its logits are discarded.
inline bool StepSamples(int64_t computed_before, int64_t scheduled, int64_t sequence_length) {
  return computed_before + scheduled >= sequence_length;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SAMPLING_RULE_H_
