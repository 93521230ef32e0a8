#include "common/tokenizer/byte_alphabet.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// Stand-ins are all below U+0144, so the inverse is a small array.
constexpr char32_t kAlphabetEnd = 0x144;

struct Tables {
  std::array<char32_t, 256> to_alphabet{};
  std::array<int16_t, kAlphabetEnd> to_byte{};  // -1: not in the alphabet
};

// GPT-2's bytes_to_unicode().
Tables BuildTables() {
  Tables t;
  t.to_byte.fill(-1);
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t.to_alphabet[b] = printable ? static_cast<char32_t>(b) : next++;
    t.to_byte[t.to_alphabet[b]] = static_cast<int16_t>(b);
  }
  return t;
}

const Tables& GetTables() {
  static const Tables tables = BuildTables();
  return tables;
}

}  // namespace

char32_t ByteToAlphabet(uint8_t byte) { return GetTables().to_alphabet[byte]; }

std::string EncodeByteAlphabet(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToAlphabet(static_cast<uint8_t>(c)), &out);
  return out;
}

bool DecodeByteAlphabet(std::string_view text, std::string* bytes) {
  const Tables& t = GetTables();
  size_t pos = 0;
  char32_t cp;
  while (pos < text.size()) {
    if (!NextCodePoint(text, &pos, &cp) || cp >= kAlphabetEnd || t.to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(t.to_byte[cp]));
  }
  return true;
}

}  // namespace tandem::tokenizer_internal
