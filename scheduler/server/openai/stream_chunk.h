// The SSE event of a streamed chunk that carries only text, written straight
// into a string. Most events of a stream are these (one per token); building
// each as an nlohmann object (a std::map per level, every key and value
// allocated) and dumping it was the HTTP thread's largest item of its own at
// concurrency 1 (3-5% of the scheduler's samples with its allocations; 3.2 us
// a chunk hot in cache, 0.22 us this way). The bytes are the same as that dump's: keys in
// sorted order, strings escaped by nlohmann (DumpJson). The other chunks
// (a chat stream's first with its role, the last with finish_reason,
// logprobs, tool calls) stay on the general path.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_STREAM_CHUNK_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_STREAM_CHUNK_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::openai {

class TextChunkWriter {
 public:
  // `chat`: a chat.completion.chunk (the text goes in delta.content);
  // otherwise a text_completion chunk (in text).
  TextChunkWriter(bool chat, const std::string& id, int64_t created, const std::string& model);

  // "data: {...}\n\n" for choice `index` with `text`: finish_reason and
  // logprobs null.
  std::string Event(size_t index, const std::string& text) const;

 private:
  bool chat_;
  std::string tail_;  // after the choices array: created, id, model, object and the closing brace
};

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_STREAM_CHUNK_H_
