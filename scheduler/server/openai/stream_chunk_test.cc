#include "scheduler/server/openai/stream_chunk.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/server/openai/json_util.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::json;

// The event as OpenAiCall::SendChunk builds any chunk: an nlohmann object, dumped.
std::string Reference(bool chat, const std::string& id, int64_t created, const std::string& model, size_t index,
                      const std::string& text) {
  Json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (chat) {
    c["delta"] = Json{{"content", text}};
  } else {
    c["text"] = text;
  }
  return "data: " +
         DumpJson({{"id", id},
                   {"object", chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", created},
                   {"model", model},
                   {"choices", Json::array({std::move(c)})}}) +
         "\n\n";
}

TEST(TextChunkWriterTest, SameBytesAsTheGeneralChunk) {
  const std::vector<std::string> texts = {
      "", "Paris", " the", "\"quoted\"", "back\\slash", "line\nbreak\ttab\r", std::string("nul\0byte", 8),
      "\x01\x1f control", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "</script>", "\x7f"};
  for (bool chat : {false, true}) {
    for (const std::string& model : {std::string("SmolLM2"), std::string("a \"model\"\\name\xc3\xa9")}) {
      const TextChunkWriter writer(chat, "cmpl-42", 1764662400, model);
      for (size_t index : {size_t{0}, size_t{7}, size_t{123456}}) {
        for (const std::string& text : texts) {
          EXPECT_EQ(writer.Event(index, text), Reference(chat, "cmpl-42", 1764662400, model, index, text))
              << "chat " << chat << " index " << index << " text '" << text << "'";
        }
      }
    }
  }
}

// A token's partial UTF-8 never reaches a text chunk (TextStream holds it),
// but should one, it is replaced as DumpJson replaces it everywhere.
TEST(TextChunkWriterTest, InvalidUtf8IsReplacedAsDumpJsonDoes) {
  const TextChunkWriter writer(false, "cmpl-1", 1, "m");
  const std::string text = "ab\xe2\x82";
  EXPECT_EQ(writer.Event(0, text), Reference(false, "cmpl-1", 1, "m", 0, text));
  EXPECT_NE(writer.Event(0, text).find("\xef\xbf\xbd"), std::string::npos);
}

}  // namespace
}  // namespace tandem::openai
