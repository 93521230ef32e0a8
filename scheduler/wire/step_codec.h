// Conversion between the engine's step structs (scheduler_output.h) and the
// wire messages of proto/tandem/v1/step.proto. Decoding validates what a peer
// sent (parallel-list lengths, counts) and returns InvalidArgument instead of
// trusting it; a runner output's logprobs must come one per sampled token of
// a row (or none) with the same number of top entries after each.
// ScheduledRequest::samples does not travel: the worker derives
// it from common/sampling_rule.h.
#ifndef TANDEM_SCHEDULER_WIRE_STEP_CODEC_H_
#define TANDEM_SCHEDULER_WIRE_STEP_CODEC_H_

#include "absl/status/statusor.h"
#include "scheduler/core/scheduler_output.h"
#include "tandem/v1/step.pb.h"

namespace tandem::scheduler {

void EncodeSamplingParams(const SamplingParams& params, bool structured_output, v1::SamplingParams* out);
SamplingParams DecodeSamplingParams(const v1::SamplingParams& in);

void EncodeSchedulerOutput(const SchedulerOutput& step, v1::SchedulerOutput* out);
// EncodeSchedulerOutput in two parts: everything but the per-row lists (the
// scheduled rows and the cached entries' ids, resumed flags, computed counts
// and block counts), which the compact form sends as a diff instead
// (compact_step.h), and those lists.
void EncodeStepWithoutRows(const SchedulerOutput& step, v1::SchedulerOutput* out);
void EncodeStepRows(const SchedulerOutput& step, v1::SchedulerOutput* out);
absl::StatusOr<SchedulerOutput> DecodeSchedulerOutput(const v1::SchedulerOutput& in);

void EncodeSampleCommand(StepSeq step_seq, const GrammarOutput* grammar, v1::SampleCommand* out);
absl::StatusOr<GrammarOutput> DecodeGrammar(const v1::GrammarBitmask& in);

void EncodeRunnerOutput(const ModelRunnerOutput& output, v1::ModelRunnerOutput* out);
absl::StatusOr<ModelRunnerOutput> DecodeRunnerOutput(const v1::ModelRunnerOutput& in);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_STEP_CODEC_H_
