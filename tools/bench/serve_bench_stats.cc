#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/serve_bench.h"

// Statistics of a run with vLLM's definitions, the result table and JSON.

namespace tandem::bench {
namespace {

using Json = nlohmann::ordered_json;

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

}  // namespace

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
}  // namespace tandem::bench
