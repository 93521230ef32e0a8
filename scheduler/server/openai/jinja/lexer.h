// The Jinja lexer: splits a template into literal text, `{{ }}` outputs and
// `{% %}` statements (comments dropped), applying whitespace control as
// transformers configures jinja2 (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, `-` and `+` modifiers), and tokenizes the
// expressions inside tags. Every token keeps its offset for error messages.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_LEXER_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::jinja {

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // names, operators; kString: the decoded value
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // in the normalized source
};

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;           // kText
  std::vector<Token> tokens;  // kOutput, kStatement; ends with a kEnd token
  size_t offset = 0;
};

struct LexedTemplate {
  std::string source;  // newlines normalized to \n, one trailing newline dropped
  std::vector<Piece> pieces;
};

absl::StatusOr<LexedTemplate> Lex(std::string_view source);

// "line L, column C" of `offset` in `source` (both 1-based).
std::string Position(std::string_view source, size_t offset);

// InvalidArgument "<what> at line L, column C".
absl::Status ErrorAt(std::string_view source, size_t offset, const std::string& what);

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_LEXER_H_
