// The library behind `tandem bench`: a serving benchmark client for any
// OpenAI-compatible HTTP endpoint, measuring what `vllm bench serve` measures
// with vLLM's definitions (benchmarks/serve.py), so figures compare:
//
//   * TTFT: first chunk carrying text - request sent.
//   * ITL: the gaps between successive chunks carrying text.
//   * TPOT (per request): (E2EL - TTFT) / (output tokens - 1), only for
//     requests with more than one output token.
//   * E2EL: last chunk carrying text - request sent.
//   * Throughputs divide by the benchmark's duration (first send to last
//     completion).
//
// Parts, each usable alone: the random dataset (SampleRandomRequests), the
// SSE reader of one streamed response (StreamReader), the statistics
// (CalculateMetrics, FormatMetricsTable, ResultJson) and the HTTP driver
// (RunBenchmark) that sends requests on one thread with asynchronous I/O.
#ifndef TANDEM_TOOLS_BENCH_SERVE_BENCH_H_
#define TANDEM_TOOLS_BENCH_SERVE_BENCH_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::bench {

// ---------------------------------------------------------------- dataset

struct RandomDatasetOptions {
  int64_t num_prompts = 100;
  int64_t input_len = 128;
  int64_t output_len = 128;
  // Lengths are uniform integers in [floor(len * (1 - r)), ceil(len * (1 + r))].
  double range_ratio = 0.0;
  uint64_t seed = 0;
};

// One request of a benchmark.
struct BenchRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // tokens of `prompt` under the benchmark's tokenizer
  int64_t output_len = 0;  // sent as max_tokens
};

// The inclusive range vLLM draws a length from; the low end is at least 1.
std::pair<int64_t, int64_t> LengthRange(int64_t len, double range_ratio);

// InvalidArgument naming the `tandem bench` flag when the options are out of
// range (range ratio in [0, 1), lengths and count positive).
absl::Status ValidateRandomDatasetOptions(const RandomDatasetOptions& options);

// vLLM's random dataset: per request an input and an output length drawn
// from LengthRange, and a prompt of that many token ids drawn uniformly from
// the vocabulary without special tokens (nor tokens that are not whole UTF-8
// characters by themselves), decoded to text. Re-encoding the
// text may merge or split tokens; the ids are adjusted a few rounds (cut to
// the target, or topped up with fresh random ids) so that the prompt
// re-encodes to the target length where it can. Bytes that are not valid
// UTF-8 are dropped (JSON cannot carry them). Deterministic for a seed.
// REQUIRES: ValidateRandomDatasetOptions(options).ok().
std::vector<BenchRequest> SampleRandomRequests(const Tokenizer& tokenizer, const RandomDatasetOptions& options);

// Send offsets in seconds from the start: all 0 for an infinite rate, else a
// Poisson process (exponential gaps of mean 1/rate). Deterministic for a seed.
std::vector<double> ArrivalOffsets(int64_t count, double request_rate, uint64_t seed);

// ---------------------------------------------------------------- one response

// What one request measured; times in seconds.
struct RequestOutput {
  bool success = false;
  double start_time = 0;  // when it was sent, from the benchmark's start
  double ttft = 0;
  double latency = 0;         // E2EL
  std::vector<double> itl;    // one gap per chunk carrying text after the first
  int64_t output_tokens = 0;  // usage.completion_tokens, else the chunks carrying text
  int64_t prompt_tokens = 0;  // usage.prompt_tokens, else the request's prompt_len
  std::string generated_text;
  std::string error;  // empty on success
};

// Reads one streamed completion (Server-Sent Events, `data: {json}` events
// ending with `data: [DONE]`) as its bytes arrive, in pieces split anywhere.
// Thread-compatible; one per response.
class StreamReader {
 public:
  // `chat`: chunks carry choices[0].delta.content (and reasoning_content)
  // rather than choices[0].text. `send_time` in seconds.
  StreamReader(bool chat, double send_time);

  // Consumes the next bytes of the response body, which arrived at `now`.
  void Feed(std::string_view bytes, double now);
  // True once `data: [DONE]` was read.
  bool done() const { return done_; }

  // The measurement. Success needs [DONE], at least one chunk carrying text
  // and no error event; `transport_error` (empty if none) marks it failed.
  // `prompt_len` is used when the server sent no usage. Call once, at the
  // end (a last event without its blank line is read then).
  RequestOutput Finish(const std::string& transport_error, int64_t prompt_len);

 private:
  void OnLine(std::string_view line);
  void OnEvent(std::string_view data);

