// StructuredSpec: what a request constrains its output to, as the API read
// it (response_format, guided_*, structured_outputs). Plain data: the wire
// format fills it without depending on the grammar engine.
#ifndef TANDEM_SCHEDULER_SERVER_STRUCTURED_STRUCTURED_SPEC_H_
#define TANDEM_SCHEDULER_SERVER_STRUCTURED_STRUCTURED_SPEC_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::structured {

enum class StructuredKind {
  kJsonObject,  // any JSON object (response_format json_object)
  kJsonSchema,  // `text` is a JSON schema
  kRegex,       // `text` is a regular expression
  kChoice,      // exactly one of `choices`
  kGrammar,     // `text` is an EBNF grammar (GBNF-like, root rule "root")
};

struct StructuredSpec {
  StructuredKind kind = StructuredKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  std::string param;  // the request field it came from, named by errors
};

inline std::string_view KindName(StructuredKind kind) {
  switch (kind) {
    case StructuredKind::kJsonObject: return "json_object";
    case StructuredKind::kJsonSchema: return "json_schema";
    case StructuredKind::kRegex: return "regex";
    case StructuredKind::kChoice: return "choice";
    case StructuredKind::kGrammar: return "grammar";
  }
  return "unknown";
}

}  // namespace tandem::structured

#endif  // TANDEM_SCHEDULER_SERVER_STRUCTURED_STRUCTURED_SPEC_H_
