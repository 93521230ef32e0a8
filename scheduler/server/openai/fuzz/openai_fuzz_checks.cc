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

// A recognized template renders `messages`; the properties hold for every
// family we know (chat_template.h).
std::string CheckRender(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  bool renderable = !messages.empty();
  for (const ChatMessage& m : messages) renderable = renderable && AllowedRole(m.role);
  absl::StatusOr<std::string> with_prompt = t.Render(messages, /*add_generation_prompt=*/true);
  absl::StatusOr<std::string> without = t.Render(messages, /*add_generation_prompt=*/false);
  if (with_prompt.ok() != renderable || without.ok() != renderable) {
    return absl::StrCat("render ", with_prompt.ok() ? "accepted" : "refused", " messages that ",
                        renderable ? "are" : "are not", " renderable: ", with_prompt.status().ToString());
  }
  if (!renderable) {
    return absl::IsInvalidArgument(with_prompt.status()) ? "" : "refused without InvalidArgument";
  }
  if (!absl::StartsWith(*with_prompt, *without) || with_prompt->size() == without->size()) {
    return "the generation prompt is not appended to the conversation";
  }
  // Each content, in order.
  size_t at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const size_t found = without->find(messages[i].content, at);
    if (found == std::string::npos) return absl::StrCat("message ", i, "'s content is missing or out of order");
    at = found + messages[i].content.size();
  }
  // A longer conversation extends a shorter one (checked for the first
  // message and all but the last: every split would make an input quadratic).
  for (size_t head_size : {size_t{1}, messages.size() - 1}) {
    if (head_size == 0 || head_size >= messages.size()) continue;
    absl::StatusOr<std::string> head =
        t.Render(std::vector<ChatMessage>(messages.begin(), messages.begin() + head_size), false);
    if (!head.ok() || !absl::StartsWith(*without, *head)) {
      return absl::StrCat("the first ", head_size, " messages do not render a prefix of the whole");
    }
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
    const bool expected = absl::IsInvalidArgument(t.status()) || absl::IsUnimplemented(t.status());
    return expected && !t.status().message().empty() ? "" : "refused with " + t.status().ToString();
  }
  if (t->name().empty()) return "a recognized template without a family name";
  return CheckRender(*t, messages);
}

}  // namespace tandem::openai::fuzz
