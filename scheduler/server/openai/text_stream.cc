#include "scheduler/server/openai/text_stream.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "common/tokenizer/utf8.h"

namespace tandem::openai {

TextStream::TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop,
                       bool include_stop_in_output, bool skip_special, int32_t min_tokens)
    : decoder_(tokenizer, skip_special), include_stop_(include_stop_in_output), min_tokens_(min_tokens) {
  for (std::string& s : stop) {
    if (s.empty() || !tokenizer_internal::IsValidUtf8(s)) continue;
    StopMatcher m;
    m.failure.assign(s.size(), 0);
    for (size_t i = 1, k = 0; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = m.failure[k - 1];
      if (s[i] == s[k]) ++k;
      m.failure[i] = k;
    }
    m.stop = std::move(s);
    stops_.push_back(std::move(m));
  }
}

const std::string* TextStream::Step(char c) {
  const std::string* completed = nullptr;
  for (StopMatcher& m : stops_) {
    while (m.matched > 0 && m.stop[m.matched] != c) m.matched = m.failure[m.matched - 1];
    if (m.stop[m.matched] == c) ++m.matched;
    if (m.matched == m.stop.size()) {
      if (completed == nullptr || m.stop.size() > completed->size()) completed = &m.stop;
      m.matched = m.failure[m.matched - 1];  // keeps the invariant; unused after a stop
    }
  }
  return completed;
}

void TextStream::Consume(const std::string& text, TextDelta* delta) {
  if (text.empty()) return;
  const size_t base = held_.size();
  held_ += text;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string* stop = Step(text[i]);
    if (stop == nullptr || num_tokens_ < min_tokens_) continue;
    // The match ends at held_[base + i]; keep what precedes it (and it).
    held_.resize(base + i + 1 - (include_stop_ ? 0 : stop->size()));
    delta->text += held_;
    delta->stopped = true;
    delta->stop = *stop;
    held_.clear();
    stopped_ = true;
    return;
  }
  size_t keep = 0;
  for (const StopMatcher& m : stops_) keep = std::max(keep, m.matched);
  TANDEM_DCHECK(keep <= held_.size());
  delta->text.append(held_, 0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
}

std::string TextStream::Decode(TokenId id) {
  std::string text = decoder_.Add({&id, 1});
  decoded_ += text.size();
  // Text out means the bytes held before this token are out (they come first): the tokens they
  // came from end here.
  if (!text.empty() || !decoder_.holds_bytes()) {
    for (auto it = token_ends_.rbegin(); it != token_ends_.rend() && *it == kUnknown; ++it) *it = decoded_;
  }
  token_ends_.push_back(decoder_.holds_bytes() ? kUnknown : decoded_);
  return text;
}

void TextStream::Release() {
  // A stop cuts the text at emitted_.size(): a token that started before the cut contributed text.
  const size_t cut = emitted_.size();
  if (stopped_) {  // the stopping token may end inside a character, after the cut
    for (size_t& end : token_ends_) end = std::min(end, decoded_);
  }
  while (!token_ends_.empty() && token_ends_.front() != kUnknown &&
         (token_ends_.front() <= cut || (stopped_ && released_end_ < cut))) {
    released_end_ = token_ends_.front();
    token_ends_.pop_front();
    ++num_released_;
  }
  if (stopped_) token_ends_.clear();
}

TextDelta TextStream::Add(absl::Span<const TokenId> ids) {
  TANDEM_DCHECK(!finished_) << "TextStream::Add after Finish";
  TextDelta delta;
  for (size_t i = 0; i < ids.size() && !stopped_; ++i) {
    ++num_tokens_;
    Consume(Decode(ids[i]), &delta);
  }
  emitted_ += delta.text;
  Release();
  return delta;
}

std::string TextStream::Finish() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  TextDelta delta;
  const std::string rest = decoder_.Finish();
  decoded_ += rest.size();
  for (size_t& end : token_ends_) {
    if (end == kUnknown) end = decoded_;
  }
  Consume(rest, &delta);
  delta.text += held_;  // no stop string can complete any more
  held_.clear();
  emitted_ += delta.text;
  Release();
  return std::move(delta.text);
}

}  // namespace tandem::openai
