#include "scheduler/server/openai/openai_protocol.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {
namespace {

using ::testing::HasSubstr;

GenerationRequest ParseOk(Endpoint endpoint, const std::string& body) {
  auto parsed = ParseGenerationRequest(endpoint, body);
  if (auto* e = std::get_if<ApiError>(&parsed)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get_if<GenerationRequest>(&parsed) ? std::get<GenerationRequest>(parsed) : GenerationRequest{};
}

ApiError ParseError(Endpoint endpoint, const std::string& body) {
  auto parsed = ParseGenerationRequest(endpoint, body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(parsed)) << body << " was accepted";
  return std::holds_alternative<ApiError>(parsed) ? std::get<ApiError>(parsed) : ApiError{};
}

TEST(OpenAiProtocolTest, CompletionWithEveryParameter) {
  const GenerationRequest r = ParseOk(Endpoint::kCompletions, R"({
    "model": "m", "prompt": "Hello", "n": 3, "stream": true, "stream_options": {"include_usage": true},
    "max_tokens": 20, "min_tokens": 2, "stop": ["\n", "END"], "seed": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "logprobs": 2, "ignore_eos": true, "user": "u"})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 20);
  EXPECT_EQ(r.sampling.min_tokens, 2);
  EXPECT_THAT(r.stop, ::testing::ElementsAre("\n", "END"));
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_TRUE(r.sampling.ignore_eos);
}

// A field we do not implement is refused by name, never accepted and ignored
// (issue 14): a client that sends it expects an effect it would not get.
TEST(OpenAiProtocolTest, UnknownFieldsAreRefusedByName) {
  const struct {
    Endpoint endpoint;
    const char* body;
    const char* param;
  } cases[] = {
      {Endpoint::kCompletions, R"({"prompt": "x", "some_future_field": {"x": 1}})", "some_future_field"},
      {Endpoint::kCompletions, R"({"prompt": "x", "add_generation_prompt": true})", "add_generation_prompt"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"})",
       "chat_template"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "documents": []})", "documents"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3})",
       "chat_template_kwargs"},
  };
  for (const auto& c : cases) {
    const ApiError e = ParseError(c.endpoint, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.param)) << c.body;
  }
  // null is absent, and the chat template's own fields are known on chat.
  ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "some_future_field": null})");
  ParseOk(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": false})");
}

TEST(OpenAiProtocolTest, DefaultsAreOpenAis) {
  const GenerationRequest r = ParseOk(Endpoint::kCompletions, R"({"prompt": "x"})");
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_EQ(r.sampling.top_k, 0);
}

TEST(OpenAiProtocolTest, PromptShapes) {
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": [1, 2, 3]})").prompts[0].token_ids,
            (std::vector<TokenId>{1, 2, 3}));
  const GenerationRequest batch = ParseOk(Endpoint::kCompletions, R"({"prompt": ["a", "b"]})");
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(batch.prompts[1].text, "b");
  const GenerationRequest ids = ParseOk(Endpoint::kCompletions, R"({"prompt": [[1], [2, 3]]})");
  ASSERT_EQ(ids.prompts.size(), 2u);
  EXPECT_TRUE(ids.prompts[1].is_tokens);
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": [1, "a"]})").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": [-1]})").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": {}})").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": []})").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"max_tokens": 3})").param, "prompt");
}

TEST(OpenAiProtocolTest, ChatMessagesAndItsTokenLimits) {
  const GenerationRequest r = ParseOk(Endpoint::kChatCompletions, R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}],
    "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(ParseOk(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})")
                .logprobs,
            0);
  EXPECT_EQ(ParseError(Endpoint::kChatCompletions, R"({"messages": []})").param, "messages");
  EXPECT_EQ(ParseError(Endpoint::kChatCompletions, R"({"messages": [{"content": "x"}]})").param, "messages");
  EXPECT_THAT(ParseError(Endpoint::kChatCompletions,
                         R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})")
                  .message,
              HasSubstr("only text"));
  EXPECT_EQ(ParseError(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})")
                .param,
            "top_logprobs");
}

