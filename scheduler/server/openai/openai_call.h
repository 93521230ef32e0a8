// OpenAiCall: one /v1/completions or /v1/chat/completions request in flight.
// It submits one engine request per (prompt, choice), turns each one's
// tokens into text (TextStream: UTF-8-safe, stop strings held back), and
// writes SSE chunks as they come or one JSON body at the end.
//
// Threading: the engine thread only posts outputs to the connection's strand
// (ResponseWriter::Post); everything else runs on that strand, so the call's
// state needs no lock.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_CALL_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_CALL_H_

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/openai/json_util.h"
#include "scheduler/server/metrics.h"
#include "scheduler/server/openai/openai_protocol.h"
#include "scheduler/server/openai/stream_chunk.h"
#include "scheduler/server/openai/text_stream.h"
#include "scheduler/server/http/http_server.h"
#include "scheduler/server/serving_engine.h"
#include "scheduler/server/structured/grammar_factory.h"

namespace tandem::openai {

struct CallSetup {
  std::string id;     // "cmpl-..." or "chatcmpl-..."
  std::string model;  // the served model's name
  int64_t created = 0;
  std::chrono::steady_clock::time_point arrival;
  int32_t max_model_len = 0;
  // The request's compiled structured output (each choice gets its own matcher); null: free text.
  std::shared_ptr<const structured::CompiledStructure> grammar;
};

class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  static std::shared_ptr<OpenAiCall> Create(GenerationRequest request, CallSetup setup,
                                            std::vector<std::vector<TokenId>> prompts,
                                            scheduler::ServingEngine* engine, const Tokenizer* tokenizer,
                                            scheduler::ServingMetrics* metrics, std::shared_ptr<http::ResponseWriter> writer);

  // Submits the engine requests.
  void Start();

  // From the engine thread: hands `output` of choice `index` to the strand.
  void Deliver(size_t index, const scheduler::RequestOutput& output);

  OpenAiCall(GenerationRequest request, CallSetup setup, std::vector<std::vector<TokenId>> prompts,
             scheduler::ServingEngine* engine, const Tokenizer* tokenizer, scheduler::ServingMetrics* metrics,
             std::shared_ptr<http::ResponseWriter> writer);

 private:
  struct Choice {
    std::string engine_id;  // the engine's external id
    RequestId request_id = 0;  // the engine's id, to abort it by
    size_t prompt = 0;      // index into prompts_
    std::optional<TextStream> text;
    nlohmann::json logprobs;  // accumulated for a whole response
    std::vector<scheduler::PromptTokenLogprob> prompt_logprobs;  // with the first tokens
    // Logprobs of counted tokens whose text is not yet out (TextStream::num_released), oldest first.
    std::deque<std::pair<TokenId, scheduler::TokenLogprob>> pending_logprobs;
    int32_t logprobs_out = 0;  // tokens whose logprobs have been taken
    int32_t text_offset = 0;  // completions logprobs' text_offset
    bool finished = false;
    bool role_sent = false;
    std::string finish_reason;
    std::optional<std::string> stop_reason;
    std::chrono::steady_clock::time_point last_token;  // epoch until the first token
    double cumulative_logprob = 0;  // of the tokens counted in usage; ranks best_of candidates
  };

  // On the strand.
  void OnOutput(size_t index, const scheduler::RequestOutput& output);
  void Finish(Choice& choice, std::string reason);
  void OnClientGone();
  void SendChunk(Choice& choice, size_t index, const std::string& text, const nlohmann::json& logprobs,
                 bool final);
  void Complete();
  nlohmann::json Usage() const;
  // Takes the logprobs of the tokens whose text is out since the last call,
  // in the endpoint's format; null when the request did not ask or there are
  // none. Advances the choice's text offset.
  nlohmann::json TakeLogprobs(Choice& choice);
  bool chat() const { return request_.endpoint == Endpoint::kChatCompletions; }
  // The tool calls of a choice's whole text (tool_choice named or
  // "required"); null when the request asked for none or the text is not
  // a complete call list (cut by max_tokens). With "auto", the Hermes calls
  // found in the text (null when none) and `content` the rest.
  nlohmann::json ToolCalls(size_t index, const std::string& text, std::string* content = nullptr) const;
  bool tool_call() const { return request_.tool_choice != ToolChoice::kNone; }
  std::string FinishReasonJson(const Choice& choice, size_t index) const;
  // The choices the response returns, in order: all of them, or with
  // best_of > n the n best of each prompt's candidates, best first.
  std::vector<size_t> Returned() const;

  const GenerationRequest request_;
  const CallSetup setup_;
  const std::vector<std::vector<TokenId>> prompts_;
  scheduler::ServingEngine* const engine_;
  const Tokenizer* const tokenizer_;
  scheduler::ServingMetrics* const metrics_;
  const std::shared_ptr<http::ResponseWriter> writer_;

  std::vector<Choice> choices_;
  size_t num_finished_ = 0;
  bool stream_started_ = false;
  bool client_gone_ = false;
  std::optional<ApiError> error_;  // the first engine error, for a whole response
  std::optional<TextChunkWriter> text_chunks_;  // a stream's text-only chunks, made at the first
};

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_CALL_H_
