// The GPT-2 byte alphabet: every byte value has a printable stand-in
// character, so that byte-level BPE vocabularies and merges can be written
// as text. Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF)
// stand for themselves; the other 68 bytes, in order, become U+0100..U+0143
// (so the space 0x20 is 'Ġ' U+0120 and the newline 0x0A is 'Ċ' U+010A).
//
// Thread-safe: free functions over constant tables.
#ifndef TANDEM_COMMON_TOKENIZER_BYTE_ALPHABET_H_
#define TANDEM_COMMON_TOKENIZER_BYTE_ALPHABET_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

// The stand-in character for `byte`.
char32_t ByteToAlphabet(uint8_t byte);

// `bytes` written in the byte alphabet (UTF-8).
std::string EncodeByteAlphabet(std::string_view bytes);

// The bytes that `text` (UTF-8 in the byte alphabet) stands for, appended to
// `bytes`. Returns false, leaving `bytes` unspecified, if `text` is not valid
// UTF-8 or holds a character outside the alphabet.
bool DecodeByteAlphabet(std::string_view text, std::string* bytes);

}  // namespace tandem::tokenizer_internal

#endif  // TANDEM_COMMON_TOKENIZER_BYTE_ALPHABET_H_