TEST(OpenAiProtocolTest, BadInputIsNamed) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": -0.1})", "temperature"},
      {R"({"prompt": "x", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "x", "top_p": 0})", "top_p"},
      {R"({"prompt": "x", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "top_k": 1.5})", "top_k"},
      {R"({"prompt": "x", "min_p": 2})", "min_p"},
      {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": -3})", "frequency_penalty"},
      {R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": -5})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 100000000000})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 100000})", "n"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": [""]})", "stop"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "min_tokens": 5, "max_tokens": 2})", "min_tokens"},
      {R"({"prompt": "x", "seed": "s"})", "seed"},
      {R"({"prompt": "x", "echo": true, "stream": true})", "echo"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "prompt_logprobs": 21})", "prompt_logprobs"},
      {R"({"prompt": "x", "prompt_logprobs": 2, "stream": true})", "prompt_logprobs"},
      {R"({"prompt": "x", "n": 3, "best_of": 2})", "best_of"},
      {R"({"prompt": "x", "best_of": 0})", "best_of"},
      {R"({"prompt": "x", "best_of": 129})", "best_of"},
      {R"({"prompt": "x", "best_of": "3"})", "best_of"},
      {R"({"prompt": "x", "best_of": 3, "stream": true})", "best_of"},
      {R"({"prompt": ["a", "b", "c"], "best_of": 100})", "best_of"},
      {R"({"prompt": "x", "logit_bias": {"1": 101}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"x": 5}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": [5]})", "logit_bias"},
      {R"({"prompt": "x", "bad_words": "no"})", "bad_words"},
      {R"({"prompt": "x", "bad_words": [" "]})", "bad_words"},
      {R"({"prompt": "x", "model": 5})", "model"},
  };
  for (const Case& c : cases) {
    const ApiError e = ParseError(Endpoint::kCompletions, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_THAT(ParseError(Endpoint::kCompletions, "{not json").message, HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, "[1, 2]").message, HasSubstr("JSON object"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, "").message, HasSubstr("not valid JSON"));
}

