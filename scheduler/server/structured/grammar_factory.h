// GrammarFactory: compiles structured-output specs against the served
// vocabulary with xgrammar, once per (kind, text), and makes the per-request
// matchers (XgrammarGrammar) the scheduler drives.
//
// The vocabulary (xgrammar's TokenizerInfo: the raw bytes of every token id,
// special tokens as empty strings so no structure ever allows them) and the
// compiler are built on the first Compile, so a server that never sees a
// structured request never pays for them.
//
// Thread-safe: Compile from any HTTP thread at once. Two threads compiling
// the same new spec at once may both compile it; one result is kept.
#ifndef TANDEM_SCHEDULER_SERVER_STRUCTURED_GRAMMAR_FACTORY_H_
#define TANDEM_SCHEDULER_SERVER_STRUCTURED_GRAMMAR_FACTORY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/tokenizer.h"
#include "common/types.h"
#include "scheduler/core/grammar.h"
#include "scheduler/server/structured/structured_spec.h"

namespace xgrammar {
class GrammarCompiler;
}  // namespace xgrammar

namespace tandem::structured {

struct CompiledStructure;

struct GrammarFactoryOptions {
  size_t max_cached = 512;  // compiled structures kept; the oldest goes first
  int compile_threads = 2;  // xgrammar's threads for one compilation
};

class GrammarFactory {
 public:
  // `tokenizer` must outlive the factory.
  explicit GrammarFactory(const Tokenizer* tokenizer, GrammarFactoryOptions options = {});
  ~GrammarFactory();

  // The compiled structure of `spec`, from the cache when it was compiled
  // before. InvalidArgument names what the engine could not compile.
  absl::StatusOr<std::shared_ptr<const CompiledStructure>> Compile(const StructuredSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A fresh matcher at the start of the structure. `stop_ids` end the
  // request (EOS, end of turn, stop_token_ids): once the structure is
  // complete only they are allowed.
  static std::unique_ptr<scheduler::Grammar> NewGrammar(std::shared_ptr<const CompiledStructure> compiled,
                                                        std::vector<TokenId> stop_ids);

  struct Stats {
    int64_t compiled = 0;    // compilations run
    int64_t cache_hits = 0;  // Compile answered from the cache
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The compiler, built on first use.
  absl::StatusOr<std::shared_ptr<xgrammar::GrammarCompiler>> GetCompiler() ABSL_LOCKS_EXCLUDED(mu_);

  const Tokenizer* const tokenizer_;
  const GrammarFactoryOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<xgrammar::GrammarCompiler> compiler_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const CompiledStructure>> cache_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // cache keys, oldest first
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

// The EBNF grammar (root rule "root") that matches exactly one of `choices`.
std::string ChoiceGrammar(const std::vector<std::string>& choices);

}  // namespace tandem::structured

#endif  // TANDEM_SCHEDULER_SERVER_STRUCTURED_GRAMMAR_FACTORY_H_
