#include "proto/diff/step_diff.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::wire {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed step diff: ", what));
}

// Every list entry a diff spends on a row: a removal costs one, a join two
// (its id is wider).
constexpr int64_t kJoinCost = 2;

// A new request's computed count, or null when `id` is not a new request.
const int32_t* FindNew(absl::Span<const std::pair<int64_t, int32_t>> rows, int64_t id) {
  if (rows.empty()) return nullptr;
  // The last entry with this id, as the receiver's RowComputed takes it.
  auto it = std::upper_bound(rows.begin(), rows.end(), id,
                             [](int64_t v, const std::pair<int64_t, int32_t>& e) { return v < e.first; });
  return it == rows.begin() || (it - 1)->first != id ? nullptr : &(it - 1)->second;
}

}  // namespace

void SortNewRows(std::vector<std::pair<int64_t, int32_t>>* rows) {
  std::stable_sort(rows->begin(), rows->end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

StepDiffState::StepDiffState() : ring_(kHistory) {}

void StepDiffState::Reset() {
  head_ = 0;
  count_ = 0;
}

const StepDiffState::Step* StepDiffState::Base(int base) const {
  if (base < 1 || base > count_) return nullptr;
  return &ring_[(head_ - (base - 1) + kHistory) % kHistory];
}

const std::vector<int64_t>* StepDiffState::Rows(uint64_t step_seq) const {
  for (int b = 1; b <= count_; ++b) {
    const Step* s = Base(b);
    if (s->step_seq == step_seq) return &s->ids;
  }
  return nullptr;
}

void StepDiffState::CollectNewIds(const v1::SchedulerOutput& step) {
  new_ids_.clear();
  for (const v1::NewRequest& r : step.new_requests()) new_ids_.push_back(r.request_id());
  std::sort(new_ids_.begin(), new_ids_.end());
}

bool StepDiffState::IsNew(int64_t id) const {
  return !new_ids_.empty() && std::binary_search(new_ids_.begin(), new_ids_.end(), id);
}

void StepDiffState::RowComputed(const v1::SchedulerOutput& step) {
  const v1::CachedRequests& c = step.cached_requests();
  const int num_cached = std::min(c.request_ids_size(), c.num_computed_tokens_size());
  const int n = static_cast<int>(ids_.size());
  computed_.assign(n, -1);
  int j = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t id = ids_[r];
    if (j < num_cached && c.request_ids(j) == id) {
      computed_[r] = c.num_computed_tokens(j++);
    } else if (IsNew(id)) {
      for (const v1::NewRequest& q : step.new_requests()) {
        if (q.request_id() == id) computed_[r] = q.num_computed_tokens();
      }
    }
  }
}

StepDiffState::Step& StepDiffState::Advance(uint64_t step_seq, absl::Span<const int64_t> ids) {
  head_ = (head_ + 1) % kHistory;
  count_ = std::min(count_ + 1, kHistory);
  Step& s = ring_[head_];
  s.step_seq = step_seq;
  s.ids.assign(ids.begin(), ids.end());
  return s;
}

void StepDiffState::Remember(uint64_t step_seq, absl::Span<const int64_t> ids, absl::Span<const int32_t> tokens) {
  Step& s = Advance(step_seq, ids);
  s.next_computed.resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) s.next_computed[r] = computed_[r] < 0 ? -1 : computed_[r] + tokens[r];
}

StepDiffState::Match StepDiffState::TryBase(int base, absl::Span<const int64_t> ids, int64_t limit) {
  const Step* b = Base(base);
  const size_t n = ids.size();
  size_t k = 0;
  int64_t removed = 0;
  for (int64_t id : b->ids) {
    if (k < n && id == ids[k]) {
      ++k;
    } else if (++removed >= limit) {
      return {base, std::numeric_limits<int64_t>::max()};
    }
  }
  return {base, removed + kJoinCost * static_cast<int64_t>(n - k)};
}

