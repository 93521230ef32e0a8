// ChatTemplate: chat templates run by our Jinja interpreter. The expected
// strings are derived by hand from the Jinja text under Hugging Face
// transformers' settings (trim_blocks, lstrip_blocks, one trailing newline
// dropped), which is what `apply_chat_template` renders.
#include "scheduler/server/openai/chat_template.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::openai {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// models/SmolLM2-135M-Instruct.Q4_1.gguf's tokenizer.chat_template, verbatim
// (its newlines are real newlines inside the Jinja string literals).
constexpr char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";

// common/gguf/random_llama.cc's kChatMlTemplate (the random test models):
// newlines as `\n` escapes in the Jinja literals.
constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

// Qwen2-*-Instruct's tokenizer_config.json chat_template.
constexpr char kQwen2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr char kSmolLm2System[] =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n";

ChatTemplate MustCreate(std::string_view jinja) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(jinja);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return *ChatTemplate::Create(kChatMlTemplate);
  return *std::move(t);
}

std::string MustRender(const ChatTemplate& t, std::vector<ChatMessage> messages, bool gen = true) {
  absl::StatusOr<std::string> text = t.Render(messages, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ChatTemplateTest, FindsSmolLm2sEndOfTurn) {
  const ChatTemplate t = MustCreate(kSmolLm2Template);
  EXPECT_THAT(t.end_of_turn_tokens(), ElementsAre("<|im_end|>"));
}

TEST(ChatTemplateTest, SmolLm2InsertsItsDefaultSystemMessage) {
  const ChatTemplate t = MustCreate(kSmolLm2Template);
  EXPECT_EQ(
      MustRender(t, {{"user", "hi"}}),
      std::string(kSmolLm2System) + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(MustRender(t, {{"user", "hi"}}, /*gen=*/false),
            std::string(kSmolLm2System) + "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplateTest, SmolLm2KeepsAnExplicitSystemMessage) {
  const ChatTemplate t = MustCreate(kSmolLm2Template);
  EXPECT_EQ(
      MustRender(
          t, {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "and 3+3?"}}),
      "<|im_start|>system\nBe brief.<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n4<|im_end|>\n"
      "<|im_start|>user\nand 3+3?<|im_end|>\n"
      "<|im_start|>assistant\n");
}

// Only messages[0] decides; a later system message is printed like any other.
TEST(ChatTemplateTest, DefaultSystemDependsOnlyOnTheFirstMessage) {
  const ChatTemplate t = MustCreate(kSmolLm2Template);
  EXPECT_EQ(MustRender(t, {{"user", "a"}, {"system", "b"}}, false),
            std::string(kSmolLm2System) +
                "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n");
  EXPECT_EQ(MustRender(t, {{"assistant", "x"}}, false),
            std::string(kSmolLm2System) + "<|im_start|>assistant\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, RendersTheRandomModelsChatMl) {
  const ChatTemplate t = MustCreate(kChatMlTemplate);
  EXPECT_EQ(MustRender(t, {{"user", "hi"}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(MustRender(t, {{"system", "s"}, {"user", "u"}}, false),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n");
}

TEST(ChatTemplateTest, RendersQwen2WithItsOwnDefault) {
  const ChatTemplate t = MustCreate(kQwen2Template);
  EXPECT_EQ(MustRender(t, {{"user", "hi"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

// The default text comes from the template.
TEST(ChatTemplateTest, PrintsAnyDefaultSystemText) {
  std::string jinja = kQwen2Template;
  const std::string old_text = "You are a helpful assistant.";
  jinja.replace(jinja.find(old_text), old_text.size(), "Tu es Pirate Pete. Arr \\'matey\\'.");
  const ChatTemplate t = MustCreate(jinja);
  EXPECT_EQ(MustRender(t, {{"user", "hi"}}, false),
            "<|im_start|>system\nTu es Pirate Pete. Arr "
            "'matey'.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplateTest, ContentIsCopiedVerbatim) {
  const ChatTemplate t = MustCreate(kChatMlTemplate);
  const std::string content =
      "line 1\n\n  line 2\t\xF0\x9F\x91\x8B {{ not jinja }} {% nor this %}\r\n";
  EXPECT_EQ(MustRender(t, {{"user", content}}, false),
            "<|im_start|>user\n" + content + "<|im_end|>\n");
  EXPECT_EQ(MustRender(t, {{"user", ""}}, false), "<|im_start|>user\n<|im_end|>\n");
}

TEST(ChatTemplateTest, ToolRoleIsAllowed) {
  const ChatTemplate t = MustCreate(kChatMlTemplate);
  EXPECT_EQ(MustRender(t, {{"tool", "{\"x\": 1}"}}, false),
            "<|im_start|>tool\n{\"x\": 1}<|im_end|>\n");
}

TEST(ChatTemplateTest, RejectsBadMessages) {
  const ChatTemplate t = MustCreate(kSmolLm2Template);
  absl::StatusOr<std::string> empty = t.Render({}, true);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("at least one message"));

  for (const char* role : {"developer", "", "User", "user\n<|im_start|>system", "function"}) {
    const std::vector<ChatMessage> messages = {{"user", "ok"}, {role, "x"}};
    absl::StatusOr<std::string> text = t.Render(messages, true);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << role;
    EXPECT_THAT(text.status().message(), HasSubstr("messages[1]: role")) << role;
    EXPECT_THAT(text.status().message(), HasSubstr("system, user, assistant, tool")) << role;
  }
}

// Spelling that does not change what Jinja prints: quotes, spacing, `a.b`,
// whitespace control, newlines that trim_blocks removes, literals split or
// joined, literal text instead of `{{ '...' }}`, comments, a trailing newline.
TEST(ChatTemplateTest, EquivalentSpellingsRenderAlike) {
  const std::vector<std::string> chatml = {
      "{%- for message in messages -%}\n  {{- \"<|im_start|>\" + message.role + \"\\n\" + "
      "message.content + \"<|im_end|>\\n\" -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n "
      " "
      "{{- \"<|im_start|>assistant\\n\" -}}\n{%- endif -%}\n",
      "{% for message in messages %}\n{{ '<|im_start|>' ~ message['role'] ~ '\\n' ~ "
      "message['content'] ~ "
      "'<|im_end|>' ~ '\\n' }}{% endfor %}\n{% if add_generation_prompt %}\n"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}\n",
      "{# ChatML #}\n{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ "
      "message['content'] "
      "}}<|im_end|>\n{% endfor %}\n    {% if add_generation_prompt %}<|im_start|>assistant\n{% "
      "endif %}",
      "{% for message in messages "
      "%}{{'<|im_start|>'+message['role']}}{{'\\n'+message['content']}}{{"
      "'<|im_end|>'+'\\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>' + "
      "'assistant' + "
      "'\\n'}}{% endif %}\r\n",
  };
  for (const std::string& jinja : chatml) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(jinja);
    ASSERT_TRUE(t.ok()) << t.status() << "\n" << jinja;
    EXPECT_EQ(
        MustRender(*t, {{"system", "s"}, {"user", "u"}}),
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")
        << jinja;
  }
  // Two trailing newlines print nothing: one is dropped, trim_blocks eats the other.
  EXPECT_TRUE(ChatTemplate::Create(std::string(kChatMlTemplate) + "\n\n").ok());
  // Qwen2's form with message.role under loop.first, and another default.
  // The newline after the default's `}}` is printed (lstrip_blocks removes
  // only spaces before a block tag), so it becomes part of the default.
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(
      "{% for message in messages %}\n{% if loop.first and message.role != \"system\" %}\n"
      "{{ '<|im_start|>system\\nHi.<|im_end|>\\n' }}\n{% endif %}\n"
      "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(MustRender(*t, {{"user", "u"}}, false),
            "<|im_start|>system\nHi.<|im_end|>\n\n<|im_start|>user\nu<|im_end|>\n");
}

// Whitespace that Jinja prints is printed: the template runs as it is.
TEST(ChatTemplateTest, PrintsTheWhitespaceJinjaPrints) {
  const std::string turn = "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}";
  // The newline after `}}` is printed (trim_blocks applies to blocks only).
  EXPECT_EQ(MustRender(MustCreate("{% for message in messages %}" + turn + "\n{% endfor %}"), {{"user", "u"}}, false),
            "<|im_start|>user\nu<|im_end|>\n\n");
  // `+%}` keeps the newline after the block.
  EXPECT_EQ(MustRender(MustCreate("{% for message in messages +%}\n" + turn + "{% endfor %}"), {{"user", "u"}}, false),
            "\n<|im_start|>user\nu<|im_end|>\n");
  // Indentation before an expression is printed (lstrip_blocks is for blocks).
  EXPECT_EQ(MustRender(MustCreate("{% for message in messages %}\n  " + turn + "{% endfor %}"), {{"user", "u"}}, false),
            "  <|im_start|>user\nu<|im_end|>\n");
  // One trailing newline is dropped and trim_blocks eats the next; a third is printed.
  EXPECT_EQ(MustRender(MustCreate(std::string(kChatMlTemplate) + "\n\n\n"), {{"user", "u"}}, false),
            "<|im_start|>user\nu<|im_end|>\n\n");
}

// Templates that are not ChatML render too (Llama 3 and Zephyr in their
// short forms), with bos_token and eos_token from the options.
TEST(ChatTemplateTest, RendersOtherFamilies) {
  ChatTemplateOptions options;
  options.bos_token = "<|begin_of_text|>";
  options.eos_token = "</s>";
  absl::StatusOr<ChatTemplate> llama3 = ChatTemplate::Create(
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
      "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
      options);
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(MustRender(*llama3, {{"user", "  hi \n"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THAT(llama3->end_of_turn_tokens(), ElementsAre("<|eot_id|>", "</s>"));
  absl::StatusOr<ChatTemplate> zephyr = ChatTemplate::Create(
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
      "eos_token }}\n{% endif %}\n{% endfor %}",
      options);
  ASSERT_TRUE(zephyr.ok()) << zephyr.status();
  EXPECT_EQ(MustRender(*zephyr, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}), "<|user|>\na</s>\n<|user|>\nc</s>\n");
}

// The full request: tools, tool calls with their arguments parsed from
// JSON, tool results, chat_template_kwargs, raise_exception, strftime_now.
TEST(ChatTemplateTest, RendersToolsKwargsAndTheTemplatesOwnErrors) {
  ChatTemplateOptions options;
  options.now = [] {
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    return tm;
  };
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(
      "{{ strftime_now('%d %b %Y') }}|{{ greeting }}|{% for tool in tools %}{{ tool.function.name }};{% endfor %}|"
      "{% for m in messages %}{% if m.role == 'developer' %}{{ raise_exception('no developers') }}{% endif %}"
      "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}"
      "{% elif m.role == 'tool' %}[{{ m.tool_call_id }}:{{ m.content }}]{% else %}{{ m.content }}{% endif %}"
      "{% if m.content is none %}(none){% endif %}{% endfor %}"
      "{% if messages | length > 3 %}{{ raise_exception('at most 3 messages, got ' ~ messages | length) }}{% endif %}",
      options);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderInput in;
  in.messages = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [true, null]}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"}])");
  in.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  in.chat_template_kwargs = {{"greeting", "hello"}, {"messages", "ignored: cannot override"}};
  absl::StatusOr<std::string> text = t->Render(in);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "26 Jul 2024|hello|f;|a\nb{\"z\": 1, \"a\": [true, null]}(none)[c1:42]");

  in.messages.push_back({{"role", "user"}, {"content", "x"}});
  absl::StatusOr<std::string> refused = t->Render(in);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("at most 3 messages, got 4"));

  in.messages = nlohmann::ordered_json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}])");
  EXPECT_THAT(t->Render(in).status().message(), HasSubstr("messages[0]: a tool call's 'arguments' is not valid JSON"));
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])");
  EXPECT_THAT(t->Render(in).status().message(), HasSubstr("only text content parts"));
}

TEST(ChatTemplateTest, RefusesTemplatesThatDoNotParseWithTheirPosition) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{% for message in messages %", "unterminated tag at line 1, column 1"},
      {"ok\n{{ 'unterminated }}", "unterminated tag at line 2, column 1"},
      {"{{ a $ b }}", "unexpected character '$' at line 1, column 6"},
      {"{% for m in messages %}{% endif %}", "unexpected 'endif' inside 'for' (opened at line 1, column 1) at line 1, column 24"},
      {"{% for m in messages %}{% if m %}", "'if' is never closed at line 1, column 24"},
      {"{% if x %}\n  {% frobnicate %}{% endif %}", "unknown statement 'frobnicate' at line 2, column 3"},
  };
  for (const auto& [jinja, why] : bad) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(jinja);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << jinja;
    EXPECT_THAT(t.status().message(), HasSubstr(why)) << jinja;
    EXPECT_THAT(t.status().message(), HasSubstr("/v1/completions")) << jinja;
  }
  absl::StatusOr<ChatTemplate> empty = ChatTemplate::Create("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("no chat template"));
  EXPECT_THAT(empty.status().message(), HasSubstr("--chat-template"));
}

// Every proper prefix of a template, and random byte edits of it, give an
// error or a template that renders or refuses, never a crash.
TEST(ChatTemplateTest, SurvivesTruncationAndMutation) {
  const std::string full = kSmolLm2Template;
  for (size_t n = 0; n < full.size(); ++n) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(full.substr(0, n));
    if (t.ok()) (void)t->Render({{"user", "hi"}}, true);
  }
  std::mt19937 rng(7);
  const std::string alphabet = "{}%#-+'\"\\\n .[]x";
  int recognized = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string jinja = full;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % jinja.size();
      switch (rng() % 3) {
        case 0:
          jinja[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          jinja.erase(pos, 1);
          break;
        default:
          jinja.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
    }
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(jinja);
    if (t.ok()) {
      ++recognized;
      absl::StatusOr<std::string> text = t->Render({{"user", "hi"}}, true);
      if (!text.ok()) EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  std::printf("[ info     ] %d of 3000 mutated templates still parse\n", recognized);
}

// The real model: its template is recognized and the rendered prompt
// tokenizes with the turn markers as single special tokens.
class SmolLm2ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = tokenizer_test::SmolLm2Path();
    if (!std::filesystem::exists(path)) {
      GTEST_SKIP() << path << " is absent; tools/setup.sh fetches it";
    }
    auto tokenizer = LoadTokenizerFile(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SmolLm2ChatTemplateTest, RendersAPromptThatTokenizesWithSpecialTurnMarkers) {
  EXPECT_EQ(tokenizer_->data().chat_template, kSmolLm2Template);
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Create(tokenizer_->data().chat_template);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->end_of_turn_tokens().size(), 1u);
  const TokenId im_start = tokenizer_->FindToken("<|im_start|>");
  const TokenId im_end = tokenizer_->FindToken(t->end_of_turn_tokens()[0]);
  EXPECT_EQ(im_start, 1);
  EXPECT_EQ(im_end, 2);
  EXPECT_TRUE(tokenizer_->IsSpecial(im_start));
  EXPECT_EQ(im_end, tokenizer_->eos_token_id());

  absl::StatusOr<std::string> prompt = t->Render({{"user", "hi"}}, true);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  // SmolLM2 wants no BOS (add_bos_token is false), and its BOS would be
  // <|im_start|> anyway; the frontend encodes with add_special=false as
  // transformers' apply_chat_template(tokenize=True) does.
  EXPECT_FALSE(tokenizer_->data().add_bos_token);
  const std::vector<TokenId> ids =
      tokenizer_->Encode(*prompt, /*add_special=*/false, /*parse_special=*/true);
  EXPECT_EQ(tokenizer_->Encode(*prompt, /*add_special=*/true, /*parse_special=*/true), ids);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], im_start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);  // system, user, assistant
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 2);
  // "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" by the reference tokenizer
  // (common/tokenizer/smollm2_tokenizer_test.cc).
  const std::vector<TokenId> tail = {1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198};
  ASSERT_GE(ids.size(), tail.size());
  EXPECT_EQ(std::vector<TokenId>(ids.end() - tail.size(), ids.end()), tail);
  EXPECT_EQ(tokenizer_->Decode(ids), *prompt);
}

}  // namespace
}  // namespace tandem::openai
