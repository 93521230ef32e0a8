#include "tools/bench/serve_bench.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/tokenizer/utf8.h"

// The dataset and the reading of one streamed response. Statistics are in
// serve_bench_stats.cc, the HTTP driver in serve_bench_http.cc.

namespace tandem::bench {
namespace {

using Json = nlohmann::ordered_json;

// A uniform integer in [lo, hi] by rejection, so that a seed gives the same
// draws with any standard library (std::uniform_int_distribution may differ).
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(rng());
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % span;
  uint64_t draw;
  do {
    draw = rng();
  } while (draw >= limit);
  return lo + static_cast<int64_t>(draw % span);
}

// A uniform double in [0, 1).
double UniformUnit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// `text` without the bytes that do not form valid UTF-8.
std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    char32_t cp;
    if (tokenizer_internal::NextCodePoint(text, &pos, &cp)) out.append(text.substr(begin, pos - begin));
  }
  return out;
}

// A prompt that encodes to `target` tokens where a few rounds of adjusting
// get there; `*len` receives its actual length.
std::string RandomPrompt(const Tokenizer& tokenizer, const std::vector<TokenId>& allowed, int64_t target,
                         std::mt19937_64& rng, int64_t* len) {
  constexpr int kMaxRounds = 10;
  const auto draw = [&] { return allowed[UniformInt(rng, 0, static_cast<int64_t>(allowed.size()) - 1)]; };
  std::vector<TokenId> ids(target);
  for (TokenId& id : ids) id = draw();
  std::string text;
  for (int round = 0;; ++round) {
    text = ValidUtf8(tokenizer.Decode(ids, /*skip_special=*/false));
    std::vector<TokenId> encoded = tokenizer.Encode(text, /*add_special=*/false, /*parse_special=*/false);
    *len = static_cast<int64_t>(encoded.size());
    if (*len == target || round == kMaxRounds) break;
    if (*len > target) encoded.resize(target);
    while (static_cast<int64_t>(encoded.size()) < target) encoded.push_back(draw());
    ids = std::move(encoded);
  }
  return text;
}

}  // namespace

std::string Truncated(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(std::string(text.substr(0, max)), "...");
}

// ---------------------------------------------------------------- dataset

std::pair<int64_t, int64_t> LengthRange(int64_t len, double range_ratio) {
  // The epsilon keeps 100 * 1.1 = 110.00000000000001 from rounding up to 111.
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - range_ratio) + 1e-9)));
  const int64_t hi = std::max(lo, static_cast<int64_t>(std::ceil(len * (1 + range_ratio) - 1e-9)));
  return {lo, hi};
}

absl::Status ValidateRandomDatasetOptions(const RandomDatasetOptions& options) {
  if (options.num_prompts < 1) return absl::InvalidArgumentError("--num-prompts must be at least 1");
  if (options.input_len < 1) return absl::InvalidArgumentError("--random-input-len must be at least 1");
  if (options.output_len < 1) return absl::InvalidArgumentError("--random-output-len must be at least 1");
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--random-range-ratio must be in [0, 1), got ", options.range_ratio));
  }
  return absl::OkStatus();
}

std::vector<BenchRequest> SampleRandomRequests(const Tokenizer& tokenizer, const RandomDatasetOptions& options) {
  // Tokens that are not whole UTF-8 on their own (byte fallbacks, halves of
  // a character) are left out too: their bytes would be dropped.
  std::vector<TokenId> allowed;
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    const std::string bytes = tokenizer.TokenBytes(id);
    if (!bytes.empty() && ValidUtf8(bytes).size() == bytes.size()) allowed.push_back(id);
  }
  TANDEM_CHECK(!allowed.empty());
  std::mt19937_64 rng(options.seed);
  const auto [in_lo, in_hi] = LengthRange(options.input_len, options.range_ratio);
  const auto [out_lo, out_hi] = LengthRange(options.output_len, options.range_ratio);
  std::vector<BenchRequest> requests(options.num_prompts);
  for (BenchRequest& request : requests) {
    const int64_t input_len = UniformInt(rng, in_lo, in_hi);
    request.output_len = UniformInt(rng, out_lo, out_hi);
    request.prompt = RandomPrompt(tokenizer, allowed, input_len, rng, &request.prompt_len);
  }
  return requests;
}

