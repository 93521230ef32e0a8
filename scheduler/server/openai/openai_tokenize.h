// /tokenize and /detokenize as vLLM serves them, so users can see what the
// model is given:
//
//   POST /tokenize   {"prompt": "...", "add_special_tokens": true}
//                 or {"messages": [...], "add_generation_prompt": true,
//                     "add_special_tokens": false, "tools": [...],
//                     "chat_template_kwargs": {...}}
//                 -> {"count": n, "max_model_len": m, "tokens": [...], "token_strs": null}
//   POST /detokenize {"tokens": [...]} -> {"prompt": "..."}
//
// Chat messages go through the model's chat template exactly as for
// /v1/chat/completions. Bad input is a 400 naming the field.
//
// Thread-safe: pure functions of their arguments.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_TOKENIZE_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_TOKENIZE_H_

#include <optional>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/server/openai/openai_protocol.h"

namespace tandem::openai {

struct TokenizeContext {
  const Tokenizer* tokenizer = nullptr;
  const absl::StatusOr<ChatTemplate>* chat_template = nullptr;
  std::string served_model_name;
  int32_t max_model_len = 0;
};

// The response body, or the error to send.
std::variant<std::string, ApiError> Tokenize(const std::string& body, const TokenizeContext& context);
std::variant<std::string, ApiError> Detokenize(const std::string& body, const TokenizeContext& context);

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_OPENAI_TOKENIZE_H_
