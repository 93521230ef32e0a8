// OpenAiFrontend: the OpenAI-compatible HTTP API of the scheduler process
// (scheduler/README.md §8), served by HttpServer:
//
//   POST /v1/completions, /v1/chat/completions   (SSE with "stream": true)
//   GET  /v1/models
//   GET  /health    the process is up
//   GET  /ready     every worker is up and the model is loaded (503 if not)
//   GET  /metrics   Prometheus text format
//
// A request is parsed and validated on the connection's thread, tokenized
// (chat messages through the model's chat template), and submitted to the
// ServingEngine as one engine request per choice (`n`) and prompt. Outputs
// come back on the engine thread and are posted to the connection's strand,
// where they are detokenized, checked for stop strings and written. A stop
// string aborts its engine request at once, so its KV blocks are freed
// without waiting for max_tokens; so does a client that hangs up.
//
// Thread-safe: Handle may run on any of the server's threads at once.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_FRONTEND_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_FRONTEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/server/metrics.h"
#include "scheduler/server/openai/openai_protocol.h"
#include "scheduler/server/http/http_server.h"
#include "scheduler/server/serving_engine.h"
#include "scheduler/server/structured/grammar_factory.h"

namespace tandem::openai {

// The worker group as the frontend sees it.
struct GroupView {
  bool ready = false;
  std::string description;  // what the group waits for, in words
  std::vector<scheduler::WorkerTimes> workers;
};

struct OpenAiFrontendOptions {
  std::string served_model_name;
  std::string api_key;               // empty: no authentication
  int32_t model_context_length = 0;  // the limit before the group first forms
  // tool_choice "auto" parses Hermes <tool_call> blocks (--enable-auto-tool-choice --tool-call-parser hermes).
  bool auto_tool_choice = false;
};

class OpenAiFrontend {
 public:
  // `chat_template` is the model's, or why it cannot be used (chat requests
  // then get that error; completions still work). The pointers must outlive
  // the frontend.
  OpenAiFrontend(OpenAiFrontendOptions options, scheduler::ServingEngine* engine, const Tokenizer* tokenizer,
                 absl::StatusOr<ChatTemplate> chat_template, scheduler::ServingMetrics* metrics,
                 std::function<GroupView()> group);

  void Handle(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);

  // The server's own errors (a malformed request, a body over the limit) as
  // the API's error object, for HttpServerOptions::error_body.
  static http::ErrorBody ErrorBodyOf(int status, const std::string& message);

  // The process is shutting down: new generation requests get 503 and
  // /ready says not ready, while those in flight finish.
  void StartDraining() { draining_ = true; }

 private:
  void HandleGeneration(Endpoint endpoint, const http::HttpRequest& request,
                        std::shared_ptr<http::ResponseWriter> writer);
  void RespondJson(http::ResponseWriter& writer, int status, const std::string& body);
  void RespondError(http::ResponseWriter& writer, const ApiError& error);
  int32_t MaxModelLen() const;

  const OpenAiFrontendOptions options_;
  scheduler::ServingEngine* const engine_;
  const Tokenizer* const tokenizer_;
  const absl::StatusOr<ChatTemplate> chat_template_;
  std::vector<TokenId> end_of_turn_ids_;  // stop tokens of a chat turn
  structured::GrammarFactory grammars_{tokenizer_};  // structured output, compiled once per structure
  scheduler::ServingMetrics* const metrics_;
  const std::function<GroupView()> group_;
  const int64_t created_;  // the "created" of /v1/models
  std::atomic<uint64_t> next_call_{1};
  std::atomic<bool> draining_{false};
};

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_FRONTEND_H_
