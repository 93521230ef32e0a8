#include "scheduler/server/openai/chat_template.h"

#include <cctype>
#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace tandem::openai {
namespace {

// ---------------------------------------------------------------------------
// Jinja lexing, with the whitespace rules of transformers' environment
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).

// absl::string_view is not std::string_view in every absl build.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

enum class PieceKind { kText, kOutput, kStatement, kComment };

struct Piece {
  PieceKind kind;
  std::string body;           // text, or what is between the delimiters
  size_t start = 0;           // kText: where the text starts in the source
  bool strip_before = false;  // "{{-" "{%-" "{#-"
  bool keep_before = false;   // "{%+" "{#+": no lstrip_blocks
  bool strip_after = false;   // "-}}" "-%}" "-#}"
  bool keep_after = false;    // "+%}" "+#}": no trim_blocks (no "+}}" in Jinja)
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Jinja splits the source into lines (\r\n, \r and \n alike) and joins them
// with \n, dropping one trailing newline.
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

// The end of the tag whose body starts at `pos` (the index of its closing
// delimiter), skipping string literals in expressions; npos if unterminated.
size_t FindTagEnd(std::string_view src, size_t pos, PieceKind kind) {
  if (kind == PieceKind::kComment) return src.find("#}", pos);
  const char close = kind == PieceKind::kOutput ? '}' : '%';
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

// Splits the source into text and tags, always alternating: text, tag,
// text, ..., text (texts may be empty).
absl::StatusOr<std::vector<Piece>> SplitTags(std::string_view src) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  while (true) {
    size_t open = pos;
    PieceKind kind = PieceKind::kText;
    for (; open + 1 < src.size(); ++open) {
      if (src[open] != '{') continue;
      const char c = src[open + 1];
      if (c == '{') kind = PieceKind::kOutput;
      if (c == '%') kind = PieceKind::kStatement;
      if (c == '#') kind = PieceKind::kComment;
      if (kind != PieceKind::kText) break;
    }
    if (kind == PieceKind::kText) open = src.size();
    pieces.push_back({PieceKind::kText, std::string(src.substr(pos, open - pos)), pos});
    if (kind == PieceKind::kText) return pieces;
    Piece tag{kind, "", open};
    size_t body = open + 2;
    if (body < src.size() && (src[body] == '-' || src[body] == '+')) {
      (src[body] == '-' ? tag.strip_before : tag.keep_before) = true;
      ++body;
    }
    size_t end = FindTagEnd(src, body, kind);
    if (end == std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unterminated tag at offset ", open));
    }
    pos = end + 2;
    // "+}}" is no marker: Jinja reads that '+' as an operator.
    if (end > body &&
        (src[end - 1] == '-' || (src[end - 1] == '+' && kind != PieceKind::kOutput))) {
      (src[end - 1] == '-' ? tag.strip_after : tag.keep_after) = true;
      --end;
    }
    tag.body = std::string(src.substr(body, end - body));
    pieces.push_back(std::move(tag));
  }
}

bool IsBlockLike(const Piece& tag) {
  return tag.kind == PieceKind::kStatement || tag.kind == PieceKind::kComment;
}

// Applies whitespace control to the text at pieces[i] (between tags i-1 and
// i+1), as Jinja's lexer does.
void TrimText(std::string_view src, std::vector<Piece>* pieces, size_t i) {
  Piece& text = (*pieces)[i];
  if (i > 0) {
    const Piece& prev = (*pieces)[i - 1];
    size_t skip = 0;
    if (prev.strip_after) {
      while (skip < text.body.size() && IsSpace(text.body[skip])) ++skip;
    } else if (IsBlockLike(prev) && !prev.keep_after && !text.body.empty() &&
               text.body[0] == '\n') {
      skip = 1;
    }
    text.body.erase(0, skip);
    text.start += skip;
  }
  if (i + 1 < pieces->size()) {
    const Piece& next = (*pieces)[i + 1];
    if (next.strip_before) {
      while (!text.body.empty() && IsSpace(text.body.back())) text.body.pop_back();
    } else if (IsBlockLike(next) && !next.keep_before) {
      const size_t line = text.body.rfind('\n') + 1;  // npos + 1 == 0
      const bool line_start = line > 0 || text.start == 0 || src[text.start - 1] == '\n';
      bool blank = line < text.body.size();
      for (size_t k = line; k < text.body.size(); ++k) blank = blank && IsSpace(text.body[k]);
      if (line_start && blank) text.body.resize(line);
    }
  }
}

// ---------------------------------------------------------------------------
// Expressions as tokens.

enum class TokKind { kName, kString, kNumber, kOp };

struct Tok {
  TokKind kind;
  std::string text;  // kString: the decoded value
  bool operator==(const Tok& o) const { return kind == o.kind && text == o.text; }
};

// Reads the string literal at body[*pos] (a quote) and advances past it.
absl::StatusOr<std::string> LexString(std::string_view body, size_t* pos) {
  const char quote = body[(*pos)++];
  std::string value;
  while (*pos < body.size() && body[*pos] != quote) {
    char c = body[(*pos)++];
    if (c == '\\') {
      if (*pos >= body.size()) break;
      const char e = body[(*pos)++];
      switch (e) {
        case 'n':
          c = '\n';
          break;
        case 't':
          c = '\t';
          break;
        case 'r':
          c = '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          c = e;
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("escape \\", std::string(1, e)));
      }
    }
    value.push_back(c);
  }
  if (*pos >= body.size()) return absl::InvalidArgumentError("unterminated string");
  ++*pos;
  return value;
}

