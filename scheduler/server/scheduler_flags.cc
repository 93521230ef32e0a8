#include "scheduler/server/scheduler_flags.h"

#include <fstream>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tandem::scheduler {

void SchedulerFlags::Register(FlagParser* flags) {
  flags->AddString("model", &model, "GGUF model file (default: the SmolLM2 model that tools/setup.sh fetches)");
  flags->AddInt("pipeline-parallel-size", &pipeline_parallel_size, "worker processes (pipeline stages)", 1, 64);
  flags->AddInt("max-num-seqs", &max_num_seqs, "running requests at most", 1, 1 << 20);
  flags->AddInt("max-num-batched-tokens", &max_num_batched_tokens, "tokens per step", 1, 1 << 24);
  flags->AddInt("max-model-len", &max_model_len, "positions per request (0: the model's, capped by the KV cache)", 0,
                1 << 24);
  flags->AddInt("block-size", &block_size, "tokens per KV block (a power of two; workers use the same)", 1, 1024);
  flags->AddBool("async-scheduling", &async_scheduling, "plan step N+1 while step N runs");
  flags->AddBool("enable-prefix-caching", &enable_prefix_caching, "reuse KV blocks of shared prefixes");
  flags->AddString("scheduling-policy", &scheduling_policy,
                   "fcfs (first come, first served) or priority (requests' 'priority' field, lower first, "
                   "then arrival; the least important running request is preempted first)");
  flags->AddDouble("step-timeout", &step_timeout, "seconds to wait for a step's result before failing it");
  flags->AddDouble("queue-timeout", &queue_timeout,
                   "while the worker group is not ready, seconds a request may wait before it fails with 503 "
                   "(0: no bound)");
  flags->AddInt("max-queued-requests", &max_queued_requests,
                "requests waiting to be scheduled at most; more get 429 at once (0: no limit)", 0, int64_t{1} << 30);
  flags->AddString("trace-steps", &trace_steps, "write every step and result to this file as JSON lines");
  flags->AddString("api-key", &api_key, "require 'Authorization: Bearer KEY' on /v1/ (default: none)");
  flags->AddString("served-model-name", &served_model_name, "the model's name in the API (default: the file's name)");
  flags->AddString("chat-template", &chat_template,
                   "a Jinja chat template file to use instead of the model's tokenizer.chat_template");
  flags->AddBool("enable-auto-tool-choice", &enable_auto_tool_choice,
                 "serve tool_choice \"auto\" (the default with tools): free output, tool calls parsed from it "
                 "(needs --tool-call-parser)");
  flags->AddString("tool-call-parser", &tool_call_parser,
                   "the model's tool-call format for --enable-auto-tool-choice: hermes (<tool_call>{json}</tool_call>, "
                   "Hermes and Qwen 2.5 templates)");
  flags->AddInt("http-threads", &http_threads, "threads that serve every HTTP connection", 1, 256);
  flags->AddDouble("http-request-timeout", &http_request_timeout,
                   "seconds a client may take to send one HTTP request from its first byte (a slower one gets "
                   "408 and is disconnected)");
  flags->AddDouble("shutdown-grace", &shutdown_grace,
                   "on SIGTERM or Ctrl-C, seconds to let requests in flight finish while refusing new ones "
                   "(0: stop at once; a second signal ends the wait)");
  flags->AddString("https-cert", &https_cert,
                   "PEM certificate (chain) to serve the HTTP port as HTTPS with (with --https-key; default: "
                   "plain HTTP). Clients need no certificate");
  flags->AddString("https-key", &https_key, "PEM private key of --https-cert");
}

namespace {

// --https-cert and --https-key: both or none, each a readable file.
absl::Status ValidateHttps(const std::string& cert, const std::string& key) {
  return rpc::ValidateCertificateFlags({{"https-cert", &cert}, {"https-key", &key}},
                                       "--https-cert and --https-key go together");
}

}  // namespace

void SchedulerFlags::RegisterTls(FlagParser* flags) { tls.Register(flags, "workers'"); }