// Structured output: response_format on both endpoints, vLLM's guided_* and
// structured_outputs; one constraint per request; a schema keeps the
// client's key order (it is the order of the output's keys).
TEST(OpenAiProtocolTest, StructuredOutputFields) {
  using structured::StructuredKind;
  const GenerationRequest object = ParseOk(
      Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(object.structured.has_value());
  EXPECT_EQ(object.structured->kind, StructuredKind::kJsonObject);
  EXPECT_EQ(object.structured->param, "response_format");

  const GenerationRequest schema = ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "response_format":
      {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
       "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}})");
  ASSERT_TRUE(schema.structured.has_value());
  EXPECT_EQ(schema.structured->kind, StructuredKind::kJsonSchema);
  EXPECT_EQ(schema.structured->text,
            R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");

  EXPECT_FALSE(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "response_format": {"type": "text"}})")
                   .structured.has_value());
  EXPECT_FALSE(ParseOk(Endpoint::kCompletions, R"({"prompt": "x"})").structured.has_value());

  const GenerationRequest regex = ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "guided_regex": "[0-9]+"})");
  EXPECT_EQ(regex.structured->kind, StructuredKind::kRegex);
  EXPECT_EQ(regex.structured->text, "[0-9]+");
  const GenerationRequest choice = ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "guided_choice": ["a", "b c"]})");
  EXPECT_EQ(choice.structured->kind, StructuredKind::kChoice);
  EXPECT_THAT(choice.structured->choices, ::testing::ElementsAre("a", "b c"));
  const GenerationRequest grammar =
      ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "guided_grammar": "root ::= \"a\""})");
  EXPECT_EQ(grammar.structured->kind, StructuredKind::kGrammar);
  const GenerationRequest json_string =
      ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "guided_json": "{\"type\": \"integer\"}"})");
  EXPECT_EQ(json_string.structured->text, R"({"type": "integer"})");
  const GenerationRequest newer = ParseOk(
      Endpoint::kCompletions, R"({"prompt": "x", "structured_outputs": {"json": {"b": 1, "a": 2}, "disable_fallback": true}})");
  EXPECT_EQ(newer.structured->kind, StructuredKind::kJsonSchema);
  EXPECT_EQ(newer.structured->text, R"({"b":1,"a":2})");
  EXPECT_EQ(newer.structured->param, "structured_outputs.json");
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "structured_outputs": {"choice": ["y"]}})")
                .structured->kind,
            StructuredKind::kChoice);

  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case bad[] = {
      {R"({"prompt": "x", "response_format": {"type": "yaml"}})", "response_format", "unknown response_format type 'yaml'"},
      {R"({"prompt": "x", "response_format": "json"})", "response_format", "'type'"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format", "'json_schema' object"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})", "response_format",
       "schema"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}})",
       "response_format", "strict"},
      {R"({"prompt": "x", "guided_choice": []})", "guided_choice", "non-empty list"},
      {R"({"prompt": "x", "guided_choice": ["a", 1]})", "guided_choice", "strings"},
      {R"({"prompt": "x", "guided_regex": 5})", "guided_regex", "string"},
      {R"({"prompt": "x", "guided_json": 5})", "guided_json", "JSON schema"},
      {R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})", "guided_choice", "only one"},
      {R"({"prompt": "x", "response_format": {"type": "json_object"}, "guided_regex": "a"})", "guided_regex", "only one"},
      {R"({"prompt": "x", "structured_outputs": {"structural_tag": "t"}})", "structured_outputs.structural_tag",
       "not supported"},
      {R"({"prompt": "x", "structured_outputs": []})", "structured_outputs", "object"},
      {R"({"prompt": "x", "guided_whitespace_pattern": " *"})", "guided_whitespace_pattern", "not supported"},
  };
  for (const Case& c : bad) {
    const ApiError e = ParseError(Endpoint::kCompletions, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
}

// Tools: a named function constrains the output to its parameters' schema;
// "required" to a list of calls; "auto" (the default) is free output for the
// frontend's parser; a tool_choice naming no tool is refused by name.
TEST(OpenAiProtocolTest, ToolsAndToolChoice) {
  constexpr char kTools[] = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
      {"type": "function", "function": {"name": "now"}}])";
  const std::string chat_prefix = R"({"messages": [{"role": "user", "content": "x"}], )";
  const GenerationRequest named = ParseOk(
      Endpoint::kChatCompletions,
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools,
                   R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})"));
  ASSERT_EQ(named.tools.size(), 2u);
  EXPECT_EQ(named.tools[0].name, "get_weather");
  EXPECT_EQ(named.tools[1].parameters, "");
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "get_weather");
  ASSERT_TRUE(named.structured.has_value());
  EXPECT_EQ(named.structured->text, R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}})");
  EXPECT_EQ(named.structured->param, "tool_choice");
  EXPECT_THAT(named.tools_json, HasSubstr(R"("name":"get_weather")"));

  const GenerationRequest required = ParseOk(
      Endpoint::kChatCompletions,
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools, R"(, "tool_choice": "required"})"));
  EXPECT_EQ(required.tool_choice, ToolChoice::kRequired);
  ASSERT_TRUE(required.structured.has_value());
  const auto schema = nlohmann::json::parse(required.structured->text);
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["name"]["enum"][0], "now");

  const GenerationRequest none = ParseOk(
      Endpoint::kChatCompletions,
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools, R"(, "tool_choice": "none"})"));
  EXPECT_EQ(none.tool_choice, ToolChoice::kNone);
  EXPECT_FALSE(none.structured.has_value());
  EXPECT_EQ(none.tools.size(), 2u);
  for (const char* choice : {"", R"(, "tool_choice": "auto")"}) {
    const GenerationRequest automatic = ParseOk(Endpoint::kChatCompletions, absl::StrCat(chat_prefix, kTools, choice, "}"));
    EXPECT_EQ(automatic.tool_choice, ToolChoice::kAuto) << choice;
    EXPECT_FALSE(automatic.structured.has_value());
  }

  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  struct Case {
    std::string body;
    const char* param;
    const char* says;
  };
  const Case bad[] = {
      {absl::StrCat(chat, kTools, R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}})"),
       "tool_choice", "'nope'"},
      {absl::StrCat(chat, kTools, R"(, "tool_choice": "required", "response_format": {"type": "json_object"}})"),
       "response_format", "only one"},
      {absl::StrCat(chat, R"("tool_choice": "required"})"), "tool_choice", "needs 'tools'"},
      {absl::StrCat(chat, R"("tools": [{"type": "function"}], "tool_choice": "required"})"), "tools", "list of"},
      {absl::StrCat(chat, R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}],
                              "tool_choice": "required"})"),
       "tools", "JSON schema object"},
      {R"({"prompt": "x", "tools": [], "tool_choice": "none"})", "tools", "chat/completions"},
  };
  for (const Case& c : bad) {
    const ApiError e = ParseError(c.body.find("messages") != std::string::npos ? Endpoint::kChatCompletions
                                                                               : Endpoint::kCompletions,
                                  c.body);
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
}