absl::StatusOr<std::vector<Tok>> LexExpression(std::string_view body) {
  static constexpr std::string_view kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
  static constexpr std::string_view kOneCharOps = "+-*/%()[]{}.,:|~<>=";
  std::vector<Tok> toks;
  size_t pos = 0;
  while (pos < body.size()) {
    const char c = body[pos];
    const auto is_word = [&](size_t k) {
      return k < body.size() &&
             (std::isalnum(static_cast<unsigned char>(body[k])) || body[k] == '_');
    };
    if (IsSpace(c)) {
      ++pos;
    } else if (c == '\'' || c == '"') {
      absl::StatusOr<std::string> value = LexString(body, &pos);
      if (!value.ok()) return value.status();
      toks.push_back({TokKind::kString, *std::move(value)});
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
               std::isdigit(static_cast<unsigned char>(c))) {
      const size_t begin = pos;
      while (is_word(pos)) ++pos;
      const bool number = std::isdigit(static_cast<unsigned char>(c));
      toks.push_back({number ? TokKind::kNumber : TokKind::kName,
                      std::string(body.substr(begin, pos - begin))});
    } else {
      size_t len = 0;
      for (std::string_view op : kTwoCharOps) {
        if (body.substr(pos, 2) == op) len = 2;
      }
      if (len == 0 && kOneCharOps.find(c) != std::string_view::npos) len = 1;
      if (len == 0)
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected character '", std::string(1, c), "'"));
      toks.push_back({TokKind::kOp, std::string(body.substr(pos, len))});
      pos += len;
    }
  }
  return toks;
}

