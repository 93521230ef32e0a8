#include "scheduler/server/openai/chat_template.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::ordered_json;
using jinja::Value;
using jinja::ValueDict;
using jinja::ValueList;

constexpr char kCompletionsStillWork[] = "/v1/completions with a prompt still works";

bool IsKnownRole(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

absl::Status BadMessage(size_t i, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: ", what));
}

// A message's content as vLLM hands it to the template: strings as they are,
// text parts joined with "\n", null as None.
absl::StatusOr<Value> PrepareContent(const Json& content, size_t i) {
  if (content.is_null()) return Value::None();
  if (content.is_string()) return Value::String(content.get<std::string>());
  if (!content.is_array()) return BadMessage(i, "'content' must be a string, a list of text parts or null");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const auto type = part.is_object() ? part.find("type") : part.end();
    const auto body = part.is_object() ? part.find("text") : part.end();
    if (type == part.end() || *type != "text" || body == part.end() || !body->is_string()) {
      return BadMessage(i, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    }
    if (k > 0) text += "\n";
    text += body->get<std::string>();
  }
  return Value::String(std::move(text));
}

// tool_calls with each function's `arguments` JSON string parsed into an
// object (vLLM does this; templates print them with tojson).
absl::StatusOr<Value> PrepareToolCalls(const Json& calls, size_t i) {
  if (!calls.is_array()) return BadMessage(i, "'tool_calls' must be a list");
  Json prepared = calls;
  for (Json& call : prepared) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
      return BadMessage(i, "each tool call needs a 'function' object");
    }
    Json& function = call["function"];
    const auto args = function.find("arguments");
    if (args == function.end() || args->is_null() || (args->is_string() && args->get<std::string>().empty())) {
      function["arguments"] = Json::object();
    } else if (args->is_string()) {
      Json parsed = Json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) return BadMessage(i, "a tool call's 'arguments' is not valid JSON");
      *args = std::move(parsed);
    }
  }
  return Value::FromJson(prepared);
}

absl::StatusOr<Value> PrepareMessage(const Json& m, size_t i) {
  if (!m.is_object()) return BadMessage(i, "a message must be an object");
  const auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return BadMessage(i, "a message needs a string 'role'");
  const std::string r = role->get<std::string>();
  if (!IsKnownRole(r)) {
    return BadMessage(i, absl::StrCat("role \"", absl::CHexEscape(r.substr(0, 40)), r.size() > 40 ? "..." : "",
                                      "\" is not one of system, user, assistant, tool"));
  }
  ValueDict out = {{"role", Value::String(r)}};
  const auto content = m.find("content");
  TANDEM_ASSIGN_OR_RETURN(Value c, PrepareContent(content == m.end() ? Json() : *content, i));
  out.emplace_back("content", std::move(c));
  if (const auto name = m.find("name"); name != m.end() && name->is_string()) {
    out.emplace_back("name", Value::String(name->get<std::string>()));
  }
  if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    TANDEM_ASSIGN_OR_RETURN(Value v, PrepareToolCalls(*calls, i));
    out.emplace_back("tool_calls", std::move(v));
  }
  if (const auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) {
    out.emplace_back("tool_call_id", Value::String(id->get<std::string>()));
  }
  return Value::Dict(std::move(out));
}

// The end-of-turn markers of the common template families that appear in
// this template's text.
std::vector<std::string> EndOfTurnTokens(std::string_view jinja, const std::string& eos) {
  static constexpr const char* kMarkers[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
                                             "<|end|>",    "<|endoftext|>", "<｜end▁of▁sentence｜>"};
  std::vector<std::string> found;
  for (const char* marker : kMarkers) {
    if (jinja.find(marker) != std::string_view::npos) found.emplace_back(marker);
  }
  if (!eos.empty() && std::find(found.begin(), found.end(), eos) == found.end()) found.push_back(eos);
  return found;
}

std::tm LocalNow() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

}  // namespace

absl::StatusOr<Value> PrepareMessages(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return absl::InvalidArgumentError("messages: a chat request needs at least one message");
  }
  ValueList out;
  for (size_t i = 0; i < messages.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(Value m, PrepareMessage(messages[i], i));
    out.push_back(std::move(m));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view jinja, ChatTemplateOptions options) {
  if (jinja.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has no chat template (tokenizer.chat_template is empty), so /v1/chat/completions cannot be "
        "served; pass one with --chat-template FILE; ",
        kCompletionsStillWork));
  }
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(jinja);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the chat template does not parse: ", t.status().message(),
                                                   "; ", kCompletionsStillWork));
  }
  std::vector<std::string> eot = EndOfTurnTokens(jinja, options.eos_token);
  return ChatTemplate(*std::move(t), std::move(options), std::move(eot));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatRenderInput& input) const {
  TANDEM_ASSIGN_OR_RETURN(Value messages, PrepareMessages(input.messages));
  if (!input.tools.is_null() && !input.tools.is_array()) return absl::InvalidArgumentError("tools: must be a list");
  ValueDict globals = {
      {"messages", std::move(messages)},
      {"tools", input.tools.is_null() ? Value::None() : Value::FromJson(input.tools)},
      {"documents", Value::None()},
      {"add_generation_prompt", Value::Bool(input.add_generation_prompt)},
      {"bos_token", Value::String(options_.bos_token)},
      {"eos_token", Value::String(options_.eos_token)},
  };
  if (input.chat_template_kwargs.is_object()) {
    for (auto it = input.chat_template_kwargs.begin(); it != input.chat_template_kwargs.end(); ++it) {
      const bool taken = std::any_of(globals.begin(), globals.end(), [&](const auto& g) { return g.first == it.key(); });
      if (!taken) globals.emplace_back(it.key(), Value::FromJson(it.value()));
    }
  } else if (!input.chat_template_kwargs.is_null()) {
    return absl::InvalidArgumentError("chat_template_kwargs: must be an object");
  }
  globals.emplace_back("raise_exception", Value::Callable([](jinja::CallArgs& args) -> absl::StatusOr<Value> {
                         const std::string message =
                             args.positional.empty() ? "" : jinja::ToPythonString(args.positional[0]);
                         return absl::InvalidArgumentError(absl::StrCat("the chat template refused the request: ", message));
                       }));
  const std::function<std::tm()> now = options_.now ? options_.now : LocalNow;
  globals.emplace_back("strftime_now", Value::Callable([now](jinja::CallArgs& args) -> absl::StatusOr<Value> {
                         if (args.positional.empty() || !args.positional[0].is_string()) {
                           return absl::InvalidArgumentError("strftime_now() takes a format string");
                         }
                         const std::tm tm = now();
                         char buf[256];
                         const size_t n = std::strftime(buf, sizeof buf, args.positional[0].str().c_str(), &tm);
                         return Value::String(std::string(buf, n));
                       }));
  return template_.Render(globals);
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  ChatRenderInput input;
  for (const ChatMessage& m : messages) input.messages.push_back({{"role", m.role}, {"content", m.content}});
  input.add_generation_prompt = add_generation_prompt;
  return Render(input);
}

}  // namespace tandem::openai
