// TextStream: a request's output tokens to streamable text, with OpenAI/vLLM
// stop strings.
//
//  * Only complete UTF-8 is emitted (IncrementalDecoder holds a partial
//    character until the token that completes it).
//  * The longest suffix of the text that is a prefix of some stop string is
//    held back, so a stop string split across tokens is never partly
//    emitted. With no stop strings nothing is held back and the output is
//    exactly IncrementalDecoder's.
//  * Tokens are decoded one at a time and each new byte advances one
//    Knuth-Morris-Pratt matcher per stop string, whose state is how much of
//    that stop string the text currently ends with. So the output is never
//    rescanned, the cost is O(stop strings) per byte whatever their length,
//    and the held-back tail is the largest state.
//  * Each token's text goes out with the delta that emits its last byte, and
//    num_released() counts the tokens whose text is out in full, so logprobs
//    can travel with their text: a token held back by a possible stop string
//    or inside an unfinished character is released later; a token that
//    emitted nothing (a skipped special token) is released with the text
//    before it. At a stop, the tokens that contributed text before the cut
//    are released and the ones wholly inside the cut stop string never are.
//  * The match that wins is the first one completed as the text grows: the
//    smallest end offset, and among matches ending there the longest. So the
//    result does not depend on how tokens are grouped into Add calls, and is
//    the full text cut at that match (before it, or after it with
//    include_stop_in_output); text after it, in the same token or later, is
//    dropped.
//
// Thread-compatible: one per request, used by the thread that owns it.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_TEXT_STREAM_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_TEXT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/types.h"

namespace tandem::openai {

struct TextDelta {
  std::string text;      // safe to emit now
  bool stopped = false;  // a stop string matched; `text` ends just before it (or after it
                         // with include_stop_in_output)
  std::string stop;      // the matched stop string
};

class TextStream {
 public:
  // `tokenizer` must outlive the stream. Empty stop strings are ignored, and
  // so are ones that are not valid UTF-8 (decoded text is valid UTF-8, so
  // such a string could only match inside a character; the frontend should
  // reject them when it parses the request).
  // A stop string completed by one of the first `min_tokens` tokens does not
  // count (vLLM: stop strings are checked once min_tokens are out).
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop,
             bool include_stop_in_output = false, bool skip_special = true, int32_t min_tokens = 0);

  // Adds the request's next tokens and returns the text that can be emitted
  // now. Once a stop string has matched, further calls return an empty delta.
  // REQUIRES: Finish() has not been called.
  TextDelta Add(absl::Span<const TokenId> ids);

  // The request ended: returns everything held back, a trailing incomplete
  // UTF-8 sequence as U+FFFD. Empty after a stop. The flushed text is still
  // cut at a stop string (possible only for one containing U+FFFD); stopped()
  // tells. Later calls return "".
  std::string Finish();

  // All text returned so far, by Add and Finish.
  const std::string& emitted() const { return emitted_; }
  // Tokens added, up to and including the one that completed the stop
  // string; tokens after it (in the same Add or later) are not counted, as
  // the model would have stopped there. So the count, like the text, does
  // not depend on how tokens were grouped into Add calls.
  int32_t num_tokens() const { return num_tokens_; }
  // The first num_released() of those tokens have all their text in
  // emitted(); never decreases. After Finish, every counted token not cut
  // by a stop string.
  int32_t num_released() const { return num_released_; }
  bool stopped() const { return stopped_; }

 private:
  // One stop string and how much of it the text ends with.
  struct StopMatcher {
    std::string stop;
    std::vector<size_t> failure;  // KMP: failure[i] = border of stop[0..i]
    size_t matched = 0;           // < stop.size() while no match
  };

  // Advances every matcher over `c`; returns the longest stop string
  // completed by it, or nullptr.
  const std::string* Step(char c);
  // Consumes `text` (new decoded text); appends what may be emitted to
  // `delta` and sets its stop fields on a match.
  void Consume(const std::string& text, TextDelta* delta);
  // Decodes one token's text and records where its bytes end.
  std::string Decode(TokenId id);
  // Releases the tokens whose text emitted() holds; at a stop, also the one
  // it cut into, and drops the rest.
  void Release();

  IncrementalDecoder decoder_;
  std::vector<StopMatcher> stops_;
  const bool include_stop_;
  const int32_t min_tokens_;
  // Decoded, not yet emitted: the longest suffix of the text that is a
  // proper prefix of a stop string (size == the largest `matched`).
  std::string held_;
  std::string emitted_;
  // Decoded bytes so far, and the end offset in them of each counted token
  // not yet released; kUnknown while its bytes are held by the decoder.
  static constexpr size_t kUnknown = ~size_t{0};
  size_t decoded_ = 0;
  std::deque<size_t> token_ends_;
  size_t released_end_ = 0;  // end of the last released token
  int32_t num_released_ = 0;
  int32_t num_tokens_ = 0;
  bool stopped_ = false;
  bool finished_ = false;
};

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_TEXT_STREAM_H_
