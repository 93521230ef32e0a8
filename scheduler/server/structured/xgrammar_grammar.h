// XgrammarGrammar: scheduler::Grammar over xgrammar's GrammarMatcher. One per
// structured-output request; the compiled grammar it matches is shared by
// every request with the same structure (GrammarFactory caches it).
//
// The matcher sees only committed tokens (Scheduler::UpdateFromOutput calls
// AcceptTokens with the tokens it appends). Preemption keeps a request's
// committed tokens, and tokens still in flight at preemption are delivered
// and committed too (scheduler/README.md §4.8), so no token the matcher has
// seen is ever taken back and no rollback is needed
// (structured_preemption_test checks it).
//
// Thread-compatible: used on the engine thread only, like every Request.
#ifndef TANDEM_SCHEDULER_SERVER_STRUCTURED_XGRAMMAR_GRAMMAR_H_
#define TANDEM_SCHEDULER_SERVER_STRUCTURED_XGRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/types.h"
#include "scheduler/core/grammar.h"
#include "scheduler/server/structured/structured_spec.h"
#include "xgrammar/xgrammar.h"

namespace tandem::structured {

// A structure compiled against the served vocabulary; immutable, shared.
struct CompiledStructure {
  StructuredKind kind;
  xgrammar::CompiledGrammar grammar;
};

class XgrammarGrammar final : public scheduler::Grammar {
 public:
  // `stop_ids` are the tokens that end this request (EOS, end of turn,
  // stop_token_ids): the only ones allowed once the structure is complete.
  XgrammarGrammar(std::shared_ptr<const CompiledStructure> compiled, std::vector<TokenId> stop_ids);

  bool AcceptTokens(absl::Span<const TokenId> tokens) override;
  void FillBitmask(absl::Span<uint32_t> row, int32_t vocab_size) const override;

  // A stop token was accepted: the output is complete.
  bool IsTerminated() const;

 private:
  void AllowOnlyStops(absl::Span<uint32_t> row, int32_t vocab_size) const;

  const std::shared_ptr<const CompiledStructure> compiled_;
  const std::vector<TokenId> stop_ids_;
  const int32_t words_;  // xgrammar's row width, from the tokenizer's vocabulary
  // FillNextTokenBitmask is not const in xgrammar, though filling a mask does
  // not change what the matcher accepts.
  mutable xgrammar::GrammarMatcher matcher_;
  mutable std::vector<int32_t> scratch_;  // a row when ours is narrower than xgrammar's
};

}  // namespace tandem::structured

#endif  // TANDEM_SCHEDULER_SERVER_STRUCTURED_XGRAMMAR_GRAMMAR_H_
