#include "scheduler/server/openai/tool_call_parser.h"

#include <optional>

#include "nlohmann/json.hpp"

namespace tandem::openai {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string_view Trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// One block's body as a call, or nothing when it is malformed.
std::optional<ParsedToolCall> ParseCall(std::string_view body) {
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(Trim(body), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;
  auto name = json.find("name");
  if (name == json.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
  if (auto it = json.find("arguments"); it != json.end() && !it->is_null()) {
    // Some models write the arguments as a JSON string, as the API carries them.
    arguments = it->is_string() ? nlohmann::ordered_json::parse(it->get<std::string>(), nullptr, false) : *it;
    if (!arguments.is_object()) return std::nullopt;
  }
  return ParsedToolCall{name->get<std::string>(),
                        arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)};
}

}  // namespace

ParsedOutput ParseHermesToolCalls(std::string_view text) {
  ParsedOutput out;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    const size_t end = close == std::string_view::npos ? text.size() : close + kClose.size();
    std::optional<ParsedToolCall> call =
        ParseCall(text.substr(body, (close == std::string_view::npos ? text.size() : close) - body));
    content.append(text.substr(pos, open - pos));
    if (call) {
      out.calls.push_back(*std::move(call));
    } else {
      content.append(text.substr(open, end - open));
    }
    pos = end;
  }
  if (pos < text.size()) content.append(text.substr(pos));
  out.content = std::string(Trim(content));
  return out;
}

}  // namespace tandem::openai
