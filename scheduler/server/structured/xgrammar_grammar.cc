#include "scheduler/server/structured/xgrammar_grammar.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>

#include "dlpack/dlpack.h"

namespace tandem::structured {
namespace {

int32_t WordsOf(int32_t vocab_size) { return (vocab_size + 31) / 32; }

// The matcher's stop tokens: the request's, within the vocabulary xgrammar knows.
std::vector<int> MatcherStops(const CompiledStructure& compiled, const std::vector<TokenId>& stop_ids) {
  const int vocab = compiled.grammar.GetTokenizerInfo().GetVocabSize();
  std::vector<int> stops;
  for (TokenId id : stop_ids) {
    if (id >= 0 && id < vocab) stops.push_back(id);
  }
  return stops;
}

}  // namespace

XgrammarGrammar::XgrammarGrammar(std::shared_ptr<const CompiledStructure> compiled, std::vector<TokenId> stop_ids)
    : compiled_(std::move(compiled)),
      stop_ids_(std::move(stop_ids)),
      words_(WordsOf(compiled_->grammar.GetTokenizerInfo().GetVocabSize())),
      matcher_(compiled_->grammar, MatcherStops(*compiled_, stop_ids_)) {}

bool XgrammarGrammar::AcceptTokens(absl::Span<const TokenId> tokens) {
  // xgrammar reports errors by exception; none may cross into the engine.
  try {
    for (TokenId token : tokens) {
      // A complete output may be followed by more stop tokens when the
      // request does not end at the first (min_tokens, ignore_eos).
      if (matcher_.IsTerminated() && std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
        continue;
      }
      if (!matcher_.AcceptToken(token)) return false;
    }
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: grammar matcher failed to accept a token: %s\n", e.what());
    return false;
  }
}

void XgrammarGrammar::FillBitmask(absl::Span<uint32_t> row, int32_t vocab_size) const {
  if (matcher_.IsTerminated()) return AllowOnlyStops(row, vocab_size);
  // Both layouts put token t at bit t % 32 of word t / 32: xgrammar writes
  // straight into our row when it is at least as wide.
  const bool direct = static_cast<int64_t>(row.size()) >= words_;
  if (!direct) scratch_.assign(words_, 0);
  int32_t* data = direct ? reinterpret_cast<int32_t*>(row.data()) : scratch_.data();
  int64_t shape[1] = {words_};
  DLTensor tensor{};
  tensor.data = data;
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = DLDataType{kDLInt, 32, 1};
  tensor.shape = shape;
  try {
    matcher_.FillNextTokenBitmask(&tensor);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: grammar matcher failed to fill a mask: %s\n", e.what());
    std::fill(row.begin(), row.end(), 0u);
    return AllowOnlyStops(row, vocab_size);
  }
  if (!direct) std::memcpy(row.data(), scratch_.data(), row.size() * sizeof(uint32_t));
  // Ids past the tokenizer's vocabulary (a padded embedding) are never text.
  for (size_t w = words_; w < row.size(); ++w) row[w] = 0;
  const int32_t known = std::min<int32_t>(vocab_size, words_ * 32);
  if (known % 32 != 0 && known / 32 < static_cast<int32_t>(row.size())) {
    row[known / 32] &= (1u << (known % 32)) - 1;
  }
}

void XgrammarGrammar::AllowOnlyStops(absl::Span<uint32_t> row, int32_t vocab_size) const {
  for (TokenId id : stop_ids_) {
    if (id >= 0 && id < vocab_size && static_cast<size_t>(id / 32) < row.size()) row[id / 32] |= 1u << (id % 32);
  }
}

bool XgrammarGrammar::IsTerminated() const { return matcher_.IsTerminated(); }

}  // namespace tandem::structured
