#include "tools/bench/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/tokenizer/utf8.h"

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

std::string Truncated(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(std::string(text.substr(0, max)), "...");
}

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

}  // namespace

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

// ---------------------------------------------------------------- statistics

double Percentile(std::vector<double> values, double percent) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = percent / 100.0 * (values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (values[above] - values[below]) * (rank - below);
}

LatencyStats SummarizeSeconds(const std::vector<double>& seconds) {
  LatencyStats stats;
  if (seconds.empty()) return stats;
  const double mean = Mean(seconds);
  double squares = 0;
  for (double s : seconds) squares += (s - mean) * (s - mean);
  stats.mean_ms = mean * 1000;
  stats.median_ms = Percentile(seconds, 50) * 1000;
  stats.std_ms = std::sqrt(squares / seconds.size()) * 1000;
  stats.p99_ms = Percentile(seconds, 99) * 1000;
  return stats;
}

namespace {

// vLLM's peaks: chunks carrying text and requests in flight per one-second
// bucket from the first send.
void PeakRates(const std::vector<RequestOutput>& outputs, BenchmarkMetrics* metrics) {
  double first_start = std::numeric_limits<double>::infinity(), last_end = 0;
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    first_start = std::min(first_start, o.start_time);
    last_end = std::max(last_end, o.start_time + o.latency);
  }
  if (std::isinf(first_start)) return;
  const size_t buckets = static_cast<size_t>(std::ceil(last_end - first_start)) + 1;
  std::vector<double> tokens(buckets, 0);
  std::vector<int64_t> in_flight(buckets, 0);
  const auto bucket = [&](double t) { return static_cast<int64_t>(t - first_start); };
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    double t = o.start_time + o.ttft;
    for (size_t i = 0; i <= o.itl.size(); ++i) {
      if (i > 0) t += o.itl[i - 1];
      const int64_t b = bucket(t);
      if (b >= 0 && b < static_cast<int64_t>(buckets)) tokens[b] += 1;
    }
    const int64_t end = std::min<int64_t>(bucket(o.start_time + o.latency), buckets - 1);
    for (int64_t b = std::max<int64_t>(0, bucket(o.start_time)); b <= end; ++b) ++in_flight[b];
  }
  metrics->max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  metrics->max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
}

}  // namespace

BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutput>& outputs, double duration_s) {
  BenchmarkMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestOutput& o : outputs) {
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += o.prompt_tokens;
    m.total_output_tokens += o.output_tokens;
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    if (o.output_tokens > 1) tpots.push_back((o.latency - o.ttft) / (o.output_tokens - 1));
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) / duration_s;
  }
  m.ttft = SummarizeSeconds(ttfts);
  m.tpot = SummarizeSeconds(tpots);
  m.itl = SummarizeSeconds(itls);
  m.e2el = SummarizeSeconds(e2els);
  PeakRates(outputs, &m);
  return m;
}

namespace {

// Python's "{s:{c}^{n}}".format(...): `s` centred in `c`, odd padding right.
std::string Centered(const std::string& s, char c, size_t width = 50) {
  if (s.size() >= width) return s;
  const size_t left = (width - s.size()) / 2;
  return std::string(left, c) + s + std::string(width - s.size() - left, c);
}

struct NamedLatency {
  const char* key;     // "ttft": mean_ttft_ms, ...
  const char* short_name;  // "TTFT"
  const char* title;
  LatencyStats BenchmarkMetrics::*stats;
};
constexpr NamedLatency kLatencies[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchmarkMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchmarkMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchmarkMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchmarkMetrics::e2el},
};

}  // namespace

