// IncrementalDecoder: turns a request's tokens into text as they arrive,
// never emitting broken UTF-8. A token may end in the middle of a character
// (SmolLM2 has tokens that are half an emoji); such trailing bytes are held
// until the next token completes them. Bytes that can never form a valid
// character come out as U+FFFD.
//
// Thread-compatible: one per request stream.
#ifndef TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
#define TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_

#include <string>

#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  IncrementalDecoder(const Tokenizer* tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // The text that `ids` complete.
  std::string Add(absl::Span<const TokenId> ids);
  // Whatever is held back, as U+FFFD (the stream ended mid-character).
  std::string Finish();
  // Whether the last token's bytes end inside a character, held back.
  bool holds_bytes() const { return !pending_.empty(); }

 private:
  const Tokenizer* const tokenizer_;
  const bool skip_special_;
  std::string pending_;  // bytes not yet emitted
};

// Splits `bytes` into the valid UTF-8 text it starts with (invalid sequences
// replaced by U+FFFD) and leaves in `bytes` an incomplete final sequence, if
// any. Exposed for tests.
std::string TakeCompleteUtf8(std::string* bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