  const bool chat_;
  const double send_time_;
  double now_ = 0;
  std::string line_;  // an incomplete line
  std::string data_;  // data lines of the event being read
  bool done_ = false;
  int64_t content_chunks_ = 0;
  double first_time_ = 0;
  double last_time_ = 0;
  std::vector<double> itl_;
  std::string text_;
  std::optional<int64_t> completion_tokens_;
  std::optional<int64_t> prompt_tokens_;
  std::string error_;
};

// ---------------------------------------------------------------- statistics

// numpy.percentile's default (linear interpolation); 0 for no values.
double Percentile(std::vector<double> values, double percent);

// Of one latency, in milliseconds; all 0 without values.
struct LatencyStats {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;  // population standard deviation, as numpy.std
  double p99_ms = 0;
};
LatencyStats SummarizeSeconds(const std::vector<double>& seconds);

struct BenchmarkMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input_tokens = 0;   // of completed requests
  int64_t total_output_tokens = 0;  // of completed requests
  double duration_s = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  // Peaks over one-second buckets of the run (vLLM's max_output_tokens_per_s
  // and max_concurrent_requests), counting chunks carrying text as tokens.
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  LatencyStats ttft, tpot, itl, e2el;
};

BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutput>& outputs, double duration_s);

// What the run was, for the report and the result file.
struct BenchmarkConfig {
  std::string backend;  // "openai" or "openai-chat"
  std::string base_url;
  std::string endpoint;
  std::string model;
  std::string tokenizer;
  int64_t num_prompts = 0;
  double request_rate = std::numeric_limits<double>::infinity();
  int64_t max_concurrency = 0;  // 0: unlimited
};

// vLLM's "============ Serving Benchmark Result ============" block.
std::string FormatMetricsTable(const BenchmarkConfig& config, const BenchmarkMetrics& metrics);

// The result file: the config, every figure under vLLM's key names
// ("request_throughput", "mean_ttft_ms", ...) and the per-request arrays
// (input_lens, output_lens, ttfts, itls, generated_texts, errors).
std::string ResultJson(const BenchmarkConfig& config, const BenchmarkMetrics& metrics,
                       const std::vector<RequestOutput>& outputs);

// ---------------------------------------------------------------- HTTP driver

// http://HOST[:PORT][/PREFIX]; the endpoint is appended to the prefix.
struct ServerAddress {
  std::string host;
  std::string port = "80";
  std::string path_prefix;  // "" or "/..." without a trailing slash
};
// InvalidArgument for anything but an http:// URL (https is not supported).
absl::StatusOr<ServerAddress> ParseBaseUrl(const std::string& url);

struct ClientOptions {
  ServerAddress server;
  std::string endpoint = "/v1/completions";  // or "/v1/chat/completions"
  std::string model;
  std::string api_key;  // sent as "Authorization: Bearer KEY" if set
  double temperature = 0.0;
  bool ignore_eos = false;
  int64_t max_concurrency = 0;  // requests in flight at most; 0: unlimited
  double request_rate = std::numeric_limits<double>::infinity();
  int64_t num_warmups = 0;  // sent (round robin over the requests) and awaited first, not measured
  uint64_t seed = 0;        // of the arrival times
  // Called after each measured request ends, on the calling thread.
  std::function<void(int64_t finished, int64_t total)> on_progress;
};

// True for a chat endpoint (the path ends in "chat/completions").
bool IsChatEndpoint(const std::string& endpoint);

// The JSON body of one streamed request.
std::string RequestBody(const ClientOptions& options, const BenchRequest& request);

struct BenchmarkRun {
  std::vector<RequestOutput> outputs;  // in the order of the requests
  double duration_s = 0;
};

// Runs the warmups and then the benchmark on the calling thread: one
// connection per request in flight, HTTP/1.1, all on one io_context, so
// thousands of concurrent streams need no threads. Failed requests are
// recorded in their outputs. Returns Unavailable when the server cannot be
// resolved or connected to before the start.
absl::StatusOr<BenchmarkRun> RunBenchmark(const ClientOptions& options, const std::vector<BenchRequest>& requests);

// GET {prefix}/v1/models: the first model's id. Unavailable when the server
// cannot be reached; Internal for a non-200 answer or an empty list.
absl::StatusOr<std::string> FetchFirstModelId(const ServerAddress& server, const std::string& api_key);

// `text` cut to `max` bytes, with "..." when cut (for error messages).
std::string Truncated(std::string_view text, size_t max);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_SERVE_BENCH_H_