bool StepDiffState::Compact(v1::SchedulerOutput* step, v1::BatchDiff* diff) {
  const v1::CachedRequests& c = step->cached_requests();
  resumed_.assign(c.resumed().begin(), c.resumed().end());
  block_offsets_.assign(1, 0);
  for (int32_t count : c.num_new_block_ids()) block_offsets_.push_back(block_offsets_.back() + count);
  new_rows_.clear();
  for (const v1::NewRequest& r : step->new_requests()) new_rows_.emplace_back(r.request_id(), r.num_computed_tokens());
  SortNewRows(&new_rows_);
  StepRows rows;
  rows.step_seq = step->step_seq();
  rows.ids = absl::MakeConstSpan(step->scheduled_request_ids().data(), step->scheduled_request_ids_size());
  rows.tokens = absl::MakeConstSpan(step->num_scheduled_tokens().data(), step->num_scheduled_tokens_size());
  rows.cached_ids = absl::MakeConstSpan(c.request_ids().data(), c.request_ids_size());
  rows.cached_resumed = resumed_;
  rows.cached_computed = absl::MakeConstSpan(c.num_computed_tokens().data(), c.num_computed_tokens_size());
  rows.cached_block_offsets = block_offsets_;
  rows.new_rows = new_rows_;
  if (!CompactRows(rows, diff)) {
    (void)Record(*step);
    return false;
  }
  step->clear_scheduled_request_ids();
  step->clear_num_scheduled_tokens();
  v1::CachedRequests* mc = step->mutable_cached_requests();
  mc->clear_request_ids();
  mc->clear_resumed();
  mc->clear_num_computed_tokens();
  mc->clear_num_new_block_ids();
  return true;
}

bool StepDiffState::CompactRows(const StepRows& s, v1::BatchDiff* diff) {
  diff->Clear();
  const size_t n = s.ids.size();
  const size_t m = s.cached_ids.size();
  if (s.tokens.size() != n || s.cached_resumed.size() != m || s.cached_computed.size() != m ||
      s.cached_block_offsets.size() != m + 1) {
    return false;
  }
  // Raw pointers in the loops below: absl's hardened Span checks every index.
  const int64_t* ids = s.ids.data();
  const int32_t* tokens = s.tokens.data();
  const int64_t* cached_ids = s.cached_ids.data();
  const int32_t* cached_computed = s.cached_computed.data();
  // One pass checks the scheduler's shape (the cached entries are the
  // scheduled rows that are not new, in the same order) and works out what
  // each row's request will have computed after this step. A row is the
  // next cached entry if its id is; only the others are looked up among the
  // new requests, each of which must be one row (so no id is both, and this
  // reads the rows as the receiver does).
  computed_.resize(n);
  size_t j = 0;
  size_t fresh_rows = 0;
  for (size_t r = 0; r < n; ++r) {
    int32_t before;
    if (j < m && cached_ids[j] == ids[r]) {
      before = cached_computed[j++];
    } else if (const int32_t* fresh = FindNew(s.new_rows, ids[r]); fresh != nullptr) {
      before = *fresh;
      ++fresh_rows;
    } else {
      return false;
    }
    computed_[r] = before < 0 ? -1 : before + tokens[r];
  }
  if (j != m || fresh_rows != s.new_rows.size()) return false;

  Match best{0, kJoinCost * static_cast<int64_t>(n)};
  for (int b = 1; b <= std::min(kMaxBase, count_) && best.cost > 0; ++b) {
    const Match match = TryBase(b, s.ids, best.cost);
    if (match.cost < best.cost) best = match;
  }
  diff->set_base(best.base);
  const Step* base = Base(best.base);
  const size_t base_size = base != nullptr ? base->ids.size() : 0;
  const int64_t* base_ids = base != nullptr ? base->ids.data() : nullptr;
  const int32_t* base_next = base != nullptr ? base->next_computed.data() : nullptr;
  const uint8_t* resumed = s.cached_resumed.data();
  const int32_t* block_offsets = s.cached_block_offsets.data();
  // Then one pass over the rows and the base writes every list of the diff.
  // The rows kept from the base come first, in its order: each is the next
  // base entry with its id (those skipped left); the first row the rest of
  // the base lacks, and every row after it, joined.
  size_t i = 0;  // the next base entry
  j = 0;
  for (size_t r = 0; r < n; ++r) {
    const int64_t id = ids[r];
    int32_t predicted = -1;
    size_t found = i;
    while (found < base_size && base_ids[found] != id) ++found;
    for (const size_t end = std::min(found, base_size); i < end; ++i) diff->add_removed(static_cast<uint32_t>(i));
    if (found < base_size) {
      predicted = base_next[found];
      i = found + 1;
    } else {
      diff->add_appended(id);
    }
    if (tokens[r] != 1) {
      diff->add_token_rows(static_cast<uint32_t>(r));
      diff->add_token_counts(tokens[r]);
    }
    if (j == m || cached_ids[j] != id) continue;  // a new request, as the first pass found
    const uint32_t entry = static_cast<uint32_t>(j);
    if (cached_computed[j] != predicted) {
      diff->add_computed_entries(entry);
      diff->add_computed_values(cached_computed[j]);
    }
    if (resumed[j] != 0) diff->add_resumed_entries(entry);
    if (const int32_t blocks = block_offsets[j + 1] - block_offsets[j]; blocks != 0) {
      diff->add_block_entries(entry);
      diff->add_block_counts(blocks);
    }
    ++j;
  }
  for (; i < base_size; ++i) diff->add_removed(static_cast<uint32_t>(i));
  Advance(s.step_seq, s.ids).next_computed.swap(computed_);
  return true;
}

