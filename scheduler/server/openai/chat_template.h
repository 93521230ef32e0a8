// ChatTemplate: turns an OpenAI chat request's messages into the prompt text
// that the model's `tokenizer.chat_template` produces, by running the
// template with our Jinja interpreter (jinja/template.h) in the context that
// Hugging Face transformers' `apply_chat_template` gives it, as vLLM calls it:
//
//   messages               role, content, and when present name, tool_calls
//                          (function.arguments parsed from its JSON string
//                          into an object, as vLLM does), tool_call_id;
//                          content is a string, a list of text parts joined
//                          with "\n" (vLLM's "string" content format), or None
//   tools                  the request's tools, or None
//   documents              None
//   add_generation_prompt  as asked
//   bos_token, eos_token   the model's (from the GGUF)
//   chat_template_kwargs   each entry as a variable (not overriding the above)
//   raise_exception(msg), strftime_now(format)  transformers' globals
//
// Only the roles system, user, assistant and tool are accepted: the template
// would print any string, which would let a client forge turn markers.
//
// Thread-safe after Create (immutable); copyable.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "scheduler/server/openai/jinja/template.h"

namespace tandem::openai {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateOptions {
  std::string bos_token;
  std::string eos_token;
  // The local time strftime_now formats (tests fix it); null: the clock.
  std::function<std::tm()> now;
};

// A chat render's input beyond the messages.
struct ChatRenderInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI message objects
  nlohmann::ordered_json tools;                                       // null or a list
  nlohmann::ordered_json chat_template_kwargs;                        // null or an object
  bool add_generation_prompt = true;
};

class ChatTemplate {
 public:
  // Parses `jinja` (a GGUF `tokenizer.chat_template` or a --chat-template
  // file). An empty template is InvalidArgument saying chat completions are
  // unavailable for this model and /v1/completions still works; a template
  // that does not parse is InvalidArgument naming the line and column.
  static absl::StatusOr<ChatTemplate> Create(std::string_view jinja, ChatTemplateOptions options = {});

  // The prompt for `input`. A bad message (unknown role, bad content or
  // tool call) or an error the template raises (e.g. "Conversation roles
  // must alternate user/assistant/user/assistant/...") is InvalidArgument.
  absl::StatusOr<std::string> Render(const ChatRenderInput& input) const;

  // Plain text messages (tests, fuzzing).
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;

  std::string_view name() const { return "jinja"; }

  // Token strings that end an assistant turn in this template (e.g.
  // "<|im_end|>", "<|eot_id|>"); the frontend adds their ids as stop tokens.
  const std::vector<std::string>& end_of_turn_tokens() const { return end_of_turn_tokens_; }

 private:
  ChatTemplate(jinja::Template t, ChatTemplateOptions options, std::vector<std::string> end_of_turn_tokens)
      : template_(std::move(t)), options_(std::move(options)), end_of_turn_tokens_(std::move(end_of_turn_tokens)) {}

  jinja::Template template_;
  ChatTemplateOptions options_;
  std::vector<std::string> end_of_turn_tokens_;
};

// The messages of a chat request prepared as the template sees them (see
// above); InvalidArgument naming the message for a bad one.
absl::StatusOr<jinja::Value> PrepareMessages(const nlohmann::ordered_json& messages);

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_
