#include "scheduler/wire/step_trace.h"

#include <cerrno>
#include <cstring>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {
namespace {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepTraceWriter>> StepTraceWriter::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write the step trace to ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<StepTraceWriter>(new StepTraceWriter(file));
}

StepTraceWriter::~StepTraceWriter() { std::fclose(file_); }

void StepTraceWriter::OnScheduled(const EngineCore& engine, const SchedulerOutput& step) {
  if (step.empty()) return;
  v1::SchedulerOutput message;
  EncodeSchedulerOutput(step, &message);
  std::fprintf(file_, "{\"event\":\"schedule\",\"step\":%s}\n", ToJson(message).c_str());
  std::fflush(file_);
}

void StepTraceWriter::OnUpdated(const EngineCore& engine, const SchedulerOutput& step, const ModelRunnerOutput& result,
                                absl::Span<const RequestOutput> outputs) {
  v1::ModelRunnerOutput message;
  EncodeRunnerOutput(result, &message);
  std::fprintf(file_, "{\"event\":\"output\",\"step\":%s}\n", ToJson(message).c_str());
  std::fflush(file_);
}

}  // namespace tandem::scheduler