std::string FormatMetricsTable(const BenchmarkConfig& config, const BenchmarkMetrics& m) {
  std::string out = Centered(" Serving Benchmark Result ", '=') + "\n";
  const auto integer = [&out](const char* label, int64_t value) {
    absl::StrAppendFormat(&out, "%-40s %-10d\n", label, value);
  };
  const auto real = [&out](const std::string& label, double value) {
    absl::StrAppendFormat(&out, "%-40s %-10.2f\n", label, value);
  };
  integer("Successful requests:", m.completed);
  integer("Failed requests:", m.failed);
  if (config.max_concurrency > 0) integer("Maximum request concurrency:", config.max_concurrency);
  if (!std::isinf(config.request_rate)) real("Request rate configured (RPS):", config.request_rate);
  real("Benchmark duration (s):", m.duration_s);
  integer("Total input tokens:", m.total_input_tokens);
  integer("Total generated tokens:", m.total_output_tokens);
  real("Request throughput (req/s):", m.request_throughput);
  real("Output token throughput (tok/s):", m.output_throughput);
  real("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  integer("Peak concurrent requests:", m.max_concurrent_requests);
  real("Total Token throughput (tok/s):", m.total_token_throughput);
  for (const NamedLatency& latency : kLatencies) {
    const LatencyStats& stats = m.*latency.stats;
    out += Centered(latency.title, '-') + "\n";
    real(absl::StrCat("Mean ", latency.short_name, " (ms):"), stats.mean_ms);
    real(absl::StrCat("Median ", latency.short_name, " (ms):"), stats.median_ms);
    real(absl::StrCat("P99 ", latency.short_name, " (ms):"), stats.p99_ms);
    real(absl::StrCat("Std ", latency.short_name, " (ms):"), stats.std_ms);
  }
  out += std::string(50, '=') + "\n";
  return out;
}

std::string ResultJson(const BenchmarkConfig& config, const BenchmarkMetrics& m,
                       const std::vector<RequestOutput>& outputs) {
  Json j;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &local);
  j["date"] = date;
  j["backend"] = config.backend;
  j["base_url"] = config.base_url;
  j["endpoint"] = config.endpoint;
  j["model_id"] = config.model;
  j["tokenizer_id"] = config.tokenizer;
  j["num_prompts"] = config.num_prompts;
  if (std::isinf(config.request_rate)) {
    j["request_rate"] = "inf";
  } else {
    j["request_rate"] = config.request_rate;
  }
  j["burstiness"] = 1.0;
  j["max_concurrency"] = config.max_concurrency > 0 ? Json(config.max_concurrency) : Json(nullptr);
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const NamedLatency& latency : kLatencies) {
    const LatencyStats& stats = m.*latency.stats;
    j[absl::StrCat("mean_", latency.key, "_ms")] = stats.mean_ms;
    j[absl::StrCat("median_", latency.key, "_ms")] = stats.median_ms;
    j[absl::StrCat("std_", latency.key, "_ms")] = stats.std_ms;
    j[absl::StrCat("p99_", latency.key, "_ms")] = stats.p99_ms;
  }
  Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(), itls = Json::array(),
       texts = Json::array(), errors = Json::array();
  for (const RequestOutput& o : outputs) {
    input_lens.push_back(o.prompt_tokens);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttfts.push_back(o.ttft);
    itls.push_back(o.itl);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// ---------------------------------------------------------------- HTTP driver

absl::StatusOr<ServerAddress> ParseBaseUrl(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--base-url must start with http:// (https is not supported), got '",
                                                   url, "'"));
  }
  std::string_view rest = std::string_view(url).substr(kScheme.size());
  ServerAddress address;
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    address.path_prefix = std::string(rest.substr(slash));
    while (!address.path_prefix.empty() && address.path_prefix.back() == '/') address.path_prefix.pop_back();
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos && rest.find(']', colon) == std::string_view::npos) {
    int port = 0;
    if (!absl::SimpleAtoi(std::string(rest.substr(colon + 1)), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--base-url has a bad port: '", url, "'"));
    }
    address.port = std::to_string(port);
    rest = rest.substr(0, colon);
  }
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat("--base-url has no host: '", url, "'"));
  address.host = std::string(rest);
  return address;
}

bool IsChatEndpoint(const std::string& endpoint) { return absl::EndsWith(endpoint, "chat/completions"); }

std::string RequestBody(const ClientOptions& options, const BenchRequest& request) {
  Json body;
  body["model"] = options.model;
  if (IsChatEndpoint(options.endpoint)) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", request.prompt}}});
    // Newer servers read max_completion_tokens, older ones max_tokens.
    body["max_completion_tokens"] = request.output_len;
  } else {
    body["prompt"] = request.prompt;
  }
  body["max_tokens"] = request.output_len;
  body["temperature"] = options.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using ErrorCode = boost::system::error_code;

double SecondsSince(Clock::time_point epoch) {
  return std::chrono::duration<double>(Clock::now() - epoch).count();
}

std::string HostHeader(const ServerAddress& server) {
  const std::string host = server.host.find(':') != std::string::npos ? "[" + server.host + "]" : server.host;
  return server.port == "80" ? host : absl::StrCat(host, ":", server.port);
}

std::string Where(const ServerAddress& server) { return absl::StrCat("http://", HostHeader(server)); }

// One streamed request on its own connection (closed at the end).
// Owner: the io_context's thread; keeps itself alive through its handlers.
class StreamingCall : public std::enable_shared_from_this<StreamingCall> {
 public:
  using Done = std::function<void(RequestOutput)>;

