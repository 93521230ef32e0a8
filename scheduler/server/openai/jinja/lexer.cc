#include "scheduler/server/openai/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::jinja {
namespace {

enum class TagKind { kText, kOutput, kStatement, kComment };

// A tag or text before whitespace control.
struct RawPiece {
  TagKind kind;
  std::string body;
  size_t start = 0;           // kText: first byte; tags: the body's first byte
  size_t open = 0;            // tags: the '{'
  bool strip_before = false;  // "{{-" "{%-" "{#-"
  bool keep_before = false;   // "{%+" "{#+": no lstrip_blocks
  bool strip_after = false;   // "-}}" "-%}" "-#}"
  bool keep_after = false;    // "+%}" "+#}": no trim_blocks
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// jinja2 joins the source's lines with \n and drops one trailing newline.
std::string NormalizeNewlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The index of the closing delimiter of the tag whose body starts at `pos`,
// skipping string literals; npos if unterminated.
size_t FindTagEnd(std::string_view src, size_t pos, TagKind kind) {
  if (kind == TagKind::kComment) return src.find("#}", pos);
  const char close = kind == TagKind::kOutput ? '}' : '%';
  for (size_t i = pos; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      for (++i; i < src.size() && src[i] != c; ++i) {
        if (src[i] == '\\') ++i;
      }
      if (i >= src.size()) return std::string_view::npos;
    } else if (c == close && i + 1 < src.size() && src[i + 1] == '}') {
      return i;
    }
  }
  return std::string_view::npos;
}

// Text and tags, alternating: text, tag, text, ..., text.
absl::StatusOr<std::vector<RawPiece>> SplitTags(std::string_view src) {
  std::vector<RawPiece> pieces;
  size_t pos = 0;
  while (true) {
    size_t open = pos;
    TagKind kind = TagKind::kText;
    for (; open + 1 < src.size(); ++open) {
      if (src[open] != '{') continue;
      const char c = src[open + 1];
      if (c == '{') kind = TagKind::kOutput;
      if (c == '%') kind = TagKind::kStatement;
      if (c == '#') kind = TagKind::kComment;
      if (kind != TagKind::kText) break;
    }
    if (kind == TagKind::kText) open = src.size();
    pieces.push_back({TagKind::kText, std::string(src.substr(pos, open - pos)), pos});
    if (kind == TagKind::kText) return pieces;
    RawPiece tag{kind, "", open + 2};
    tag.open = open;
    size_t body = open + 2;
    if (body < src.size() && (src[body] == '-' || src[body] == '+')) {
      (src[body] == '-' ? tag.strip_before : tag.keep_before) = true;
      ++body;
    }
    size_t end = FindTagEnd(src, body, kind);
    if (end == std::string_view::npos) {
      return ErrorAt(src, open, kind == TagKind::kComment ? "unterminated comment" : "unterminated tag");
    }
    pos = end + 2;
    // "+}}" is no marker: jinja2 reads that '+' as an operator.
    if (end > body && (src[end - 1] == '-' || (src[end - 1] == '+' && kind != TagKind::kOutput))) {
      (src[end - 1] == '-' ? tag.strip_after : tag.keep_after) = true;
      --end;
    }
    tag.start = body;
    tag.body = std::string(src.substr(body, end - body));
    pieces.push_back(std::move(tag));
  }
}

bool IsBlockLike(const RawPiece& tag) { return tag.kind == TagKind::kStatement || tag.kind == TagKind::kComment; }

// Whitespace control on the text at pieces[i], between tags i-1 and i+1.
void TrimText(std::string_view src, std::vector<RawPiece>* pieces, size_t i) {
  RawPiece& text = (*pieces)[i];
  if (i > 0) {
    const RawPiece& prev = (*pieces)[i - 1];
    size_t skip = 0;
    if (prev.strip_after) {
      while (skip < text.body.size() && IsSpace(text.body[skip])) ++skip;
    } else if (IsBlockLike(prev) && !prev.keep_after && !text.body.empty() && text.body[0] == '\n') {
      skip = 1;
    }
    text.body.erase(0, skip);
    text.start += skip;
  }
  if (i + 1 < pieces->size()) {
    const RawPiece& next = (*pieces)[i + 1];
    if (next.strip_before) {
      while (!text.body.empty() && IsSpace(text.body.back())) text.body.pop_back();
    } else if (IsBlockLike(next) && !next.keep_before) {
      // lstrip_blocks: spaces and tabs between a line's start and the tag.
      const size_t line = text.body.rfind('\n') + 1;  // npos + 1 == 0
      const bool line_start = line > 0 || text.start == 0 || src[text.start - 1] == '\n';
      bool blank = true;
      for (size_t k = line; k < text.body.size(); ++k) blank = blank && (text.body[k] == ' ' || text.body[k] == '\t');
      if (line_start && blank) text.body.resize(line);
    }
  }
}

absl::StatusOr<std::string> LexString(std::string_view src, size_t* pos, size_t end) {
  const size_t open = *pos;
  const char quote = src[(*pos)++];
  std::string value;
  while (*pos < end && src[*pos] != quote) {
    char c = src[(*pos)++];
    if (c == '\\' && *pos < end) {
      const char e = src[(*pos)++];
      switch (e) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case '\\': case '\'': case '"': c = e; break;
        default:
          // Python keeps an unknown escape as written.
          value.push_back('\\');
          c = e;
      }
    }
    value.push_back(c);
  }
  if (*pos >= end) return ErrorAt(src, open, "unterminated string");
  ++*pos;
  return value;
}

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