// vLLM's `priority`: any integer, 0 when absent, on both endpoints. Whether
// a non-zero value is allowed is the engine's call (its scheduling policy).
TEST(OpenAiProtocolTest, PriorityIsAnIntegerDefaultingToZero) {
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x"})").priority, 0);
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "priority": -3})").priority, -3);
  EXPECT_EQ(ParseOk(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}],
                                                    "priority": 7})").priority,
            7);
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "priority": "high"})").param, "priority");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "priority": 1.5})").param, "priority");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "priority": 4294967296})").param, "priority");
}

// best_of as vLLM v0: n candidates unless given, at least n, not streamed
// unless equal to n.
TEST(OpenAiProtocolTest, BestOf) {
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "n": 3})").best_of, 3);
  const GenerationRequest r = ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "n": 2, "best_of": 5})");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  EXPECT_EQ(r.logprobs, -1);  // the client asked for none; the call asks the worker itself
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "n": 2, "best_of": 2, "stream": true})").best_of, 2);
  EXPECT_THAT(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "n": 3, "best_of": 2})").message,
              HasSubstr("at least 'n'"));
}

// Stop strings: vLLM bounds neither count nor length; we allow 16 of up to
// 256 bytes each. `user` is a string on both endpoints.
TEST(OpenAiProtocolTest, StopLimitsAndUser) {
  std::string sixteen = "\"s0\"";
  for (int i = 1; i < 16; ++i) absl::StrAppend(&sixteen, ",\"s", i, "\"");
  const std::string seventeen = sixteen + ",\"s16\"";
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, absl::StrCat(R"({"prompt": "x", "stop": [)", sixteen, "]}")).stop.size(), 16u);
  EXPECT_EQ(ParseError(Endpoint::kCompletions, absl::StrCat(R"({"prompt": "x", "stop": [)", seventeen, "]}")).param,
            "stop");
  const std::string longest(kMaxStopStringBytes, 'a');
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, absl::StrCat(R"({"prompt": "x", "stop": ")", longest, "\"}")).stop[0], longest);
  const ApiError e = ParseError(Endpoint::kChatCompletions, absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "stop": [")", longest, "b\"]}"));
  EXPECT_EQ(e.param, "stop");
  EXPECT_THAT(e.message, HasSubstr("at most 256 bytes"));
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const std::string base = endpoint == Endpoint::kCompletions ? R"({"prompt": "x", )"
                                                                : R"({"messages": [{"role": "user", "content": "x"}], )";
    EXPECT_EQ(ParseOk(endpoint, base + R"("user": "alice"})").user, "alice");
    EXPECT_EQ(ParseOk(endpoint, base + R"("user": null})").user, "");
    for (const char* bad : {"5", "true", "[\"a\"]", "{\"id\": \"a\"}"}) {
      const ApiError u = ParseError(endpoint, base + "\"user\": " + bad + "}");
      EXPECT_EQ(u.param, "user") << bad;
      EXPECT_THAT(u.message, HasSubstr("must be a string"));
    }
  }
}

