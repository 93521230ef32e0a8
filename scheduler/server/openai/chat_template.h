// ChatTemplate: turns an OpenAI chat request's messages into the prompt text
// that the model's `tokenizer.chat_template` would produce.
//
// We do not run Jinja. Create() reads the template with Jinja's lexical rules
// as Hugging Face transformers configures them (trim_blocks, lstrip_blocks,
// `-`/`+` whitespace control, one trailing newline dropped), reduces it to a
// canonical form (quote style, spacing, `a.b` vs `a['b']`, split string
// literals and literal text between tags do not matter) and compares that
// with the template families we render natively. Render() then produces what
// transformers' `apply_chat_template` would, byte for byte.
//
// Known families:
//  * "chatml": `<|im_start|>{role}\n{content}<|im_end|>\n` per message and
//    `<|im_start|>assistant\n` as the generation prompt, optionally with a
//    default system message that the template inserts when the first
//    message's role is not "system" (SmolLM2: "You are a helpful AI assistant
//    named SmolLM, trained by Hugging Face"; Qwen2: "You are a helpful
//    assistant."). The default text is taken from the template itself.
//
// Anything else is refused rather than guessed: a wrong prompt format makes a
// model answer badly without any error to show for it.
//
// Thread-safe after Create (immutable); copyable.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::openai {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Recognizes `jinja` (a GGUF `tokenizer.chat_template`). An empty template
  // is InvalidArgument and an unrecognized one Unimplemented; both messages
  // say that chat completions are unsupported for this model and that
  // /v1/completions still works.
  static absl::StatusOr<ChatTemplate> Create(std::string_view jinja);

  // The prompt text for `messages`; with `add_generation_prompt` the
  // assistant header is appended. Roles must be "system", "user",
  // "assistant" or "tool" (the OpenAI roles the template can show; the
  // template itself would print any string, which would let a client forge
  // turn markers through the role), and there must be at least one message;
  // otherwise InvalidArgument naming the message. Content is copied
  // verbatim, as transformers does (special-token text in it is not escaped).
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

  // The family's name, e.g. "chatml".
  std::string_view name() const { return name_; }

  // Token strings that end an assistant turn (e.g. "<|im_end|>"); the
  // frontend adds their ids as stop tokens.
  const std::vector<std::string>& end_of_turn_tokens() const { return end_of_turn_tokens_; }

 private:
  ChatTemplate(std::string name, std::optional<std::string> default_system,
               std::vector<std::string> end_of_turn_tokens)
      : name_(std::move(name)),
        default_system_(std::move(default_system)),
        end_of_turn_tokens_(std::move(end_of_turn_tokens)) {}

  std::string name_;
  // The whole literal the template prints before a first message that is not
  // "system" (e.g. "<|im_start|>system\n...<|im_end|>\n"), if it has one.
  std::optional<std::string> default_system_;
  std::vector<std::string> end_of_turn_tokens_;
};

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_CHAT_TEMPLATE_H_