absl::Status StepDiffState::Record(const v1::SchedulerOutput& step) {
  if (step.num_scheduled_tokens_size() != step.scheduled_request_ids_size()) {
    return Malformed("scheduled_request_ids and num_scheduled_tokens differ in length");
  }
  ids_.assign(step.scheduled_request_ids().begin(), step.scheduled_request_ids().end());
  tokens_.assign(step.num_scheduled_tokens().begin(), step.num_scheduled_tokens().end());
  CollectNewIds(step);
  RowComputed(step);
  Remember(step.step_seq(), ids_, tokens_);
  return absl::OkStatus();
}

absl::Status StepDiffState::Expand(const v1::BatchDiff& diff, v1::SchedulerOutput* step) {
  if (step->scheduled_request_ids_size() != 0 || step->num_scheduled_tokens_size() != 0 ||
      step->cached_requests().request_ids_size() != 0) {
    return Malformed("a step with a diff also lists its rows");
  }
  const Step* b = nullptr;
  if (diff.base() != 0) {
    b = diff.base() <= static_cast<uint32_t>(kMaxBase) ? Base(static_cast<int>(diff.base())) : nullptr;
    if (b == nullptr) return Malformed(absl::StrCat("base ", diff.base(), " is not a step this end holds"));
  }
  ids_.clear();
  predicted_.clear();
  const int base_size = b ? static_cast<int>(b->ids.size()) : 0;
  int next_removed = 0;
  for (int i = 0; i < base_size; ++i) {
    if (next_removed < diff.removed_size() && diff.removed(next_removed) == static_cast<uint32_t>(i)) {
      ++next_removed;
      continue;
    }
    ids_.push_back(b->ids[i]);
    predicted_.push_back(b->next_computed[i]);
  }
  // Positions left over were out of range or not ascending.
  if (next_removed != diff.removed_size()) return Malformed("removed positions are not ascending positions of the base");
  for (int64_t id : diff.appended()) {
    ids_.push_back(id);
    predicted_.push_back(-1);
  }
  const int n = static_cast<int>(ids_.size());
  tokens_.assign(n, 1);
  if (diff.token_rows_size() != diff.token_counts_size()) return Malformed("token_rows and token_counts differ in length");
  for (int i = 0; i < diff.token_rows_size(); ++i) {
    if (diff.token_rows(i) >= static_cast<uint32_t>(n) || diff.token_counts(i) <= 0) {
      return Malformed("a token count outside the rows, or not positive");
    }
    tokens_[diff.token_rows(i)] = diff.token_counts(i);
  }
  CollectNewIds(*step);
  v1::CachedRequests* c = step->mutable_cached_requests();
  // The cached entries' counts, predicted. Without new requests (most
  // steps) the entries are the rows, and computed_ stays a row's count.
  const bool all_cached = new_ids_.empty();
  if (all_cached) {
    c->mutable_request_ids()->Add(ids_.begin(), ids_.end());
    computed_.assign(predicted_.begin(), predicted_.end());
  } else {
    computed_.clear();
    for (int r = 0; r < n; ++r) {
      if (IsNew(ids_[r])) continue;
      c->add_request_ids(ids_[r]);
      computed_.push_back(predicted_[r]);
    }
  }
  const int m = c->request_ids_size();
  if (diff.computed_entries_size() != diff.computed_values_size() ||
      diff.block_entries_size() != diff.block_counts_size()) {
    return Malformed("entry and value lists differ in length");
  }
  for (int i = 0; i < diff.computed_entries_size(); ++i) {
    if (diff.computed_entries(i) >= static_cast<uint32_t>(m)) return Malformed("a computed count outside the entries");
    computed_[diff.computed_entries(i)] = diff.computed_values(i);
  }
  for (int32_t computed : computed_) {
    if (computed < 0) return Malformed("a cached entry's computed count is neither predictable nor sent");
  }
  c->mutable_num_computed_tokens()->Add(computed_.begin(), computed_.end());
  c->mutable_resumed()->Resize(m, false);
  for (uint32_t j : diff.resumed_entries()) {
    if (j >= static_cast<uint32_t>(m)) return Malformed("a resumed entry outside the entries");
    c->set_resumed(static_cast<int>(j), true);
  }
  c->mutable_num_new_block_ids()->Resize(m, 0);
  for (int i = 0; i < diff.block_entries_size(); ++i) {
    if (diff.block_entries(i) >= static_cast<uint32_t>(m) || diff.block_counts(i) < 0) {
      return Malformed("a block count outside the entries, or negative");
    }
    c->set_num_new_block_ids(static_cast<int>(diff.block_entries(i)), diff.block_counts(i));
  }
  step->mutable_scheduled_request_ids()->Add(ids_.begin(), ids_.end());
  step->mutable_num_scheduled_tokens()->Add(tokens_.begin(), tokens_.end());
  if (!all_cached) RowComputed(*step);
  Remember(step->step_seq(), ids_, tokens_);
  return absl::OkStatus();
}

