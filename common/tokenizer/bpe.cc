#include "common/tokenizer/bpe.h"

#include <functional>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_alphabet.h"
#include "common/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// One symbol of a word being merged: a doubly linked list over positions.
struct Symbol {
  TokenId id;
  int32_t prev;  // -1: first
  int32_t next;  // -1: last
  bool alive;
};

// A pair (pos, its next) that a merge of `rank` would join. Ordered so the
// queue yields the lowest rank, then the leftmost position.
struct Candidate {
  int32_t rank;
  int32_t pos;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const absl::flat_hash_map<std::string, TokenId>& token_ids,
    const std::vector<std::string>& merges) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  for (int byte = 0; byte < 256; ++byte) {
    std::string text;
    AppendUtf8(ByteToAlphabet(static_cast<uint8_t>(byte)), &text);
    auto it = token_ids.find(text);
    model->byte_token_[byte] = it == token_ids.end() ? -1 : it->second;
    const bool required = (byte >= ' ' && byte <= '~') || (byte >= '\t' && byte <= '\r');
    if (it == token_ids.end() && required) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the vocabulary has no token for byte 0x%02X (\"%s\" in the GPT-2 byte alphabet); "
          "byte-level BPE needs one for every printable ASCII and whitespace byte",
          byte, text));
    }
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& merge = merges[rank];
    // Split at the first space after the first character, as llama.cpp does.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 == merge.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " \"", merge, "\" is not \"left right\""));
    }
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    TokenId ids[3];
    const std::string parts[3] = {left, right, left + right};
    for (int i = 0; i < 3; ++i) {
      auto it = token_ids.find(parts[i]);
      if (it == token_ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat("merge ", rank, " \"", merge, "\" ",
                                                       i < 2 ? "names" : "makes", " \"", parts[i],
                                                       "\", which is not in the vocabulary"));
      }
      ids[i] = it->second;
    }
    model->merges_.try_emplace(PairKey(ids[0], ids[1]), Merge{static_cast<int32_t>(rank), ids[2]});
  }
  return model;
}

const BpeModel::Merge* BpeModel::FindMerge(TokenId left, TokenId right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<TokenId>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (char c : word) {
    const TokenId id = byte_token_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // no token for this byte: dropped, its neighbours meet
    const int32_t i = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, i - 1, i + 1, true});
  }
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n == 0) return;
  symbols.back().next = -1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    if (const Merge* m = FindMerge(symbols[pos].id, symbols[symbols[pos].next].id)) {
      queue.push({m->rank, pos});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale if either side changed since the push: ranks name one pair.
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->rank != top.rank) continue;
    left.id = m->result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace tandem::tokenizer_internal