TEST(OpenAiProtocolTest, ErrorObjectHasOpenAisShape) {
  const nlohmann::json json = nlohmann::json::parse(BadRequest("bad \"top_p\"", "top_p").ToJson());
  EXPECT_EQ(json["error"]["message"], "bad \"top_p\"");
  EXPECT_EQ(json["error"]["type"], "invalid_request_error");
  EXPECT_EQ(json["error"]["param"], "top_p");
  EXPECT_EQ(json["error"]["code"], 400);
  EXPECT_TRUE(nlohmann::json::parse(BadRequest("x").ToJson())["error"]["param"].is_null());
}

// Hostile bodies get a 400 naming the problem, fast, and never reach code
// that recurses over the value.
TEST(OpenAiProtocolTest, HostileBodiesAreRefused) {
  auto nested = [](int depth) {
    return R"({"prompt": "x", "some_future_field": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  // One level under the limit the body is parsed and reaches the field checks.
  EXPECT_THAT(ParseError(Endpoint::kCompletions, nested(kMaxJsonDepth - 1)).message,
              HasSubstr("'some_future_field' is not supported"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, nested(kMaxJsonDepth)).message, HasSubstr("deeper than 64"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, std::string(8 << 20, '[')).message, HasSubstr("deeper"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, std::string(4 << 20, '{') + std::string(4 << 20, '}')).message,
              HasSubstr("deeper"));
  // Brackets inside strings do not count, escaped quotes included.
  const std::string in_strings = R"({"prompt": ")" + std::string(1000, '[') + R"(\"[[[", "stop": ["{{{{"]})";
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, in_strings).prompts[0].text, std::string(1000, '[') + "\"[[[");

  // Invalid UTF-8 in a prompt, a stop string, a message or a key; an
  // overlong encoding; a lone surrogate, raw or escaped.
  for (const std::string& body : {std::string("{\"prompt\": \"a\xff\"}"), std::string("{\"prompt\": \"\xc3\"}"),
                                  std::string("{\"prompt\": \"x\", \"stop\": [\"\xe2\x82\"]}"),
                                  std::string("{\"prompt\": \"\xc0\xaf\"}"), std::string("{\"\xfe\": 1, \"prompt\": \"x\"}"),
                                  std::string("{\"prompt\": \"\xed\xa0\x80\"}")}) {
    EXPECT_THAT(ParseError(Endpoint::kCompletions, body).message, HasSubstr("not valid UTF-8")) << body;
  }
  EXPECT_THAT(ParseError(Endpoint::kChatCompletions, "{\"messages\": [{\"role\": \"user\", \"content\": \"\x80\"}]}")
                  .message,
              HasSubstr("not valid UTF-8"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, R"({"prompt": "\ud800"})").message, HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "stop": "\udc00"})").message,
              HasSubstr("not valid JSON"));
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "\ud83d\ude00 \u0000"})").prompts[0].text,
            std::string("\xf0\x9f\x98\x80 \0", 6));

  // Huge counts: n alone, n times the prompts, logprobs, max_tokens.
  std::string prompts = R"({"n": 2, "prompt": [)";
  for (int i = 0; i < kMaxPrompts; ++i) prompts += std::string(i ? "," : "") + "\"p\"";
  EXPECT_EQ(ParseError(Endpoint::kCompletions, prompts + "]}").param, "n");
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"n": 128, "prompt": ["a", "b"]})").n, 128);
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"n": 129, "prompt": "x"})").param, "n");
  for (const char* value : {"18446744073709551616", "18446744073709551615", "-9223372036854775809", "1e300",
                            "2147483648", "16777217", "0", "1.0", "true", "[1]"}) {
    EXPECT_EQ(ParseError(Endpoint::kCompletions, absl::StrCat(R"({"prompt": "x", "max_tokens": )", value, "}")).param,
              "max_tokens")
        << value;
  }
  // A number no double holds is not JSON to the parser.
  EXPECT_THAT(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 1e400})").message,
              HasSubstr("not valid JSON"));
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "logprobs": 21})").param, "logprobs");
  EXPECT_EQ(ParseError(Endpoint::kChatCompletions,
                       R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1e9})")
                .param,
            "top_logprobs");
}

}  // namespace
}  // namespace tandem::openai
