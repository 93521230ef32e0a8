#include "common/tokenizer/utf8.h"

#include <cstdint>

#include "common/check.h"

namespace tandem::tokenizer_internal {

bool NextCodePoint(std::string_view text, size_t* pos, char32_t* cp) {
  TANDEM_DCHECK(*pos < text.size());
  const size_t start = *pos;
  const uint8_t lead = static_cast<uint8_t>(text[start]);
  *pos = start + 1;
  if (lead < 0x80) {
    *cp = lead;
    return true;
  }
  int length;
  char32_t value;
  char32_t min_value;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, value = lead & 0x1F, min_value = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, value = lead & 0x0F, min_value = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, value = lead & 0x07, min_value = 0x10000;
  } else {
    return false;  // a continuation byte or 0xF8..0xFF
  }
  if (text.size() - start < static_cast<size_t>(length)) return false;
  for (int i = 1; i < length; ++i) {
    const uint8_t byte = static_cast<uint8_t>(text[start + i]);
    if ((byte & 0xC0) != 0x80) return false;
    value = (value << 6) | (byte & 0x3F);
  }
  if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return false;
  }
  *cp = value;
  *pos = start + length;
  return true;
}

void AppendUtf8(char32_t cp, std::string* out) {
  TANDEM_DCHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF));
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  char32_t cp;
  while (pos < text.size()) {
    if (!NextCodePoint(text, &pos, &cp)) return false;
  }
  return true;
}

}  // namespace tandem::tokenizer_internal
