#include "scheduler/server/openai/stream_chunk.h"

#include "absl/strings/str_cat.h"
#include "scheduler/server/openai/json_util.h"

namespace tandem::openai {

TextChunkWriter::TextChunkWriter(bool chat, const std::string& id, int64_t created, const std::string& model)
    : chat_(chat),
      tail_(absl::StrCat("],\"created\":", created, ",\"id\":", DumpJson(id), ",\"model\":", DumpJson(model),
                         ",\"object\":", chat ? "\"chat.completion.chunk\"" : "\"text_completion\"", "}")) {}

std::string TextChunkWriter::Event(size_t index, const std::string& text) const {
  const std::string quoted = DumpJson(text);
  if (chat_) {
    return absl::StrCat("data: {\"choices\":[{\"delta\":{\"content\":", quoted,
                        "},\"finish_reason\":null,\"index\":", index, ",\"logprobs\":null}", tail_, "\n\n");
  }
  return absl::StrCat("data: {\"choices\":[{\"finish_reason\":null,\"index\":", index,
                      ",\"logprobs\":null,\"text\":", quoted, "}", tail_, "\n\n");
}

}  // namespace tandem::openai
