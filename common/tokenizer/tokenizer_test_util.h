// Shared by the tokenizer tests: a byte-vocabulary tokenizer's data (the
// kind `tandem make-model` writes), a UTF-8 corpus for round trips, and the
// path of the real SmolLM2 model.
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_TEST_UTIL_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_TEST_UTIL_H_

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace tandem::tokenizer_test {

// Ids of the special tokens in ByteVocabularyData().
inline constexpr TokenId kByteVocabEndOfText = 256;    // control
inline constexpr TokenId kByteVocabImStart = 257;      // control
inline constexpr TokenId kByteVocabImEnd = 258;        // control
inline constexpr TokenId kByteVocabUserDefined = 259;  // user-defined "<tool>"

// Ids 0..255: the byte-alphabet token of byte i; then the specials above.
// No merges, so every byte is one token. BOS = <|im_start|>, EOS = <|im_end|>.
TokenizerData ByteVocabularyData();

// Valid UTF-8 strings that stress byte-level BPE: emoji with ZWJ and skin
// tones, CJK, Arabic, combining accents, controls, every kind of
// whitespace, digits of several scripts, special-token look-alikes.
std::vector<std::string> Utf8Corpus();

// models/SmolLM2-135M-Instruct.Q4_1.gguf in the source tree (fetched by
// tools/setup.sh); tests skip when it is absent.
std::string SmolLm2Path();

}  // namespace tandem::tokenizer_test

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_TEST_UTIL_H_
