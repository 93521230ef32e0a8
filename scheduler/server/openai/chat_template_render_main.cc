// chat_template_render: renders chat requests through ChatTemplate, for the
// test that compares our interpreter with Python's jinja2
// (tests/openai/test_chat_templates.py). Reads one JSON object on stdin:
//
//   {"template": "...", "bos_token": "...", "eos_token": "...",
//    "now": [year, month, day, hour, minute, second],
//    "cases": [{"messages": [...], "tools": [...] or null,
//               "add_generation_prompt": bool, "chat_template_kwargs": {...}}]}
//
// and writes a JSON list with {"text": ...} or {"error": ...} per case.
// Exit status 1 only when the input itself is unusable.
#include <cstdio>
#include <ctime>
#include <iostream>
#include <iterator>
#include <string>

#include "nlohmann/json.hpp"
#include "scheduler/server/openai/chat_template.h"

int main() {
  using Json = nlohmann::ordered_json;
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const Json request = Json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object() || !request.contains("template") || !request["template"].is_string()) {
    std::fprintf(stderr, "chat_template_render: expected a JSON object with \"template\" on stdin\n");
    return 1;
  }
  tandem::openai::ChatTemplateOptions options;
  options.bos_token = request.value("bos_token", "");
  options.eos_token = request.value("eos_token", "");
  if (request.contains("now")) {
    const Json now = request["now"];
    options.now = [now] {
      std::tm tm{};
      tm.tm_year = now[0].get<int>() - 1900;
      tm.tm_mon = now[1].get<int>() - 1;
      tm.tm_mday = now[2].get<int>();
      tm.tm_hour = now[3].get<int>();
      tm.tm_min = now[4].get<int>();
      tm.tm_sec = now[5].get<int>();
      std::mktime(&tm);  // fills in the weekday and day of the year
      return tm;
    };
  }
  Json results = Json::array();
  auto t = tandem::openai::ChatTemplate::Create(request["template"].get<std::string>(), options);
  for (const Json& c : request.value("cases", Json::array())) {
    if (!t.ok()) {
      results.push_back({{"error", std::string(t.status().message())}});
      continue;
    }
    tandem::openai::ChatRenderInput in;
    in.messages = c.value("messages", Json::array());
    in.tools = c.value("tools", Json());
    in.chat_template_kwargs = c.value("chat_template_kwargs", Json());
    in.add_generation_prompt = c.value("add_generation_prompt", true);
    auto text = t->Render(in);
    if (text.ok()) {
      results.push_back({{"text", *text}});
    } else {
      results.push_back({{"error", std::string(text.status().message())}});
    }
  }
  std::cout << results.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}
