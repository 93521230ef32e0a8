// Grammar: the scheduler-side state machine of a structured-output request.
// It advances only on committed tokens (in UpdateFromOutput), and fills the
// allowed-token mask of the next position. A grammar must have seen token N
// before it can mask token N+1, which is why steps of such requests defer
// their sampling while a previous token is in flight
// (scheduler/README.md §4.7).
//
// Thread-compatible: owned by one Request, used on the engine thread only.
#ifndef TANDEM_SCHEDULER_CORE_GRAMMAR_H_
#define TANDEM_SCHEDULER_CORE_GRAMMAR_H_

#include <cstdint>

#include "absl/types/span.h"
#include "common/types.h"

namespace tandem::scheduler {

class Grammar {
 public:
  virtual ~Grammar() = default;
  // Advances over committed tokens. Returns false if a token is not allowed;
  // the request then finishes with an error.
  virtual bool AcceptTokens(absl::Span<const TokenId> tokens) = 0;
  // Writes the mask of tokens allowed next: bit t of row[t / 32] is set iff
  // token t is allowed. `row` has (vocab_size + 31) / 32 words, zeroed.
  virtual void FillBitmask(absl::Span<uint32_t> row, int32_t vocab_size) const = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_GRAMMAR_H_
