// The Jinja parser: lexed pieces to a syntax tree, with jinja2's operator
// precedence. Nesting (of blocks and of expressions) is bounded, so a
// hostile template cannot exhaust the stack.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_PARSER_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_PARSER_H_

#include "absl/status/statusor.h"
#include "scheduler/server/openai/jinja/ast.h"
#include "scheduler/server/openai/jinja/lexer.h"

namespace tandem::jinja {

inline constexpr int kMaxNesting = 100;

// Errors are InvalidArgument naming the line and column.
absl::StatusOr<Body> Parse(const LexedTemplate& lexed);

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_PARSER_H_