std::vector<double> ArrivalOffsets(int64_t count, double request_rate, uint64_t seed) {
  std::vector<double> offsets(count, 0.0);
  if (std::isinf(request_rate)) return offsets;
  std::mt19937_64 rng(seed);
  double t = 0;
  for (int64_t i = 0; i < count; ++i) {
    offsets[i] = t;
    t += -std::log1p(-UniformUnit(rng)) / request_rate;
  }
  return offsets;
}

// ---------------------------------------------------------------- one response

StreamReader::StreamReader(bool chat, double send_time) : chat_(chat), send_time_(send_time) {}

void StreamReader::Feed(std::string_view bytes, double now) {
  now_ = now;
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      line_.append(bytes);
      return;
    }
    line_.append(bytes.substr(0, newline));
    bytes.remove_prefix(newline + 1);
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    OnLine(line_);
    line_.clear();
  }
}

void StreamReader::OnLine(std::string_view line) {
  if (line.empty()) {  // the end of an event
    if (!data_.empty()) OnEvent(data_);
    data_.clear();
    return;
  }
  if (line.front() == ':') return;  // a comment
  const size_t colon = line.find(':');
  if (line.substr(0, colon) != "data") return;  // event:, id:, retry: do not matter here
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (!data_.empty()) data_ += '\n';
  data_.append(value);
}

void StreamReader::OnEvent(std::string_view data) {
  if (done_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const Json chunk = Json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object()) {
    if (error_.empty()) error_ = absl::StrCat("not a JSON object in the stream: ", Truncated(data, 200));
    return;
  }
  if (const auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
    if (error_.empty()) {
      error_ = absl::StrCat("error event: ", error->dump(-1, ' ', false, Json::error_handler_t::replace));
    }
    return;
  }
  if (const auto choices = chunk.find("choices");
      choices != chunk.end() && choices->is_array() && !choices->empty() && choices->front().is_object()) {
    const Json& choice = choices->front();
    std::string text;
    const auto append = [&text](const Json& object, const char* key) {
      if (const auto it = object.find(key); it != object.end() && it->is_string()) text += it->get<std::string>();
    };
    if (chat_) {
      if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        append(*delta, "reasoning_content");
        append(*delta, "content");
      }
    } else {
      append(choice, "text");
    }
    if (!text.empty()) {
      if (content_chunks_ == 0) {
        first_time_ = now_;
      } else {
        itl_.push_back(now_ - last_time_);
      }
      last_time_ = now_;
      ++content_chunks_;
      text_ += text;
    }
  }
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    if (const auto it = usage->find("completion_tokens"); it != usage->end() && it->is_number_integer()) {
      completion_tokens_ = it->get<int64_t>();
    }
    if (const auto it = usage->find("prompt_tokens"); it != usage->end() && it->is_number_integer()) {
      prompt_tokens_ = it->get<int64_t>();
    }
  }
}

RequestOutput StreamReader::Finish(const std::string& transport_error, int64_t prompt_len) {
  // A last event without its blank line still counts.
  if (!line_.empty()) {
    OnLine(line_);
    line_.clear();
  }
  if (!data_.empty()) OnEvent(data_);
  data_.clear();

  RequestOutput out;
  out.start_time = send_time_;
  out.ttft = content_chunks_ > 0 ? first_time_ - send_time_ : 0;
  out.latency = content_chunks_ > 0 ? last_time_ - send_time_ : 0;
  out.itl = itl_;
  out.output_tokens = completion_tokens_.value_or(content_chunks_);
  out.prompt_tokens = prompt_tokens_.value_or(prompt_len);
  out.generated_text = text_;
  if (!error_.empty()) {
    out.error = error_;
  } else if (!done_) {
    // After [DONE] a broken connection loses nothing.
    out.error = transport_error.empty() ? "the stream ended before data: [DONE]" : transport_error;
  } else if (content_chunks_ == 0) {
    out.error = "no chunk carried text, so TTFT cannot be measured";
  }
  out.success = out.error.empty();
  return out;
}
}  // namespace tandem::bench
