#include "scheduler/server/openai/fuzz/openai_fuzz_checks.h"

#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/server/openai/openai_protocol.h"

namespace tandem::openai::fuzz {
namespace {

using tokenizer_internal::IsValidUtf8;

std::string CheckError(const ApiError& e) {
  if (e.status < 400 || e.status > 499) return absl::StrCat("refused with status ", e.status);
  if (e.message.empty()) return "refused without a message";
  const nlohmann::json json = nlohmann::json::parse(e.ToJson(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.contains("error") || !json["error"].is_object()) {
    return "the error body is not a JSON error object: " + e.ToJson();
  }
  return "";
}

// The documented limits of a parsed request (openai_protocol.h).
std::string CheckLimits(const GenerationRequest& r) {
  const scheduler::SamplingParams& s = r.sampling;
  if (r.n < 1 || r.n > kMaxChoices) return absl::StrCat("n = ", r.n);
  if (r.prompts.size() * static_cast<size_t>(r.n) > static_cast<size_t>(kMaxSequences)) {
    return absl::StrCat(r.prompts.size(), " prompts times n = ", r.n);
  }
  if (r.stop.size() > static_cast<size_t>(kMaxStopStrings)) return absl::StrCat(r.stop.size(), " stop strings");
  if (r.max_tokens && (*r.max_tokens < 1 || *r.max_tokens > (1 << 24))) return "max_tokens out of range";
  if (s.min_tokens < 0 || (r.max_tokens && s.min_tokens > *r.max_tokens)) return "min_tokens out of range";
  if (r.logprobs < -1 || r.logprobs > kMaxLogprobs || s.logprobs != r.logprobs) return "logprobs out of range";
  if (!(s.temperature >= 0 && s.temperature <= 2)) return "temperature out of range";
  if (!(s.top_p > 0 && s.top_p <= 1)) return "top_p out of range";
  if (!(s.min_p >= 0 && s.min_p <= 1)) return "min_p out of range";
  if (s.top_k < 0) return "top_k negative";
  if (!(s.repetition_penalty > 0 && s.repetition_penalty <= 2)) return "repetition_penalty out of range";
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2)) return "presence_penalty out of range";
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2)) return "frequency_penalty out of range";
  for (TokenId id : s.stop_token_ids) {
    if (id < 0) return "a negative stop token id";
  }
  return "";
}

// What the parsed request hands on: its strings are tokenized and echoed in
// JSON, which both need valid UTF-8.
std::string CheckContent(const GenerationRequest& r) {
  for (const std::string& stop : r.stop) {
    if (stop.empty() || !IsValidUtf8(stop)) return "an empty or invalid UTF-8 stop string";
  }
  if (!IsValidUtf8(r.model) || !IsValidUtf8(r.user)) return "invalid UTF-8 in model or user";
  for (const Prompt& p : r.prompts) {
    if (p.is_tokens ? !p.text.empty() : !p.token_ids.empty()) return "a prompt with both text and token ids";
    if (!IsValidUtf8(p.text)) return "invalid UTF-8 in a prompt";
    for (TokenId id : p.token_ids) {
      if (id < 0) return "a negative prompt token id";
    }
  }
  for (const ChatMessage& m : r.messages) {
    if (!IsValidUtf8(m.role) || !IsValidUtf8(m.content)) return "invalid UTF-8 in a message";
  }
  return "";
}

std::string CheckRequest(Endpoint endpoint, const GenerationRequest& r) {
  if (r.endpoint != endpoint) return "the endpoint changed";
  if (endpoint == Endpoint::kChatCompletions ? r.messages.empty() || !r.prompts.empty()
                                             : r.prompts.empty() || !r.messages.empty()) {
    return "accepted without its prompt or messages";
  }
  if (std::string problem = CheckLimits(r); !problem.empty()) return problem;
  return CheckContent(r);
}

bool AllowedRole(std::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

std::vector<ChatMessage> SplitMessages(std::string_view text) {
  std::vector<ChatMessage> messages;
  for (;;) {
    const size_t end = text.find(kMessageEnd);
    const std::string_view entry = text.substr(0, end);
    const size_t role_end = entry.find(kRoleEnd);
    messages.push_back({std::string(entry.substr(0, role_end)),
                        role_end == std::string_view::npos ? "" : std::string(entry.substr(role_end + 1))});
    if (end == std::string_view::npos) return messages;
    text.remove_prefix(end + 1);
  }
}

// A template that parses renders `messages` or refuses them with
// InvalidArgument (its own raise_exception, a type error), the same way each
// time; messages with a role outside the four OpenAI ones are always refused
// (chat_template.h). What the text is depends on the template, which the
// fuzzer mutates, so it is compared with jinja2 elsewhere
// (tests/openai/test_chat_templates.py).
std::string CheckRender(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  bool allowed = !messages.empty();
  for (const ChatMessage& m : messages) allowed = allowed && AllowedRole(m.role);
  for (bool gen : {true, false}) {
    absl::StatusOr<std::string> first = t.Render(messages, gen);
    absl::StatusOr<std::string> again = t.Render(messages, gen);
    if (!first.ok() && (!absl::IsInvalidArgument(first.status()) || first.status().message().empty())) {
      return "refused without InvalidArgument and a message: " + first.status().ToString();
    }
    if (!allowed && first.ok()) return "rendered messages with a role that is not allowed";
    if (first.ok() != again.ok() || (first.ok() && *first != *again)) return "rendering is not deterministic";
  }
  return "";
}

}  // namespace

std::string CheckRequestBody(std::string_view body) {
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const auto parsed = ParseGenerationRequest(endpoint, body);
    const std::string problem = std::holds_alternative<ApiError>(parsed)
                                    ? CheckError(std::get<ApiError>(parsed))
                                    : CheckRequest(endpoint, std::get<GenerationRequest>(parsed));
    if (!problem.empty()) {
      return absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chat" : "completions", ": ", problem);
    }
  }
  return "";
}

std::string CheckChatTemplate(std::string_view input) {
  const size_t end = input.find(kTemplateEnd);
  const std::string_view jinja = input.substr(0, end);
  const std::vector<ChatMessage> messages =
      end == std::string_view::npos ? std::vector<ChatMessage>{{"user", "hi"}} : SplitMessages(input.substr(end + 1));
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(jinja);
  if (!t.ok()) {
    return absl::IsInvalidArgument(t.status()) && !t.status().message().empty() ? ""
                                                                                  : "refused with " + t.status().ToString();
  }
  return CheckRender(*t, messages);
}

}  // namespace tandem::openai::fuzz
