#include "common/tokenizer/pre_tokenizer.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/tokenizer/utf8.h"
#include "re2/re2.h"

namespace tandem::tokenizer_internal {
namespace {

// Oniguruma's Unicode \s as an RE2 class body; IsPatternWhitespace agrees.
constexpr char kWhitespace[] =
    R"(\t\n\x0B\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::unique_ptr<re2::RE2> Compile(const std::string& pattern) {
  re2::RE2::Options options;
  options.set_encoding(re2::RE2::Options::EncodingUTF8);
  // Room for more cached DFA states than the default 8 MB: splitting long,
  // varied text runs about 30% faster.
  options.set_max_mem(64 << 20);
  auto re = std::make_unique<re2::RE2>(pattern, options);
  TANDEM_CHECK(re->ok()) << "pattern " << pattern << ": " << re->error();
  return re;
}

}  // namespace

bool IsPatternWhitespace(char32_t cp) {
  if (cp < 0x80) return (cp >= '\t' && cp <= '\r') || cp == ' ';
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view pre) {
  bool split_digits;
  if (pre == "gpt2" || pre == "default") {
    split_digits = false;
  } else if (pre == "smollm") {
    split_digits = true;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.pre \"", std::string(pre),
                     "\" is not supported; tandem knows \"gpt2\", \"smollm\" and \"default\""));
  }
  const std::string ws = kWhitespace;
  std::string word = absl::StrCat(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)", ws,
                                  R"(\p{L}\p{N}]+|[)", ws, "]+");
  return std::unique_ptr<PreTokenizer>(
      new PreTokenizer(split_digits, Compile(word), Compile(R"(\p{N})")));
}

PreTokenizer::PreTokenizer(bool split_digits, std::unique_ptr<re2::RE2> word,
                           std::unique_ptr<re2::RE2> digit)
    : split_digits_(split_digits), word_(std::move(word)), digit_(std::move(digit)) {}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* words) const {
  if (!split_digits_) {
    SplitPiece(text, words);
    return;
  }
  size_t pos = 0;
  re2::StringPiece digit;
  while (pos < text.size() &&
         digit_->Match(text, pos, text.size(), re2::RE2::UNANCHORED, &digit, 1)) {
    const size_t start = digit.data() - text.data();
    SplitPiece(text.substr(pos, start - pos), words);
    words->push_back(text.substr(start, digit.size()));
    pos = start + digit.size();
  }
  SplitPiece(text.substr(pos), words);
}

void PreTokenizer::SplitPiece(std::string_view piece, std::vector<std::string_view>* words) const {
  size_t pos = 0;
  while (pos < piece.size()) {
    re2::StringPiece match;
    size_t end = pos + 1;  // no match: a byte that is not valid UTF-8
    if (word_->Match(piece, pos, piece.size(), re2::RE2::ANCHOR_START, &match, 1) &&
        !match.empty()) {
      end = pos + match.size();
      // `\s+(?!\S)`: a whitespace run followed by more text leaves its last
      // character to start the next word (" b" in "a  b"). Only the `\s+`
      // alternative ends in whitespace, so the last character tells.
      if (end < piece.size()) {
        size_t last = end - 1;
        while (last > pos && (static_cast<uint8_t>(piece[last]) & 0xC0) == 0x80) --last;
        size_t next = last;
        char32_t cp;
        if (last > pos && NextCodePoint(piece, &next, &cp) && IsPatternWhitespace(cp)) end = last;
      }
    }
    words->push_back(piece.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace tandem::tokenizer_internal
