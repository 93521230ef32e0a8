// The OpenAI wire format: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into what the engine needs, and
// the error object every 4xx carries. Pure: no sockets, no engine.
//
// Validation follows OpenAI's documented ranges (temperature in [0, 2],
// penalties in [-2, 2], ...), vLLM's extensions (top_k, min_p,
// repetition_penalty, ignore_eos, min_tokens, stop_token_ids) and refuses
// what we do not implement (echo, suffix, ...) by name instead of
// ignoring it. Unknown fields are ignored, as OpenAI clients send fields of
// their own. Structured output (response_format, guided_*,
// structured_outputs) is read here, one constraint per request; the frontend
// compiles it (scheduler/server/structured/).
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_PROTOCOL_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/types.h"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/core/sampling_params.h"
#include "scheduler/server/structured/structured_spec.h"

namespace tandem::openai {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, may be empty

  std::string ToJson() const;
};

ApiError BadRequest(std::string message, std::string param = "");

enum class Endpoint { kCompletions, kChatCompletions };

// A function the model may call (chat `tools`); `parameters` is its JSON
// schema as the client wrote it (empty: any object).
struct ToolFunction {
  std::string name;
  std::string description;
  std::string parameters;
};

// How the output is a tool call: kNone (plain content), kNamed (the output
// is the named function's arguments), kRequired (a JSON list of
// {"name", "parameters"} calls, as vLLM's "required"), kAuto (free output
// whose tool calls a parser finds; the frontend refuses it unless the server
// has --enable-auto-tool-choice).
enum class ToolChoice { kNone, kNamed, kRequired, kAuto };

// One prompt of a completions request: text to tokenize, or token ids.
struct Prompt {
  std::string text;
  std::vector<TokenId> token_ids;
  bool is_tokens = false;
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // may be empty (then the served model)
  std::vector<Prompt> prompts;              // completions: one or more
  std::vector<ChatMessage> messages;        // chat
  int32_t n = 1;
  // Candidates generated per prompt (vLLM v0's best_of, >= n): the n with the
  // highest cumulative logprob of their sampled tokens are returned. n when absent.
  int32_t best_of = 1;
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  std::optional<int32_t> max_tokens;        // absent: 16 for completions, the rest of the context for chat
  std::vector<std::string> stop;            // stop strings
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  // Logprobs: -1 none; k >= 0 the sampled token's plus the top k.
  int32_t logprobs = -1;
  scheduler::SamplingParams sampling;       // everything but max_tokens and EOS
  // vLLM's extension: lower is scheduled first. The engine refuses a non-zero
  // value unless it runs the priority policy (--scheduling-policy=priority).
  int32_t priority = 0;
  std::string user;
  // vLLM's bad_words as sent; the frontend tokenizes them into sampling.
  std::vector<std::string> bad_words;
  // vLLM's prompt_logprobs as asked (-1: none; sampling.prompt_logprobs is
  // what the worker computes, echo's needs included) and the completions
  // API's echo (the prompt's text, and its tokens' logprobs with logprobs).
  int32_t prompt_logprobs = -1;
  bool echo = false;
  // Chat tools: the functions, the `tools` list as sent (for the chat
  // template), and whether and which one the output must call.
  std::vector<ToolFunction> tools;
  std::string tools_json;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed
  // Structured output (response_format, vLLM's guided_* or structured_outputs); absent: free text.
  std::optional<structured::StructuredSpec> structured;
};

// Parses and validates a request body. Sampling defaults are OpenAI's
// (temperature 1, top_p 1).
std::variant<GenerationRequest, ApiError> ParseGenerationRequest(Endpoint endpoint, std::string_view body);

// Limits that make a request absurd rather than merely large.
inline constexpr int32_t kMaxChoices = 128;
inline constexpr int32_t kMaxLogprobs = 20;
// vLLM bounds neither the count nor the length of stop strings; OpenAI allows
// 4. Ours cost O(stop strings) per output byte and a KMP table of their
// length per choice, so both are bounded.
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr int32_t kMaxStopStringBytes = 256;
inline constexpr int32_t kMaxPrompts = 256;
inline constexpr int32_t kMaxSequences = 256;  // n times the number of prompts
// Arrays and objects nested deeper are refused before parsing: nlohmann's
// parser is iterative, but copying, comparing and printing a value recurse.
inline constexpr int32_t kMaxJsonDepth = 64;

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_PROTOCOL_H_