void CompactResult(v1::StepResult* result) {
  v1::ModelRunnerOutput* out = result->mutable_output();
  const int n = out->request_ids_size();
  if (out->num_sampled_size() != n) return;  // not ours to judge: the receiver refuses it as it is
  result->set_rows_implied(true);
  out->clear_request_ids();
  // A byte at a time, checking the counts on the way (a row per step).
  const int32_t* counts = out->num_sampled().data();
  std::string* bits = result->mutable_sampled_rows();
  bits->resize((n + 7) / 8);
  int32_t other = 0;  // a count other than 0 and 1 sets a bit here
  for (int base = 0; base < n; base += 8) {
    const int end = std::min(n, base + 8);
    uint32_t byte = 0;
    for (int r = base; r < end; ++r) {
      other |= counts[r] & ~1;
      byte |= static_cast<uint32_t>(counts[r] & 1) << (r - base);
    }
    (*bits)[base / 8] = static_cast<char>(byte);
  }
  if (other != 0) {
    result->clear_sampled_rows();
    return;
  }
  out->clear_num_sampled();
}

absl::Status ExpandResult(absl::Span<const int64_t> rows, v1::StepResult* result) {
  if (!result->rows_implied()) return absl::OkStatus();
  v1::ModelRunnerOutput* out = result->mutable_output();
  if (out->request_ids_size() != 0) return Malformed("a result with implied rows also lists them");
  const int n = static_cast<int>(rows.size());
  out->mutable_request_ids()->Add(rows.begin(), rows.end());
  if (out->num_sampled_size() == 0) {
    const std::string& bits = result->sampled_rows();
    if (bits.size() > static_cast<size_t>((n + 7) / 8)) return Malformed("more sampled-row bits than rows");
    out->mutable_num_sampled()->Resize(n, 0);
    int32_t* counts = out->mutable_num_sampled()->mutable_data();
    for (size_t byte = 0; byte < bits.size(); ++byte) {
      const uint32_t b = static_cast<uint8_t>(bits[byte]);
      const int base = static_cast<int>(byte) * 8;
      const int end = std::min(n, base + 8);
      for (int r = base; r < end; ++r) counts[r] = static_cast<int32_t>(b >> (r - base) & 1);
    }
  }
  result->set_rows_implied(false);
  result->clear_sampled_rows();
  return absl::OkStatus();
}

}  // namespace tandem::wire
