// BpeModel: byte-level BPE merging within one word. A word starts as one
// token per byte (the byte-alphabet tokens) and adjacent pairs are merged,
// lowest merge rank first and leftmost first among equal ranks, until no
// pair has a merge: Hugging Face's BPE::merge_word, with a heap so a long
// word costs O(n log n).
//
// A vocabulary may lack tokens for bytes its training text never had:
// SmolLM2's lacks 21 (the controls 0x04 0x06 0x13 0x14 0x16 0x1D, and 0xC0
// 0xC1 0xF1 0xF2 0xF5..0xFF, which valid UTF-8 never or, for unassigned
// planes, hardly uses). Such bytes are dropped before merging, as HF's BPE
// (without an unk token) drops them, so their neighbours may merge;
// llama.cpp drops them too but does not merge across them.
//
// Thread-safe after Create (immutable).
#ifndef TANDEM_COMMON_TOKENIZER_BPE_H_
#define TANDEM_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace tandem::tokenizer_internal {

class BpeModel {
 public:
  // `token_ids` maps each token's text (byte alphabet) to its id; `merges`
  // are "left right" by rank. Refuses (InvalidArgument) a vocabulary without
  // a token for each printable ASCII byte and \t \n \v \f \r (it is not
  // byte-level), and a merge that is malformed or names a token, or makes a
  // token, that the vocabulary lacks. A repeated merge keeps its first rank.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const absl::flat_hash_map<std::string, TokenId>& token_ids,
      const std::vector<std::string>& merges);

  // Appends the tokens of `word` (raw bytes, non-empty) to `ids`.
  void EncodeWord(std::string_view word, std::vector<TokenId>* ids) const;

  // The token that stands for one byte; -1 if the vocabulary has none.
  TokenId byte_token(uint8_t byte) const { return byte_token_[byte]; }

 private:
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  BpeModel() = default;
  static uint64_t PairKey(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* FindMerge(TokenId left, TokenId right) const;

  std::array<TokenId, 256> byte_token_{};  // -1: no token, the byte is dropped
  absl::flat_hash_map<uint64_t, Merge> merges_;
};

}  // namespace tandem::tokenizer_internal

#endif  // TANDEM_COMMON_TOKENIZER_BPE_H_
