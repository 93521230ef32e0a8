// `tandem trace`: the worked example of scheduler/README.md §2, run on the
// real Scheduler and EngineCore with the FakeExecutor, for one request. It
// prints what the scheduler plans and what comes back, with the
// computed / known / placeholder counters, and how many forward passes were
// wasted.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/testing/fake_executor.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/core/scheduler.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {
namespace {

using scheduler::EngineCore;
using scheduler::ModelRunnerOutput;
using scheduler::RequestOutput;
using scheduler::SchedulerOutput;

constexpr RequestId kRequest = 1;
constexpr int32_t kVocab = 32000;
constexpr TokenId kEos = kVocab;  // outside the fake model's own choices

struct TraceOptions {
  int64_t prompt_tokens = 6;
  int64_t max_tokens = 3;
  int64_t token_budget = 4;
  int64_t eos_at = 0;
  int64_t depth = 2;
  bool json = false;
};

// Prints every event of the one request as it happens.
class TracePrinter : public scheduler::StepObserver {
 public:
  TracePrinter(bool json, int32_t prompt_tokens) : json_(json), prompt_tokens_(prompt_tokens) {}

  void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) override {
    const scheduler::Request* r = engine.scheduler().FindRequest(kRequest);
    if (r == nullptr) return;
    const int32_t tokens = step.empty() ? 0 : step.scheduled.front().num_tokens;
    if (json_) {
      std::printf("{\"event\":\"schedule\",\"step\":%llu,\"tokens\":%d,\"computed\":%d,\"known\":%d,"
                  "\"placeholders\":%d}\n",
                  static_cast<unsigned long long>(step.step_seq), tokens, r->num_computed_tokens,
                  r->num_tokens(), r->num_output_placeholders);
    } else if (step.empty()) {
      std::printf("  schedule: nothing for this request (its remaining tokens are all in flight)\n");
    } else {
      std::printf("  schedule step %llu: %d token(s)  -> computed=%d known=%d placeholders=%d\n",
                  static_cast<unsigned long long>(step.step_seq), tokens, r->num_computed_tokens,
                  r->num_tokens(), r->num_output_placeholders);
    }
    scheduled_tokens_ += tokens;
  }

  void OnUpdated(const EngineCore& engine, const SchedulerOutput& step, const ModelRunnerOutput& result,
                 absl::Span<const RequestOutput> outputs) override {
    const auto seq = static_cast<unsigned long long>(step.step_seq);
    const RequestOutput* out = nullptr;
    for (const RequestOutput& o : outputs) {
      if (o.id == kRequest) out = &o;
    }
    if (out == nullptr) {
      const bool discarded = engine.scheduler().FindRequest(kRequest) == nullptr;
      if (json_) {
        std::printf(discarded ? "{\"event\":\"discarded\",\"step\":%llu}\n"
                              : "{\"event\":\"output\",\"step\":%llu,\"sampled\":false}\n",
                    seq);
      } else {
        std::printf(discarded ? "  output   step %llu: request already finished, result discarded\n"
                              : "  output   step %llu: prefill chunk, nothing sampled\n",
                    seq);
      }
      return;
    }
    output_tokens_ = out->num_output_tokens;
    if (out->finished()) finish_reason_ = scheduler::FinishReasonName(out->finish_reason);
    const int32_t known = prompt_tokens_ + out->num_output_tokens;
    if (json_) {
      std::printf("{\"event\":\"output\",\"step\":%llu,\"sampled\":true,\"token\":%d,\"token_id\":%d,"
                  "\"known\":%d,\"placeholders\":%d,\"finish_reason\":%s}\n",
                  seq, out->num_output_tokens, out->new_token_ids.back(), known, out->num_output_placeholders,
                  out->finished() ? absl::StrCat("\"", finish_reason_, "\"").c_str() : "null");
      return;
    }
    std::string what = absl::StrCat("token ", out->num_output_tokens);
    if (out->finish_reason == scheduler::FinishReason::kStop) {
      absl::StrAppend(&what, " = EOS, finished (stop)");
    } else if (out->finished()) {
      absl::StrAppend(&what, ", finished (", finish_reason_, ")");
    }
    std::printf("  output   step %llu: %s  -> known=%d placeholders=%d\n", seq, what.c_str(), known,
                out->num_output_placeholders);
  }

