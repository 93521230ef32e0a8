#include "scheduler/server/openai/tool_call_parser.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::openai {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;

auto Call(const std::string& name, const std::string& arguments) {
  return ::testing::AllOf(Field(&ParsedToolCall::name, name), Field(&ParsedToolCall::arguments, arguments));
}

TEST(HermesToolCallParserTest, PlainTextHasNoCalls) {
  const ParsedOutput out = ParseHermesToolCalls("  The weather is fine.\n");
  EXPECT_THAT(out.calls, IsEmpty());
  EXPECT_EQ(out.content, "The weather is fine.");
}

TEST(HermesToolCallParserTest, CallsBecomeToolCallsAndTheRestContent) {
  const ParsedOutput out = ParseHermesToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>{\"arguments\": {}, \"name\": \"get_time\"}</tool_call>");
  // Arguments keep the model's key order, compact, as a JSON string.
  EXPECT_THAT(out.calls, ElementsAre(Call("get_weather", R"({"city":"Paris","unit":"c"})"), Call("get_time", "{}")));
  EXPECT_EQ(out.content, "Let me check.");
}

TEST(HermesToolCallParserTest, OnlyCallsLeaveNoContent) {
  const ParsedOutput out = ParseHermesToolCalls("<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_THAT(out.calls, ElementsAre(Call("f", "{}")));  // no arguments: an empty object
  EXPECT_EQ(out.content, "");
}

TEST(HermesToolCallParserTest, ArgumentsWrittenAsAStringAreParsed) {
  const ParsedOutput out = ParseHermesToolCalls(R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)");
  EXPECT_THAT(out.calls, ElementsAre(Call("f", R"({"x":1})")));
}

TEST(HermesToolCallParserTest, MalformedCallsStayContent) {
  const char* malformed[] = {
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": </tool_call>",  // not JSON
      "<tool_call>{\"arguments\": {}}</tool_call>",                       // no name
      "<tool_call>{\"name\": 3}</tool_call>",                              // name not a string
      "<tool_call>{\"name\": \"\"}</tool_call>",                           // empty name
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",      // arguments not an object
      "<tool_call>[\"f\"]</tool_call>",                                    // not an object
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\"",                 // cut by max_tokens mid-call
  };
  for (const char* text : malformed) {
    const ParsedOutput out = ParseHermesToolCalls(text);
    EXPECT_THAT(out.calls, IsEmpty()) << text;
    EXPECT_EQ(out.content, text);
  }
  // A good call next to a bad one: the good one is parsed, the bad one kept as text.
  const ParsedOutput out =
      ParseHermesToolCalls("<tool_call>{\"name\": \"f\"}</tool_call> and <tool_call>oops</tool_call>");
  EXPECT_THAT(out.calls, ElementsAre(Call("f", "{}")));
  EXPECT_EQ(out.content, "and <tool_call>oops</tool_call>");
}

TEST(HermesToolCallParserTest, AnUnclosedLastCallCountsWhenComplete) {
  const ParsedOutput out = ParseHermesToolCalls("Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": true}}\n");
  EXPECT_THAT(out.calls, ElementsAre(Call("f", R"({"a":true})")));
  EXPECT_EQ(out.content, "Sure.");
}

TEST(HermesToolCallParserTest, NonAsciiArgumentsSurvive) {
  const ParsedOutput out = ParseHermesToolCalls("<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Zürich\"}}</tool_call>");
  EXPECT_THAT(out.calls, ElementsAre(Call("f", "{\"city\":\"Zürich\"}")));
}

}  // namespace
}  // namespace tandem::openai
