#include "common/tokenizer/incremental_decoder.h"

#include <algorithm>

namespace tandem {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts, or 0 if it cannot start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether bytes[1..n) may follow `lead` (continuation bytes, and the ranges
// that rule out overlongs, surrogates and code points above U+10FFFF).
bool ValidContinuation(const unsigned char* s, int n) {
  for (int i = 1; i < n; ++i) {
    if ((s[i] & 0xC0) != 0x80) return false;
  }
  if (n >= 2) {
    if (s[0] == 0xE0 && s[1] < 0xA0) return false;
    if (s[0] == 0xED && s[1] > 0x9F) return false;
    if (s[0] == 0xF0 && s[1] < 0x90) return false;
    if (s[0] == 0xF4 && s[1] > 0x8F) return false;
  }
  return true;
}

}  // namespace

std::string TakeCompleteUtf8(std::string* bytes) {
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(bytes->data());
  const size_t size = bytes->size();
  size_t i = 0;
  while (i < size) {
    const int n = SequenceLength(s[i]);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    const size_t available = std::min<size_t>(n, size - i);
    if (!ValidContinuation(s + i, static_cast<int>(available))) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (available < static_cast<size_t>(n)) break;  // incomplete so far: hold it
    out.append(bytes->data() + i, n);
    i += n;
  }
  bytes->erase(0, i);
  return out;
}

std::string IncrementalDecoder::Add(absl::Span<const TokenId> ids) {
  pending_ += tokenizer_->Decode(ids, skip_special_);
  return TakeCompleteUtf8(&pending_);
}

std::string IncrementalDecoder::Finish() {
  std::string out;
  for (size_t i = 0; i < pending_.size(); ++i) out += kReplacement;
  pending_.clear();
  return out;
}

}  // namespace tandem