absl::StatusOr<Token> LexNumber(std::string_view src, size_t* pos, size_t end) {
  const size_t begin = *pos;
  std::string digits;
  bool is_float = false;
  auto take_digits = [&] {
    while (*pos < end && (std::isdigit(static_cast<unsigned char>(src[*pos])) || src[*pos] == '_')) {
      if (src[*pos] != '_') digits.push_back(src[*pos]);
      ++*pos;
    }
  };
  take_digits();
  if (*pos + 1 < end && src[*pos] == '.' && std::isdigit(static_cast<unsigned char>(src[*pos + 1]))) {
    is_float = true;
    digits.push_back('.');
    ++*pos;
    take_digits();
  }
  if (*pos < end && (src[*pos] == 'e' || src[*pos] == 'E')) {
    size_t k = *pos + 1;
    if (k < end && (src[k] == '+' || src[k] == '-')) ++k;
    if (k < end && std::isdigit(static_cast<unsigned char>(src[k]))) {
      is_float = true;
      digits += std::string(src.substr(*pos, k - *pos));
      *pos = k;
      take_digits();
    }
  }
  Token t;
  t.offset = begin;
  t.text = std::string(src.substr(begin, *pos - begin));
  if (is_float) {
    t.kind = Token::Kind::kFloat;
    t.float_value = std::strtod(digits.c_str(), nullptr);
  } else {
    t.kind = Token::Kind::kInt;
    errno = 0;
    t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) return ErrorAt(src, begin, "integer literal out of range");
  }
  return t;
}

absl::StatusOr<std::vector<Token>> LexExpression(std::string_view src, size_t begin, size_t end) {
  static constexpr std::string_view kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
  static constexpr std::string_view kOneCharOps = "+-*/%()[]{}.,:|~<>=";
  std::vector<Token> toks;
  size_t pos = begin;
  while (pos < end) {
    const char c = src[pos];
    if (IsSpace(c)) {
      ++pos;
    } else if (c == '\'' || c == '"') {
      const size_t at = pos;
      absl::StatusOr<std::string> value = LexString(src, &pos, end);
      if (!value.ok()) return value.status();
      toks.push_back({Token::Kind::kString, *std::move(value), 0, 0, at});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      absl::StatusOr<Token> number = LexNumber(src, &pos, end);
      if (!number.ok()) return number.status();
      toks.push_back(*std::move(number));
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t at = pos;
      while (pos < end && IsWordChar(src[pos])) ++pos;
      toks.push_back({Token::Kind::kName, std::string(src.substr(at, pos - at)), 0, 0, at});
    } else {
      size_t len = 0;
      for (std::string_view op : kTwoCharOps) {
        if (src.substr(pos, 2) == op) len = 2;
      }
      if (len == 0 && kOneCharOps.find(c) != std::string_view::npos) len = 1;
      if (len == 0) return ErrorAt(src, pos, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      toks.push_back({Token::Kind::kOp, std::string(src.substr(pos, len)), 0, 0, pos});
      pos += len;
    }
  }
  toks.push_back({Token::Kind::kEnd, "", 0, 0, end});
  return toks;
}

}  // namespace

std::string Position(std::string_view source, size_t offset) {
  offset = std::min(offset, source.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xc0) != 0x80) {
      ++column;
    }
  }
  return absl::StrCat("line ", line, ", column ", column);
}

absl::Status ErrorAt(std::string_view source, size_t offset, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " at ", Position(source, offset)));
}

absl::StatusOr<LexedTemplate> Lex(std::string_view source) {
  LexedTemplate out;
  out.source = NormalizeNewlines(source);
  const std::string& src = out.source;
  absl::StatusOr<std::vector<RawPiece>> raw = SplitTags(src);
  if (!raw.ok()) return raw.status();
  for (size_t i = 0; i < raw->size(); ++i) {
    RawPiece& piece = (*raw)[i];
    if (piece.kind == TagKind::kComment) continue;
    if (piece.kind == TagKind::kText) {
      TrimText(src, &*raw, i);
      if (!piece.body.empty()) out.pieces.push_back({Piece::Kind::kText, piece.body, {}, piece.start});
      continue;
    }
    absl::StatusOr<std::vector<Token>> toks = LexExpression(src, piece.start, piece.start + piece.body.size());
    if (!toks.ok()) return toks.status();
    const Piece::Kind kind = piece.kind == TagKind::kOutput ? Piece::Kind::kOutput : Piece::Kind::kStatement;
    out.pieces.push_back({kind, "", *std::move(toks), piece.open});
  }
  return out;
}

}  // namespace tandem::jinja
