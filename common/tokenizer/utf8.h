// The little UTF-8 the tokenizer needs: decode one code point strictly
// (no overlongs, no surrogates, nothing above U+10FFFF) and append one.
//
// Thread-safe: free functions without state.
#ifndef TANDEM_COMMON_TOKENIZER_UTF8_H_
#define TANDEM_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

// Decodes the code point at `*pos` into `*cp` and advances `*pos` past it.
// On an invalid or truncated sequence returns false and advances by one byte.
// REQUIRES: *pos < text.size().
bool NextCodePoint(std::string_view text, size_t* pos, char32_t* cp);

// Appends the UTF-8 encoding of `cp`. REQUIRES: cp is a Unicode scalar value.
void AppendUtf8(char32_t cp, std::string* out);

bool IsValidUtf8(std::string_view text);

}  // namespace tandem::tokenizer_internal

#endif  // TANDEM_COMMON_TOKENIZER_UTF8_H_