absl::Status SchedulerFlags::Validate() const {
  if (absl::Status s = tls.Validate(); !s.ok()) return s;
  if (absl::Status s = ValidateHttps(https_cert, https_key); !s.ok()) return s;
  if (!chat_template.empty() && !std::ifstream(chat_template)) {
    return absl::InvalidArgumentError(absl::StrCat("flag --chat-template: cannot read '", chat_template, "'"));
  }
  if (!tool_call_parser.empty() && tool_call_parser != "hermes") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --tool-call-parser must be hermes (the only parser this server has), got '", tool_call_parser, "'"));
  }
  if (enable_auto_tool_choice && tool_call_parser.empty()) {
    return absl::InvalidArgumentError("flag --enable-auto-tool-choice needs --tool-call-parser (hermes)");
  }
  if (!(step_timeout > 0)) return absl::InvalidArgumentError("flag --step-timeout must be positive");
  if (!(shutdown_grace >= 0)) return absl::InvalidArgumentError("flag --shutdown-grace must not be negative");
  if (!(queue_timeout >= 0)) return absl::InvalidArgumentError("flag --queue-timeout must not be negative");
  if (!(http_request_timeout > 0)) return absl::InvalidArgumentError("flag --http-request-timeout must be positive");
  if (scheduling_policy != "fcfs" && scheduling_policy != "priority") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --scheduling-policy must be fcfs or priority, got '", scheduling_policy, "'"));
  }
  // Everything but the pool size can be checked now: give it room for any
  // request, and a stand-in context when the model's is not known yet.
  EngineConfig probe = ToEngineConfig();
  if (probe.max_model_len == 0) probe.max_model_len = 2;
  probe.num_kv_blocks = 1 << 30;
  absl::Status status = probe.Validate();
  if (status.ok()) return status;
  // "invalid engine config: block_size must be ..." names the field, which
  // is the flag in snake_case.
  std::string message(status.message());
  constexpr std::string_view kPrefix = "invalid engine config: ";
  if (message.rfind(kPrefix, 0) == 0) {
    const std::string rest = message.substr(kPrefix.size());
    const size_t space = rest.find(' ');
    message = absl::StrCat("flag --", absl::StrReplaceAll(rest.substr(0, space), {{"_", "-"}}), rest.substr(space));
  }
  return absl::InvalidArgumentError(message);
}

EngineConfig SchedulerFlags::ToEngineConfig() const {
  EngineConfig config;
  config.block_size = static_cast<int32_t>(block_size);
  config.max_num_seqs = static_cast<int32_t>(max_num_seqs);
  config.max_num_batched_tokens = static_cast<int32_t>(max_num_batched_tokens);
  config.max_model_len = static_cast<int32_t>(max_model_len);
  config.enable_prefix_caching = enable_prefix_caching;
  config.policy = scheduling_policy == "priority" ? SchedulingPolicy::kPriority : SchedulingPolicy::kFcfs;
  config.async_scheduling = async_scheduling;
  config.pipeline_parallel_size = static_cast<int32_t>(pipeline_parallel_size);
  return config;
}

std::vector<std::string> SchedulerFlags::ToArgs() const {
  auto flag = [](const char* name, const auto& value) { return absl::StrCat("--", name, "=", value); };
  auto boolean = [](bool value) { return value ? "true" : "false"; };
  std::vector<std::string> args = {
      flag("model", model),
      flag("pipeline-parallel-size", pipeline_parallel_size),
      flag("max-num-seqs", max_num_seqs),
      flag("max-num-batched-tokens", max_num_batched_tokens),
      flag("max-model-len", max_model_len),
      flag("block-size", block_size),
      flag("async-scheduling", boolean(async_scheduling)),
      flag("enable-prefix-caching", boolean(enable_prefix_caching)),
      flag("scheduling-policy", scheduling_policy),
      flag("step-timeout", step_timeout),
      flag("http-threads", http_threads),
      flag("queue-timeout", queue_timeout),
      flag("max-queued-requests", max_queued_requests),
      flag("http-request-timeout", http_request_timeout),
      flag("shutdown-grace", shutdown_grace),
  };
  // Empty means unset for these.
  if (!trace_steps.empty()) args.push_back(flag("trace-steps", trace_steps));
  if (!api_key.empty()) args.push_back(flag("api-key", api_key));
  if (!served_model_name.empty()) args.push_back(flag("served-model-name", served_model_name));
  if (!chat_template.empty()) args.push_back(flag("chat-template", chat_template));
  if (enable_auto_tool_choice) args.push_back(flag("enable-auto-tool-choice", boolean(true)));
  if (!tool_call_parser.empty()) args.push_back(flag("tool-call-parser", tool_call_parser));
  if (!https_cert.empty()) args.push_back(flag("https-cert", https_cert));
  if (!https_key.empty()) args.push_back(flag("https-key", https_key));
  return args;
}

std::string SchedulerFlags::ServedModelName() const {
  if (!served_model_name.empty()) return served_model_name;
  std::string name = model.substr(model.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name;
}

}  // namespace tandem::scheduler