  StreamingCall(asio::io_context& io, const tcp::resolver::results_type& endpoints,
                http::request<http::string_body> request, bool chat, int64_t prompt_len, Clock::time_point epoch,
                Done done)
      : socket_(io), endpoints_(endpoints), request_(std::move(request)), prompt_len_(prompt_len),
        reader_(chat, SecondsSince(epoch)), epoch_(epoch), done_(std::move(done)) {
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  // The send time is taken when the call is constructed.
  void Start() {
    asio::async_connect(socket_, endpoints_, [self = shared_from_this()](ErrorCode ec, const tcp::endpoint&) {
      if (ec) return self->Finish(absl::StrCat("connect: ", ec.message()));
      http::async_write(self->socket_, self->request_, [self](ErrorCode ec, size_t) {
        if (ec) return self->Finish(absl::StrCat("sending the request: ", ec.message()));
        http::async_read_header(self->socket_, self->buffer_, self->parser_,
                                [self](ErrorCode ec, size_t) { self->OnHeader(ec); });
      });
    });
  }

 private:
  void OnHeader(ErrorCode ec) {
    if (ec) return Finish(absl::StrCat("reading the response: ", ec.message()));
    if (parser_.get().result() != http::status::ok) {
      // Read the whole error body for the report.
      http::async_read(socket_, buffer_, parser_, [self = shared_from_this()](ErrorCode, size_t) {
        self->Finish(absl::StrCat("HTTP ", self->parser_.get().result_int(), ": ",
                                  Truncated(self->parser_.get().body(), 1000)));
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read_some(socket_, buffer_, parser_, [self = shared_from_this()](ErrorCode ec, size_t) {
      const std::string& body = self->parser_.get().body();
      if (body.size() > self->consumed_) {
        self->reader_.Feed(std::string_view(body).substr(self->consumed_), SecondsSince(self->epoch_));
        self->consumed_ = body.size();
      }
      if (self->reader_.done() || self->parser_.is_done()) return self->Finish("");
      if (ec) return self->Finish(absl::StrCat("the connection broke mid-stream: ", ec.message()));
      self->ReadBody();
    });
  }

  void Finish(const std::string& transport_error) {
    ErrorCode ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    done_(reader_.Finish(transport_error, prompt_len_));
  }

  tcp::socket socket_;
  const tcp::resolver::results_type endpoints_;
  http::request<http::string_body> request_;
  const int64_t prompt_len_;
  StreamReader reader_;
  const Clock::time_point epoch_;
  Done done_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  size_t consumed_ = 0;  // body bytes already fed to reader_
};

// Sends a list of requests at their arrival offsets, at most `limit` in
// flight, and collects the outputs. Owner: the thread calling Run, which
// runs the io_context.
class Dispatcher {
 public:
  Dispatcher(const ClientOptions& options, const tcp::resolver::results_type& endpoints)
      : options_(options), endpoints_(endpoints), timer_(io_) {}

  // Runs `requests` (not owned) to completion; returns the duration.
  double Run(const std::vector<const BenchRequest*>& requests, const std::vector<double>& offsets, int64_t limit,
             bool progress, std::vector<RequestOutput>* outputs) {
    requests_ = &requests;
    offsets_ = &offsets;
    outputs_ = outputs;
    outputs_->assign(requests.size(), RequestOutput());
    limit_ = limit;
    progress_ = progress;
    next_ = 0;
    finished_ = 0;
    in_flight_ = 0;
    waiting_.clear();
    io_.restart();
    epoch_ = Clock::now();
    asio::post(io_, [this] { OnArrivals(); });
    io_.run();
    return SecondsSince(epoch_);
  }

 private:
  void OnArrivals() {
    const double elapsed = SecondsSince(epoch_);
    while (next_ < requests_->size() && (*offsets_)[next_] <= elapsed) waiting_.push_back(next_++);
    Launch();
    if (next_ == requests_->size()) return;
    timer_.expires_at(epoch_ + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>((*offsets_)[next_])));
    timer_.async_wait([this](ErrorCode ec) {
      if (!ec) OnArrivals();
    });
  }

  void Launch() {
    while (!waiting_.empty() && (limit_ == 0 || in_flight_ < limit_)) {
      const size_t index = waiting_.front();
      waiting_.pop_front();
      ++in_flight_;
      const BenchRequest& request = *(*requests_)[index];
      std::make_shared<StreamingCall>(io_, endpoints_, MakeHttpRequest(request), IsChatEndpoint(options_.endpoint),
                                      request.prompt_len, epoch_,
                                      [this, index](RequestOutput output) { OnDone(index, std::move(output)); })
          ->Start();
    }
  }

  void OnDone(size_t index, RequestOutput output) {
    (*outputs_)[index] = std::move(output);
    --in_flight_;
    ++finished_;
    if (progress_ && options_.on_progress) {
      options_.on_progress(static_cast<int64_t>(finished_), static_cast<int64_t>(requests_->size()));
    }
    Launch();
  }

  http::request<http::string_body> MakeHttpRequest(const BenchRequest& request) const {
    http::request<http::string_body> http_request{
        http::verb::post, options_.server.path_prefix + options_.endpoint, 11};
    http_request.set(http::field::host, HostHeader(options_.server));
    http_request.set(http::field::user_agent, "tandem-bench");
    http_request.set(http::field::content_type, "application/json");
    http_request.set(http::field::accept, "text/event-stream");
    if (!options_.api_key.empty()) http_request.set(http::field::authorization, "Bearer " + options_.api_key);
    http_request.keep_alive(false);
    http_request.body() = RequestBody(options_, request);
    http_request.prepare_payload();
    return http_request;
  }

  const ClientOptions& options_;
  const tcp::resolver::results_type endpoints_;
  asio::io_context io_;
  asio::steady_timer timer_;
  Clock::time_point epoch_;
  const std::vector<const BenchRequest*>* requests_ = nullptr;
  const std::vector<double>* offsets_ = nullptr;
  std::vector<RequestOutput>* outputs_ = nullptr;
  int64_t limit_ = 0;
  bool progress_ = false;
  size_t next_ = 0;  // the next request to arrive
  size_t finished_ = 0;
  int64_t in_flight_ = 0;
  std::deque<size_t> waiting_;  // arrived, not yet sent (concurrency limit)
};

// Resolves the server and checks that it accepts connections.
absl::StatusOr<tcp::resolver::results_type> ResolveAndProbe(const ServerAddress& server) {
  asio::io_context io;
  tcp::resolver resolver(io);
  ErrorCode ec;
  tcp::resolver::results_type endpoints = resolver.resolve(server.host, server.port, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot resolve ", server.host, ": ", ec.message()));
  tcp::socket socket(io);
  asio::connect(socket, endpoints, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", Where(server), " (", ec.message(),
                                               "); is the server running? (see --base-url)"));
  }
  socket.close(ec);
  return endpoints;
}

}  // namespace

absl::StatusOr<BenchmarkRun> RunBenchmark(const ClientOptions& options, const std::vector<BenchRequest>& requests) {
  absl::StatusOr<tcp::resolver::results_type> endpoints = ResolveAndProbe(options.server);
  if (!endpoints.ok()) return endpoints.status();
  Dispatcher dispatcher(options, *endpoints);
  std::vector<const BenchRequest*> measured;
  for (const BenchRequest& request : requests) measured.push_back(&request);
  if (options.num_warmups > 0 && !requests.empty()) {
    std::vector<const BenchRequest*> warmups;
    for (int64_t i = 0; i < options.num_warmups; ++i) warmups.push_back(&requests[i % requests.size()]);
    std::vector<RequestOutput> ignored;
    dispatcher.Run(warmups, std::vector<double>(warmups.size(), 0.0), options.max_concurrency, false, &ignored);
  }
  BenchmarkRun run;
  const std::vector<double> offsets = ArrivalOffsets(requests.size(), options.request_rate, options.seed);
  run.duration_s = dispatcher.Run(measured, offsets, options.max_concurrency, true, &run.outputs);
  return run;
}

absl::StatusOr<std::string> FetchFirstModelId(const ServerAddress& server, const std::string& api_key) {
  absl::StatusOr<tcp::resolver::results_type> endpoints = ResolveAndProbe(server);
  if (!endpoints.ok()) return endpoints.status();
  asio::io_context io;
  beast::tcp_stream stream(io);
  http::request<http::empty_body> request{http::verb::get, server.path_prefix + "/v1/models", 11};
  request.set(http::field::host, HostHeader(server));
  request.set(http::field::user_agent, "tandem-bench");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
  request.keep_alive(false);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  ErrorCode result;
  stream.expires_after(std::chrono::seconds(30));
  stream.async_connect(*endpoints, [&](ErrorCode ec, const tcp::endpoint&) {
    if (ec) return void(result = ec);
    http::async_write(stream, request, [&](ErrorCode ec, size_t) {
      if (ec) return void(result = ec);
      http::async_read(stream, buffer, response, [&](ErrorCode ec, size_t) { result = ec; });
    });
  });
  io.run();
  const std::string what = absl::StrCat("GET ", Where(server), server.path_prefix, "/v1/models");
  if (result) return absl::UnavailableError(absl::StrCat(what, ": ", result.message()));
  if (response.result() != http::status::ok) {
    return absl::InternalError(
        absl::StrCat(what, ": HTTP ", response.result_int(), ": ", Truncated(response.body(), 500)));
  }
  const Json models = Json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
  if (models.is_object()) {
    if (const auto data = models.find("data"); data != models.end() && data->is_array() && !data->empty()) {
      const Json& first = data->front();
      if (first.is_object()) {
        if (const auto id = first.find("id"); id != first.end() && id->is_string()) return id->get<std::string>();
      }
    }
  }
  return absl::InternalError(
      absl::StrCat(what, " listed no model (pass --model): ", Truncated(response.body(), 500)));
}

}  // namespace tandem::bench
