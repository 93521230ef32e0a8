// Tool calls in a model's free output, for tool_choice "auto" (vLLM's
// --enable-auto-tool-choice). Hermes format (vLLM's --tool-call-parser
// hermes), which Hermes, Qwen 2.5 and other templates ask models to write:
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
//
// Pure: text in, calls and the remaining content out. Thread-compatible.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_TOOL_CALL_PARSER_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_TOOL_CALL_PARSER_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::openai {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object as a string, as OpenAI's tool_calls carry it
};

struct ParsedOutput {
  std::vector<ParsedToolCall> calls;
  // The text outside the parsed calls, trimmed of surrounding whitespace; a
  // malformed call (not JSON, no string "name", arguments not an object)
  // stays here as written.
  std::string content;
};

// Every <tool_call>...</tool_call> block whose body is {"name": string,
// "arguments": object (or a string holding one, or absent: {})}; a last block
// cut before its closing tag (max_tokens) counts when its body parses.
ParsedOutput ParseHermesToolCalls(std::string_view text);

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_TOOL_CALL_PARSER_H_