  void PrintSummary(int64_t wasted_from_stats) const {
    if (json_) {
      std::printf("{\"event\":\"summary\",\"wasted_steps\":%lld,\"output_tokens\":%d,\"finish_reason\":\"%s\","
                  "\"scheduled_tokens\":%lld}\n",
                  static_cast<long long>(wasted_from_stats), output_tokens_, finish_reason_.c_str(),
                  static_cast<long long>(scheduled_tokens_));
    } else {
      std::printf("  wasted forward passes for this request: %lld\n", static_cast<long long>(wasted_from_stats));
      std::printf("  output tokens: %d (%s), tokens scheduled: %lld\n", output_tokens_, finish_reason_.c_str(),
                  static_cast<long long>(scheduled_tokens_));
    }
  }

 private:
  const bool json_;
  const int32_t prompt_tokens_;
  int64_t scheduled_tokens_ = 0;
  int32_t output_tokens_ = 0;
  std::string finish_reason_ = "none";
};

absl::Status Trace(const TraceOptions& o) {
  scheduler::EngineConfig config;
  config.block_size = 16;
  config.max_num_batched_tokens = static_cast<int32_t>(o.token_budget);
  config.max_model_len = static_cast<int32_t>(o.prompt_tokens + o.max_tokens + 1);
  config.num_kv_blocks = config.max_model_len / config.block_size + 2;
  config.async_scheduling = o.depth > 1;
  config.batch_queue_depth = static_cast<int32_t>(o.depth);
  auto created = scheduler::Scheduler::Create(config);
  if (!created.ok()) return created.status();
  std::unique_ptr<scheduler::Scheduler> sched = std::move(created).value();

  scheduler::FakeExecutorOptions executor_options;
  executor_options.num_blocks = config.num_kv_blocks;
  executor_options.block_size = config.block_size;
  executor_options.vocab_size = kVocab;
  const int32_t eos_at = static_cast<int32_t>(o.eos_at);
  executor_options.force_token = [eos_at](RequestId, int32_t index) -> std::optional<TokenId> {
    if (index == eos_at) return kEos;
    return std::nullopt;
  };
  scheduler::FakeExecutor executor(std::move(executor_options));
  EngineCore engine(sched.get(), &executor);
  TracePrinter printer(o.json, static_cast<int32_t>(o.prompt_tokens));
  scheduler::InvariantChecker checker;
  engine.AddObserver(&checker);
  engine.AddObserver(&printer);

  scheduler::RequestSpec spec;
  spec.id = kRequest;
  for (int64_t i = 0; i < o.prompt_tokens; ++i) spec.prompt_token_ids.push_back(static_cast<TokenId>(i + 1));
  spec.sampling.max_tokens = static_cast<int32_t>(o.max_tokens);
  spec.sampling.eos_token_id = kEos;
  if (absl::Status s = engine.AddRequest(std::move(spec)); !s.ok()) return s;

  if (!o.json) {
    std::printf("prompt %lld tokens, token budget %lld, max_tokens %lld, EOS at %s, queue depth %lld (%s)\n",
                static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.token_budget),
                static_cast<long long>(o.max_tokens), o.eos_at > 0 ? absl::StrCat("output ", o.eos_at).c_str() : "never",
                static_cast<long long>(o.depth), o.depth > 1 ? "async" : "sync");
  }
  while (engine.HasWork()) {
    auto step = engine.Step();
    if (!step.ok()) return step.status();
  }
  printer.PrintSummary(sched->stats().num_wasted_rows);
  return absl::OkStatus();
}

}  // namespace

int RunTrace(const std::vector<std::string>& args) {
  TraceOptions o;
  FlagParser flags("tandem trace",
                   "Walks one request through the real scheduler and engine loop, with a fake model that\n"
                   "samples by a fixed rule, and prints every schedule, output and discarded result.");
  flags.AddInt("prompt-tokens", &o.prompt_tokens, "prompt length in tokens", 1, 1 << 20);
  flags.AddInt("max-tokens", &o.max_tokens, "output tokens at most", 1, 1 << 20);
  flags.AddInt("token-budget", &o.token_budget, "tokens per step (max_num_batched_tokens)", 1, 1 << 20);
  flags.AddInt("eos-at", &o.eos_at, "output position at which the model emits EOS (0 = never)", 0, 1 << 20);
  flags.AddInt("depth", &o.depth, "batch queue depth: 1 = synchronous, 2 = async, more = pipeline", 1, 64);
  flags.AddBool("json", &o.json, "one JSON object per event, then a summary line");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  if (absl::Status s = Trace(o); !s.ok()) {
    std::fprintf(stderr, "tandem trace: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem::tools