// Rewrites `a.b` as `a['b']`: attribute access and subscription by a
// constant name are the same lookup for the dicts a chat template sees.
std::vector<Tok> NormalizeAttributes(std::vector<Tok> toks) {
  std::vector<Tok> out;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (toks[i].kind == TokKind::kOp && toks[i].text == "." && !out.empty() &&
        i + 1 < toks.size() && toks[i + 1].kind == TokKind::kName) {
      out.push_back({TokKind::kOp, "["});
      out.push_back({TokKind::kString, toks[i + 1].text});
      out.push_back({TokKind::kOp, "]"});
      ++i;
    } else {
      out.push_back(std::move(toks[i]));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The canonical form: statements as tokens, and every output (an expression
// tag or literal text) as a list of concatenated terms.

struct Term {
  enum Kind { kLiteral, kRef, kOpaque } kind;
  std::string literal;    // kLiteral
  std::vector<Tok> toks;  // kRef: a name with subscripts; kOpaque: anything else
  bool operator==(const Term& o) const {
    return kind == o.kind && literal == o.literal && toks == o.toks;
  }
};

struct Node {
  enum Kind { kOutput, kStatement } kind;
  std::vector<Tok> toks;    // kStatement
  std::vector<Term> terms;  // kOutput, concatenated
};

bool IsOp(const Tok& t, std::string_view op) { return t.kind == TokKind::kOp && t.text == op; }

// Whether toks is `name`, `name[...]`, `name[...][...]`...
bool IsReference(const std::vector<Tok>& toks) {
  if (toks.empty() || toks[0].kind != TokKind::kName) return false;
  size_t i = 1;
  while (i < toks.size()) {
    if (!IsOp(toks[i], "[")) return false;
    int depth = 0;
    for (; i < toks.size(); ++i) {
      if (IsOp(toks[i], "[")) ++depth;
      if (IsOp(toks[i], "]") && --depth == 0) break;
    }
    if (i == toks.size()) return false;
    ++i;
  }
  return true;
}

// An output expression as concatenated terms, when it is a chain of string
// literals and references joined by `+` or `~` (equal for strings);
// otherwise one opaque term.
std::vector<Term> OutputTerms(std::vector<Tok> toks) {
  std::vector<Term> terms;
  std::vector<Tok> current;
  int depth = 0;
  bool simple = true;
  for (size_t i = 0; i <= toks.size() && simple; ++i) {
    if (i < toks.size()) {
      const Tok& t = toks[i];
      if (IsOp(t, "(") || IsOp(t, "[") || IsOp(t, "{")) ++depth;
      if (IsOp(t, ")") || IsOp(t, "]") || IsOp(t, "}")) --depth;
      if (depth > 0 || !(IsOp(t, "+") || IsOp(t, "~"))) {
        current.push_back(t);
        continue;
      }
    }
    if (current.size() == 1 && current[0].kind == TokKind::kString) {
      terms.push_back({Term::kLiteral, current[0].text, {}});
    } else if (IsReference(current)) {
      terms.push_back({Term::kRef, "", current});
    } else {
      simple = false;
    }
    current.clear();
  }
  if (!simple) return {Term{Term::kOpaque, "", std::move(toks)}};
  return terms;
}

bool Mergeable(const Node& node) {
  if (node.kind != Node::kOutput) return false;
  for (const Term& t : node.terms) {
    if (t.kind == Term::kOpaque) return false;
  }
  return true;
}

// Appends an output node, merging it into the previous one when both are
// plain concatenations, and folding adjacent literals.
void AppendOutput(std::vector<Term> terms, std::vector<Node>* nodes) {
  Node node{Node::kOutput, {}, std::move(terms)};
  if (nodes->empty() || !Mergeable(nodes->back()) || !Mergeable(node)) {
    nodes->push_back(std::move(node));
    return;
  }
  std::vector<Term>& into = nodes->back().terms;
  for (Term& t : node.terms) {
    if (t.kind == Term::kLiteral && !into.empty() && into.back().kind == Term::kLiteral) {
      into.back().literal += t.literal;
    } else {
      into.push_back(std::move(t));
    }
  }
}

absl::StatusOr<std::vector<Node>> Canonicalize(std::string_view jinja) {
  const std::string src = NormalizeNewlines(jinja);
  absl::StatusOr<std::vector<Piece>> pieces = SplitTags(src);
  if (!pieces.ok()) return pieces.status();
  std::vector<Node> nodes;
  for (size_t i = 0; i < pieces->size(); ++i) {
    Piece& piece = (*pieces)[i];
    if (piece.kind == PieceKind::kComment) continue;
    if (piece.kind == PieceKind::kText) {
      TrimText(src, &*pieces, i);
      if (!piece.body.empty()) AppendOutput({Term{Term::kLiteral, piece.body, {}}}, &nodes);
      continue;
    }
    absl::StatusOr<std::vector<Tok>> lexed = LexExpression(piece.body);
    if (!lexed.ok()) return lexed.status();
    std::vector<Tok> toks = NormalizeAttributes(*std::move(lexed));
    if (piece.kind == PieceKind::kOutput) {
      AppendOutput(OutputTerms(std::move(toks)), &nodes);
    } else {
      nodes.push_back({Node::kStatement, std::move(toks), {}});
    }
  }
  // AppendOutput folds literals only across merged nodes; fold within
  // single nodes too, dropping empty literals ('' + x is x).
  for (Node& node : nodes) {
    std::vector<Term> folded;
    for (Term& t : node.terms) {
      if (t.kind == Term::kLiteral && t.literal.empty() && node.terms.size() > 1) continue;
      if (t.kind == Term::kLiteral && !folded.empty() && folded.back().kind == Term::kLiteral) {
        folded.back().literal += t.literal;
      } else {
        folded.push_back(std::move(t));
      }
    }
    node.terms = std::move(folded);
  }
  return nodes;
}

// ---------------------------------------------------------------------------
// Known families.

// In a pattern, `{{ __default_system__ }}` matches any one string literal.
constexpr char kDefaultSystemCapture[] = "__default_system__";

struct Pattern {
  std::string_view name;
  std::string_view jinja;
};

constexpr char kChatMlMessage[] =
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}";
constexpr char kChatMlGenerationPrompt[] =
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::vector<std::string> ChatMlPatterns() {
  const std::string tail = absl::StrCat(kChatMlMessage, "{% endfor %}", kChatMlGenerationPrompt);
  const std::string default_system = absl::StrCat("{{ ", kDefaultSystemCapture, " }}{% endif %}");
  return {
      absl::StrCat("{% for message in messages %}", tail),
      // SmolLM2, Qwen2.
      absl::StrCat("{% for message in messages %}",
                   "{% if loop.first and messages[0].role != 'system' %}", default_system, tail),
      absl::StrCat("{% for message in messages %}",
                   "{% if loop.first and message.role != 'system' %}", default_system, tail),
  };
}

bool MatchTerms(const std::vector<Term>& pattern, const std::vector<Term>& terms,
                std::optional<std::string>* capture) {
  if (pattern.size() == 1 && pattern[0].kind == Term::kRef && pattern[0].toks.size() == 1 &&
      pattern[0].toks[0].text == kDefaultSystemCapture) {
    if (terms.size() != 1 || terms[0].kind != Term::kLiteral) return false;
    *capture = terms[0].literal;
    return true;
  }
  return pattern == terms;
}

bool Match(const std::vector<Node>& pattern, const std::vector<Node>& nodes,
           std::optional<std::string>* capture) {
  if (pattern.size() != nodes.size()) return false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (pattern[i].kind != nodes[i].kind) return false;
    if (nodes[i].kind == Node::kStatement && pattern[i].toks != nodes[i].toks) return false;
    if (nodes[i].kind == Node::kOutput && !MatchTerms(pattern[i].terms, nodes[i].terms, capture)) {
      return false;
    }
  }
  return true;
}

constexpr char kCompletionsStillWork[] = "/v1/completions with a prompt still works";

absl::Status Unsupported(std::string_view jinja, std::string_view why) {
  return absl::UnimplementedError(absl::StrCat(
      "the model's chat template is not supported (tandem does not run Jinja and recognizes only "
      "ChatML templates",
      why.empty() ? "" : "; ", Av(why), "), so /v1/chat/completions cannot be served; ",
      kCompletionsStillWork, ". Template begins: \"", absl::CHexEscape(Av(jinja.substr(0, 80))),
      "\""));
}

bool IsKnownRole(std::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view jinja) {
  if (jinja.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's chat template is not supported: the model has none (tokenizer.chat_template "
        "is empty), so /v1/chat/completions cannot be served; ",
        kCompletionsStillWork));
  }
  absl::StatusOr<std::vector<Node>> nodes = Canonicalize(jinja);
  if (!nodes.ok()) {
    const absl::string_view why = nodes.status().message();
    return Unsupported(jinja, std::string_view(why.data(), why.size()));
  }
  for (const std::string& text : ChatMlPatterns()) {
    absl::StatusOr<std::vector<Node>> pattern = Canonicalize(text);
    TANDEM_CHECK(pattern.ok()) << pattern.status().ToString() << " in pattern " << text;
    std::optional<std::string> default_system;
    if (Match(*pattern, *nodes, &default_system)) {
      return ChatTemplate("chatml", std::move(default_system), {"<|im_end|>"});
    }
  }
  return Unsupported(jinja, "");
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages: a chat request needs at least one message");
  }
  size_t size = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (!IsKnownRole(role)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "]: role \"", absl::CHexEscape(role.substr(0, 40)),
          role.size() > 40 ? "..." : "", "\" is not one of system, user, assistant, tool"));
    }
    size += role.size() + messages[i].content.size() + 24;
  }
  // The only family so far is ChatML.
  std::string out;
  out.reserve(size + 64 + (default_system_ ? default_system_->size() : 0));
  if (default_system_.has_value() && messages[0].role != "system") out += *default_system_;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace tandem::openai
