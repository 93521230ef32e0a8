#include "scheduler/server/structured/grammar_factory.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/server/structured/xgrammar_grammar.h"
#include "xgrammar/xgrammar.h"

namespace tandem::structured {
namespace {

// xgrammar's vocabulary: each id's raw bytes (VocabType::RAW, since our
// tokenizer already decodes the byte-level alphabet); special tokens are
// empty strings, which xgrammar never matches against text.
xgrammar::TokenizerInfo MakeTokenizerInfo(const Tokenizer& tokenizer) {
  std::vector<std::string> vocab(tokenizer.vocab_size());
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) vocab[id] = tokenizer.TokenBytes(id);
  }
  std::vector<int32_t> stops;
  if (tokenizer.eos_token_id() >= 0) stops.push_back(tokenizer.eos_token_id());
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, tokenizer.vocab_size(), stops);
}

// xgrammar's messages start with a source location ("[hh:mm:ss] file.cc:123: ");
// the client needs only what follows it.
std::string CleanMessage(std::string message) {
  const size_t at = message.find(".cc:");
  if (at != std::string::npos) {
    const size_t colon = message.find(": ", at + 4);
    if (colon != std::string::npos) message = message.substr(colon + 2);
  }
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return message;
}

xgrammar::CompiledGrammar CompileWith(xgrammar::GrammarCompiler& compiler, const StructuredSpec& spec) {
  // One fixed layout (", " and ": " as Python's json.dumps writes them) and
  // no free whitespace: a small model otherwise may emit whitespace until
  // max_tokens, which no schema forbids.
  constexpr bool kAnyWhitespace = false;
  switch (spec.kind) {
    case StructuredKind::kJsonObject:
      return compiler.CompileJSONSchema(R"({"type": "object"})", kAnyWhitespace);
    case StructuredKind::kJsonSchema:
      return compiler.CompileJSONSchema(spec.text, kAnyWhitespace);
    case StructuredKind::kRegex:
      return compiler.CompileRegex(spec.text);
    case StructuredKind::kChoice:
      return compiler.CompileGrammar(ChoiceGrammar(spec.choices), "root");
    case StructuredKind::kGrammar:
      return compiler.CompileGrammar(spec.text, "root");
  }
  return compiler.CompileBuiltinJSONGrammar();
}

std::string CacheKey(const StructuredSpec& spec) {
  std::string key(KindName(spec.kind).data(), KindName(spec.kind).size());
  key.push_back('\0');
  if (spec.kind == StructuredKind::kChoice) {
    for (const std::string& c : spec.choices) absl::StrAppend(&key, c.size(), ":", c);
  } else {
    key += spec.text;
  }
  return key;
}

}  // namespace

std::string ChoiceGrammar(const std::vector<std::string>& choices) {
  std::string grammar = "root ::=";
  for (size_t i = 0; i < choices.size(); ++i) {
    absl::StrAppend(&grammar, i == 0 ? " \"" : " | \"");
    for (unsigned char c : choices[i]) {
      if (c == '"' || c == '\\') {
        grammar.push_back('\\');
        grammar.push_back(static_cast<char>(c));
      } else if (c < 0x20 || c == 0x7f) {
        absl::StrAppendFormat(&grammar, "\\x%02x", c);
      } else {
        grammar.push_back(static_cast<char>(c));  // UTF-8 passes through
      }
    }
    grammar.push_back('"');
  }
  return grammar;
}

GrammarFactory::GrammarFactory(const Tokenizer* tokenizer, GrammarFactoryOptions options)
    : tokenizer_(tokenizer), options_(options) {}

GrammarFactory::~GrammarFactory() = default;

absl::StatusOr<std::shared_ptr<xgrammar::GrammarCompiler>> GrammarFactory::GetCompiler() {
  absl::MutexLock lock(&mu_);
  if (compiler_ == nullptr) {
    try {
      compiler_ = std::make_shared<xgrammar::GrammarCompiler>(MakeTokenizerInfo(*tokenizer_), options_.compile_threads,
                                                             /*cache_enabled=*/false);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("cannot build the grammar engine's vocabulary: ", e.what()));
    }
  }
  return compiler_;
}

absl::StatusOr<std::shared_ptr<const CompiledStructure>> GrammarFactory::Compile(const StructuredSpec& spec) {
  if (spec.kind == StructuredKind::kChoice && spec.choices.empty()) {
    return absl::InvalidArgumentError("the list of choices is empty");
  }
  const std::string key = CacheKey(spec);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ++stats_.cache_hits;
      return it->second;
    }
  }
  absl::StatusOr<std::shared_ptr<xgrammar::GrammarCompiler>> compiler = GetCompiler();
  if (!compiler.ok()) return compiler.status();
  std::shared_ptr<const CompiledStructure> compiled;
  try {
    compiled = std::make_shared<const CompiledStructure>(CompiledStructure{spec.kind, CompileWith(**compiler, spec)});
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile the ", std::string(KindName(spec.kind)), " of '", spec.param, "': ", CleanMessage(e.what())));
  }
  absl::MutexLock lock(&mu_);
  ++stats_.compiled;
  auto [it, inserted] = cache_.emplace(key, compiled);
  if (inserted) {
    order_.push_back(key);
    if (order_.size() > options_.max_cached) {
      cache_.erase(order_.front());
      order_.pop_front();
    }
  }
  return it->second;
}

std::unique_ptr<scheduler::Grammar> GrammarFactory::NewGrammar(std::shared_ptr<const CompiledStructure> compiled,
                                                               std::vector<TokenId> stop_ids) {
  return std::make_unique<XgrammarGrammar>(std::move(compiled), std::move(stop_ids));
}

GrammarFactory::Stats GrammarFactory::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tandem::structured
