// Tokenizer: byte-level BPE as GPT-2 and SmolLM2 use it, built from a GGUF
// file's "tokenizer.ggml.*" metadata.
//
//  * Pre-tokenizer: the text is split into words first; for "smollm" and
//    "gpt2" by the GPT-2 pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    ("smollm" also splits every digit on its own first). RE2 has no
//    lookahead, so `\s+(?!\S)` is handled by hand: a whitespace run followed
//    by a non-space gives up its last character to the next word.
//  * Each word's bytes are mapped to the GPT-2 byte alphabet (printable
//    stand-ins for the 256 byte values) and merged by rank.
//  * Special tokens (control/user-defined types, e.g. "<|im_start|>") are
//    matched verbatim before pre-tokenization when parse_special is on.
//    User-defined ones (HF added tokens not marked special) are matched in
//    any text and kept by Decode(skip_special), as HF and llama.cpp do.
//  * A "byte vocabulary" (no merges) encodes one token per byte: the test
//    models written by `tandem make-model` use it.
//
// Decode(Encode(x)) == x for any valid UTF-8 x whose bytes all have tokens:
// always so in a byte vocabulary. A BPE vocabulary may lack a few (SmolLM2
// lacks the controls 0x04 0x06 0x13 0x14 0x16 0x1D and bytes that valid
// UTF-8 hardly uses); Encode drops those bytes, as HF and llama.cpp do.
// Decoding works on bytes: a token may end in the middle of a UTF-8
// sequence (incremental detokenization must hold such bytes back).
//
// Thread-safe after Create (immutable).
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/types.h"

namespace tandem {

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

// What a tokenizer is built from; ReadTokenizerData fills it from GGUF.
struct TokenizerData {
  std::string model = "gpt2";  // tokenizer.ggml.model; only "gpt2" (byte-level BPE) is supported
  std::string pre = "gpt2";    // tokenizer.ggml.pre: "gpt2", "smollm" or "default"
  std::vector<std::string> tokens;      // in the GPT-2 byte alphabet
  std::vector<int32_t> token_types;     // TokenType per token (empty: all normal)
  std::vector<std::string> merges;      // "left right", by rank
  TokenId bos_token_id = -1;            // -1: none
  TokenId eos_token_id = -1;
  TokenId unknown_token_id = -1;
  TokenId padding_token_id = -1;
  bool add_bos_token = false;
  std::string chat_template;            // tokenizer.chat_template (Jinja), may be empty
};

// Reads the tokenizer metadata; errors name the key that is missing or bad.
absl::StatusOr<TokenizerData> ReadTokenizerData(const gguf::GgufFile& file);

class Tokenizer;
// Opens a GGUF file and builds its tokenizer; the error names the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path);

class Tokenizer {
 public:
  // Validates `data` (ids in range, merges name known tokens, every
  // printable ASCII and whitespace byte has a token) and builds the lookup
  // tables. Refuses a tokenizer.ggml.model other than "gpt2" (Unimplemented).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerData data);

  // Token ids of `text`, with BOS first if the model asks for it and
  // `add_special` is set. With `parse_special`, special-token strings in the
  // text become their ids; otherwise they are encoded as plain text.
  std::vector<TokenId> Encode(std::string_view text, bool add_special = true,
                              bool parse_special = true) const;
  // The bytes of `ids` concatenated. Special tokens are included when
  // `skip_special` is false. Unknown ids decode to nothing.
  std::string Decode(absl::Span<const TokenId> ids, bool skip_special = false) const;
  // Raw bytes of one token (its text for a special token).
  std::string TokenBytes(TokenId id) const;

  int32_t vocab_size() const;
  TokenId bos_token_id() const;
  TokenId eos_token_id() const;
  bool IsSpecial(TokenId id) const;
  // Id of an exact token string in the byte alphabet (e.g. "<|im_end|>"), or -1.
  TokenId FindToken(std::string_view text) const;
  const TokenizerData& data() const;

  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
