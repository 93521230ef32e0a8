#include "tools/bench/serve_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/byte_alphabet.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// ---------------------------------------------------------------- statistics

TEST(StatisticsTest, PercentileInterpolatesLikeNumpy) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 99), 3.97);  // rank 0.99 * 3 = 2.97
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0), 1);
}

TEST(StatisticsTest, SummarizeSecondsGivesMilliseconds) {
  const LatencyStats stats = SummarizeSeconds({0.1, 0.2, 0.3});
  EXPECT_NEAR(stats.mean_ms, 200, 1e-9);
  EXPECT_NEAR(stats.median_ms, 200, 1e-9);
  EXPECT_NEAR(stats.std_ms, 1000 * std::sqrt(0.02 / 3), 1e-9);  // population std
  EXPECT_NEAR(stats.p99_ms, 298, 1e-9);
  const LatencyStats empty = SummarizeSeconds({});
  EXPECT_EQ(empty.mean_ms, 0);
  EXPECT_EQ(empty.p99_ms, 0);
}

RequestOutput Completed(double start, double ttft, std::vector<double> itl, int64_t output_tokens,
                        int64_t prompt_tokens) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = std::move(itl);
  o.latency = ttft;
  for (double gap : o.itl) o.latency += gap;
  o.output_tokens = output_tokens;
  o.prompt_tokens = prompt_tokens;
  return o;
}

TEST(StatisticsTest, MetricsFollowVllmDefinitions) {
  std::vector<RequestOutput> outputs;
  // 11 tokens: TPOT = (1.1 - 0.1) / 10 = 0.1.
  outputs.push_back(Completed(0.0, 0.1, std::vector<double>(10, 0.1), 11, 10));
  // One token: no TPOT, but TTFT and E2EL count.
  outputs.push_back(Completed(0.0, 0.3, {}, 1, 10));
  // 6 tokens over 1.0 s after the first: TPOT = 0.2.
  outputs.push_back(Completed(0.5, 0.2, {0.2, 0.2, 0.2, 0.2, 0.2}, 6, 10));
  RequestOutput failed;
  failed.error = "HTTP 500: boom";
  failed.prompt_tokens = 99;
  failed.output_tokens = 99;
  outputs.push_back(failed);

  const BenchmarkMetrics m = CalculateMetrics(outputs, 2.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 30);   // the failed request's do not count
  EXPECT_EQ(m.total_output_tokens, 18);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 9);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 24);
  EXPECT_NEAR(m.tpot.mean_ms, 150, 1e-6);    // (100 + 200) / 2: the 1-token request is left out
  EXPECT_NEAR(m.tpot.median_ms, 150, 1e-6);
  EXPECT_NEAR(m.tpot.p99_ms, 199, 1e-6);
  EXPECT_NEAR(m.ttft.mean_ms, 200, 1e-6);
  EXPECT_NEAR(m.ttft.median_ms, 200, 1e-6);
  EXPECT_NEAR(m.itl.mean_ms, 1000 * (10 * 0.1 + 5 * 0.2) / 15, 1e-6);
  EXPECT_NEAR(m.itl.median_ms, 100, 1e-6);
  EXPECT_NEAR(m.e2el.mean_ms, 1000 * (1.1 + 0.3 + 1.2) / 3, 1e-6);
  // Request A's 11 chunks fall in seconds 0 and 1, C's six in 0 and 1 too.
  EXPECT_EQ(m.max_concurrent_requests, 3);
  EXPECT_GT(m.max_output_tokens_per_s, 0);
}

TEST(StatisticsTest, NoCompletedRequestsGivesZeros) {
  RequestOutput failed;
  failed.error = "x";
  const BenchmarkMetrics m = CalculateMetrics({failed}, 1.0);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.request_throughput, 0);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.max_concurrent_requests, 0);
}

TEST(StatisticsTest, TableLooksLikeVllms) {
  std::vector<RequestOutput> outputs = {Completed(0, 0.1, std::vector<double>(10, 0.1), 11, 10)};
  BenchmarkConfig config;
  config.max_concurrency = 4;
  const std::string table = FormatMetricsTable(config, CalculateMetrics(outputs, 2.0));
  EXPECT_TRUE(absl::StartsWith(table, "============ Serving Benchmark Result ============\n")) << table;
  EXPECT_THAT(table, HasSubstr("\nSuccessful requests:                     1         \n"));
  EXPECT_THAT(table, HasSubstr("\nFailed requests:                         0         \n"));
  EXPECT_THAT(table, HasSubstr("\nMaximum request concurrency:             4         \n"));
  EXPECT_THAT(table, HasSubstr("\nRequest throughput (req/s):              0.50      \n"));
  EXPECT_THAT(table, HasSubstr("\n---------------Time to First Token----------------\n"));
  EXPECT_THAT(table, HasSubstr("\n-----Time per Output Token (excl. 1st token)------\n"));
  EXPECT_THAT(table, HasSubstr("\n---------------Inter-token Latency----------------\n"));
  EXPECT_THAT(table, HasSubstr("\n----------------End-to-end Latency----------------\n"));
  EXPECT_THAT(table, HasSubstr("\nMean TPOT (ms):                          100.00    \n"));
  EXPECT_THAT(table, HasSubstr("\nP99 E2EL (ms):                           1100.00   \n"));
  EXPECT_TRUE(absl::EndsWith(table, "\n" + std::string(50, '=') + "\n"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("Request rate configured")));  // inf
}

TEST(StatisticsTest, ResultJsonUsesVllmKeys) {
  std::vector<RequestOutput> outputs = {Completed(0, 0.1, {0.1, 0.1}, 3, 10)};
  RequestOutput failed;
  failed.error = "HTTP 500: boom";
  failed.prompt_tokens = 12;
  outputs.push_back(failed);
  BenchmarkConfig config;
  config.model = "m";
  const BenchmarkMetrics metrics = CalculateMetrics(outputs, 1.0);
  const Json j = Json::parse(ResultJson(config, metrics, outputs));
  for (const char* key : {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                          "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                          "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                          "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                          "median_e2el_ms", "p99_e2el_ms", "input_lens", "output_lens", "ttfts", "itls",
                          "generated_texts", "errors", "model_id", "request_rate", "max_concurrency"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["input_lens"], Json::array({10, 12}));
  EXPECT_EQ(j["output_lens"], Json::array({3, 0}));
  EXPECT_EQ(j["errors"], Json::array({"", "HTTP 500: boom"}));
  EXPECT_EQ(j["itls"][0].size(), 2u);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 100, 1e-6);
}

// ---------------------------------------------------------------- SSE

std::string Event(const std::string& json) { return "data: " + json + "\n\n"; }
std::string TextChunk(const std::string& text) {
  return Event(Json{{"id", "cmpl-1"},
                    {"object", "text_completion"},
                    {"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}}
                   .dump());
}
std::string UsageChunk(int prompt, int completion) {
  return Event(Json{{"id", "cmpl-1"},
                    {"object", "text_completion"},
                    {"choices", Json::array()},
                    {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", completion}}}}
                   .dump());
}
const std::string kDone = "data: [DONE]\n\n";

TEST(StreamReaderTest, TimesChunksCarryingText) {
  StreamReader reader(/*chat=*/false, /*send_time=*/0.2);
  reader.Feed(TextChunk("Hel"), 0.5);
  reader.Feed(TextChunk("lo"), 0.7);
  reader.Feed(TextChunk("") + TextChunk("!"), 1.0);  // an empty text is no token
  reader.Feed(UsageChunk(17, 4), 1.1);
  EXPECT_FALSE(reader.done());
  reader.Feed(kDone, 1.2);
  EXPECT_TRUE(reader.done());
  const RequestOutput out = reader.Finish("", 99);
  EXPECT_TRUE(out.success) << out.error;
  EXPECT_EQ(out.generated_text, "Hello!");
  EXPECT_NEAR(out.ttft, 0.3, 1e-12);
  EXPECT_NEAR(out.latency, 0.8, 1e-12);
  EXPECT_THAT(out.itl, ElementsAre(DoubleNear(0.2, 1e-12), DoubleNear(0.3, 1e-12)));
  EXPECT_EQ(out.output_tokens, 4);  // usage wins over the 3 chunks
  EXPECT_EQ(out.prompt_tokens, 17);
}

TEST(StreamReaderTest, SplitAnywhereGivesTheSameResult) {
  const std::string stream = ": keep-alive comment\r\n\r\n" + TextChunk("a\nb") + TextChunk("é") +
                             "data: {\"choices\":[{\"index\":0,\r\n"
                             "data: \"text\":\"c\"}]}\r\n\r\n" +  // one event over two data lines, CRLF
                             UsageChunk(5, 3) + kDone + TextChunk("after done is ignored");
  for (size_t a = 0; a <= stream.size(); ++a) {
    for (size_t b = a; b <= stream.size(); b += 7) {
      StreamReader reader(false, 0.0);
      reader.Feed(std::string_view(stream).substr(0, a), 1.0);
      reader.Feed(std::string_view(stream).substr(a, b - a), 2.0);
      reader.Feed(std::string_view(stream).substr(b), 3.0);
      const RequestOutput out = reader.Finish("", 0);
      ASSERT_TRUE(out.success) << a << " " << b << ": " << out.error;
      ASSERT_EQ(out.generated_text, "a\nbéc") << a << " " << b;
      ASSERT_EQ(out.output_tokens, 3);
      ASSERT_EQ(out.itl.size(), 2u);
    }
  }
  // Byte by byte, each at its own time: one timestamp per completed event.
  StreamReader reader(false, 0.0);
  for (size_t i = 0; i < stream.size(); ++i) reader.Feed(std::string_view(stream).substr(i, 1), i);
  const RequestOutput out = reader.Finish("", 0);
  ASSERT_TRUE(out.success) << out.error;
  const size_t first_end = stream.find("\n\n", stream.find("a\\nb")) + 1;
  EXPECT_EQ(out.ttft, static_cast<double>(first_end));
}

TEST(StreamReaderTest, NoDoneOrErrorsFail) {
  {
    StreamReader reader(false, 0.0);
    reader.Feed(TextChunk("x") + TextChunk("y"), 1.0);
    const RequestOutput out = reader.Finish("", 0);
    EXPECT_FALSE(out.success);
    EXPECT_THAT(out.error, HasSubstr("[DONE]"));
  }
  {
    StreamReader reader(false, 0.0);
    reader.Feed(TextChunk("x"), 1.0);
    const RequestOutput out = reader.Finish("the connection broke mid-stream: end of stream", 0);
    EXPECT_FALSE(out.success);
    EXPECT_THAT(out.error, HasSubstr("broke"));
  }
  {
    StreamReader reader(false, 0.0);
    reader.Feed(TextChunk("x") + Event(R"({"error":{"message":"out of memory","code":500}})") + kDone, 1.0);
    const RequestOutput out = reader.Finish("", 0);
    EXPECT_FALSE(out.success);
    EXPECT_THAT(out.error, HasSubstr("out of memory"));
  }
  {
    StreamReader reader(false, 0.0);
    reader.Feed(UsageChunk(3, 0) + kDone, 1.0);
    EXPECT_FALSE(reader.Finish("", 0).success);  // nothing to time
  }
  {
    StreamReader reader(false, 0.0);
    reader.Feed("data: {not json\n\n" + TextChunk("x") + kDone, 1.0);
    EXPECT_THAT(reader.Finish("", 0).error, HasSubstr("not a JSON object"));
  }
  {
    // [DONE] without its blank line, then a broken connection: nothing lost.
    StreamReader reader(false, 0.0);
    reader.Feed(TextChunk("x") + "data: [DONE]", 1.0);
    const RequestOutput out = reader.Finish("connection reset", 7);
    EXPECT_TRUE(out.success) << out.error;
    EXPECT_EQ(out.output_tokens, 1);  // no usage: counted chunks
    EXPECT_EQ(out.prompt_tokens, 7);  // no usage: the request's length
  }
}

TEST(StreamReaderTest, ChatDeltasSkipTheRoleChunk) {
  StreamReader reader(/*chat=*/true, 0.0);
  const auto delta = [](const char* json) {
    return Event(absl::StrCat(R"({"object":"chat.completion.chunk","choices":[{"index":0,"delta":)", json, "}]}"));
  };
  reader.Feed(delta(R"({"role":"assistant","content":""})"), 0.1);
  reader.Feed(delta(R"({"content":"Hi"})"), 0.4);
  reader.Feed(delta(R"({"content":" there"})") + kDone, 0.6);
  const RequestOutput out = reader.Finish("", 0);
  EXPECT_TRUE(out.success) << out.error;
  EXPECT_EQ(out.generated_text, "Hi there");
  EXPECT_NEAR(out.ttft, 0.4, 1e-12);
  EXPECT_EQ(out.output_tokens, 2);
}

// ---------------------------------------------------------------- dataset

TEST(DatasetTest, LengthRanges) {
  using Range = std::pair<int64_t, int64_t>;
  EXPECT_EQ(LengthRange(128, 0.0), (Range{128, 128}));
  EXPECT_EQ(LengthRange(100, 0.1), (Range{90, 110}));
  EXPECT_EQ(LengthRange(10, 0.25), (Range{7, 13}));
  EXPECT_EQ(LengthRange(1, 0.9), (Range{1, 2}));  // at least 1
  RandomDatasetOptions options;
  EXPECT_TRUE(ValidateRandomDatasetOptions(options).ok());
  options.range_ratio = 1.0;
  EXPECT_THAT(ValidateRandomDatasetOptions(options).message(), HasSubstr("--random-range-ratio"));
  options.range_ratio = -0.1;
  EXPECT_FALSE(ValidateRandomDatasetOptions(options).ok());
  options.range_ratio = 0;
  options.input_len = 0;
  EXPECT_THAT(ValidateRandomDatasetOptions(options).message(), HasSubstr("--random-input-len"));
}

// One token per byte plus two specials, as `tandem make-model` writes.
std::unique_ptr<Tokenizer> ByteTokenizer() {
  TokenizerData data;
  for (int b = 0; b < 256; ++b) {
    data.tokens.push_back(tokenizer_internal::EncodeByteAlphabet(std::string(1, static_cast<char>(b))));
    data.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
    data.tokens.push_back(special);
    data.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  data.bos_token_id = 256;
  data.eos_token_id = 257;
  auto tokenizer = Tokenizer::Create(std::move(data));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return std::move(tokenizer).value();
}

TEST(DatasetTest, RandomPromptsRespectTheRangeAndTheSeed) {
  const std::unique_ptr<Tokenizer> tokenizer = ByteTokenizer();
  RandomDatasetOptions options;
  options.num_prompts = 200;
  options.input_len = 64;
  options.output_len = 20;
  options.range_ratio = 0.5;
  options.seed = 3;
  const std::vector<BenchRequest> requests = SampleRandomRequests(*tokenizer, options);
  ASSERT_EQ(requests.size(), 200u);
  int64_t min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  for (const BenchRequest& r : requests) {
    EXPECT_EQ(r.prompt_len, static_cast<int64_t>(tokenizer->Encode(r.prompt, false, false).size()));
    EXPECT_EQ(r.prompt.find("<|im_"), std::string::npos);  // no special tokens
    min_in = std::min(min_in, r.prompt_len);
    max_in = std::max(max_in, r.prompt_len);
    min_out = std::min(min_out, r.output_len);
    max_out = std::max(max_out, r.output_len);
  }
  EXPECT_GE(min_in, 32);
  EXPECT_LE(max_in, 96);
  EXPECT_GE(min_out, 10);
  EXPECT_LE(max_out, 30);
  EXPECT_LT(min_in, 40);  // 200 draws spread over the range
  EXPECT_GT(max_in, 88);
  EXPECT_LT(min_out, 13);
  EXPECT_GT(max_out, 27);

  const std::vector<BenchRequest> again = SampleRandomRequests(*tokenizer, options);
  options.seed = 4;
  const std::vector<BenchRequest> other = SampleRandomRequests(*tokenizer, options);
  int different = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].prompt, again[i].prompt);
    EXPECT_EQ(requests[i].output_len, again[i].output_len);
    different += requests[i].prompt != other[i].prompt;
  }
  EXPECT_GT(different, 190);
}

TEST(DatasetTest, ZeroRatioGivesExactLengths) {
  const std::unique_ptr<Tokenizer> tokenizer = ByteTokenizer();
  RandomDatasetOptions options;
  options.num_prompts = 20;
  options.input_len = 128;
  options.output_len = 7;
  for (const BenchRequest& r : SampleRandomRequests(*tokenizer, options)) {
    EXPECT_EQ(r.prompt_len, 128);
    EXPECT_EQ(r.prompt.size(), 128u);
    EXPECT_EQ(r.output_len, 7);
  }
}

TEST(DatasetTest, PoissonArrivals) {
  EXPECT_THAT(ArrivalOffsets(3, std::numeric_limits<double>::infinity(), 0), ElementsAre(0, 0, 0));
  const std::vector<double> offsets = ArrivalOffsets(4000, 10.0, 1);
  EXPECT_EQ(offsets, ArrivalOffsets(4000, 10.0, 1));
  EXPECT_NE(offsets, ArrivalOffsets(4000, 10.0, 2));
  EXPECT_EQ(offsets[0], 0);
  std::vector<double> gaps;
  for (size_t i = 1; i < offsets.size(); ++i) gaps.push_back(offsets[i] - offsets[i - 1]);
  for (double gap : gaps) ASSERT_GE(gap, 0);
  const LatencyStats stats = SummarizeSeconds(gaps);
  EXPECT_NEAR(stats.mean_ms, 100, 5);       // mean 1 / rate
  EXPECT_NEAR(stats.std_ms, 100, 7);        // exponential: std = mean
  EXPECT_NEAR(stats.median_ms, 69.3, 5);    // ln 2 / rate
}

// ---------------------------------------------------------------- request shape

TEST(RequestTest, ParsesBaseUrls) {
  auto a = ParseBaseUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, "8000");
  EXPECT_EQ(a->path_prefix, "");
  auto b = ParseBaseUrl("http://example.com/proxy/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "example.com");
  EXPECT_EQ(b->port, "80");
  EXPECT_EQ(b->path_prefix, "/proxy");
  auto c = ParseBaseUrl("http://[::1]:9000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, "9000");
  EXPECT_FALSE(ParseBaseUrl("https://example.com").ok());
  EXPECT_FALSE(ParseBaseUrl("127.0.0.1:8000").ok());
  EXPECT_FALSE(ParseBaseUrl("http://host:99999").ok());
  EXPECT_FALSE(ParseBaseUrl("http://:80").ok());
}

TEST(RequestTest, BodiesAreStreamingOpenAiRequests) {
  ClientOptions options;
  options.model = "m";
  BenchRequest request{"hi \x01 there", 4, 9};
  Json body = Json::parse(RequestBody(options, request));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], "hi \x01 there");
  EXPECT_EQ(body["max_tokens"], 9);
  EXPECT_EQ(body["temperature"], 0.0);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_FALSE(body.contains("ignore_eos"));
  options.ignore_eos = true;
  options.endpoint = "/v1/chat/completions";
  body = Json::parse(RequestBody(options, request));
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["messages"][0]["role"], "user");
  EXPECT_EQ(body["messages"][0]["content"], "hi \x01 there");
  EXPECT_EQ(body["max_completion_tokens"], 9);
  EXPECT_FALSE(body.contains("prompt"));
}

// ---------------------------------------------------------------- end to end

// An OpenAI-like streaming server on 127.0.0.1 (thread per connection). A
// request's prompt picks the behaviour: "fail" answers 500, "drop" closes the
// connection after one chunk, "nousage" sends no usage, "eof" ends the body
// by closing instead of chunked encoding; anything else streams
// ceil(max_tokens / 2) chunks of two "tokens" each, the first after
// kFirstDelay, then usage (prompt_tokens 7, completion_tokens max_tokens).
class FakeOpenAiServer {
 public:
  static constexpr auto kFirstDelay = std::chrono::milliseconds(40);
  static constexpr auto kGap = std::chrono::milliseconds(3);

  FakeOpenAiServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listen_fd_, 1024), 0);
    socklen_t length = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeOpenAiServer() {
    stop_ = true;
    acceptor_.join();
    close(listen_fd_);
    absl::MutexLock lock(&mu_);
    for (std::thread& t : connections_) t.join();
  }

  ServerAddress address() const { return {"127.0.0.1", std::to_string(port_), ""}; }
  int posts() const { return posts_; }
  int peak_in_flight() const { return peak_; }
  std::string last_authorization() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return last_authorization_;
  }

 private:
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      absl::MutexLock lock(&mu_);
      connections_.emplace_back([this, fd] {
        Serve(fd);
        close(fd);
      });
    }
  }

  static void Send(int fd, const std::string& bytes) { send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  static void SendChunk(int fd, const std::string& bytes) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", bytes.size());
    Send(fd, size + bytes + "\r\n");
  }

  void Serve(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    std::string request;
    char buffer[4096];
    size_t header_end;
    while ((header_end = request.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) return;
      request.append(buffer, n);
    }
    const std::string head = request.substr(0, header_end);
    std::string body = request.substr(header_end + 4);
    size_t content_length = 0;
    if (size_t at = head.find("Content-Length: "); at != std::string::npos) {
      EXPECT_TRUE(absl::SimpleAtoi(head.substr(at + 16, head.find("\r\n", at) - at - 16), &content_length));
    }
    while (body.size() < content_length) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) return;
      body.append(buffer, n);
    }
    if (absl::StartsWith(head, "GET /v1/models ")) {
      const std::string models = R"({"object":"list","data":[{"id":"test-model","object":"model"}]})";
      Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ", models.size(),
                            "\r\nConnection: close\r\n\r\n", models));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (size_t at = head.find("Authorization: "); at != std::string::npos) {
        last_authorization_ = head.substr(at + 15, head.find("\r\n", at) - at - 15);
      }
    }
    ++posts_;
    const int now = ++in_flight_;
    for (int peak = peak_; now > peak && !peak_.compare_exchange_weak(peak, now);) {
    }
    // The request stops counting just before its last bytes go out: the
    // client may start its next request as soon as it reads them.
    bool counted = true;
    Stream(fd, Json::parse(body), [&] {
      if (counted) --in_flight_;
      counted = false;
    });
    if (counted) --in_flight_;
  }

  void Stream(int fd, const Json& request, const std::function<void()>& finishing) {
    const bool chat = request.contains("messages");
    const std::string prompt = chat ? request["messages"][0]["content"].get<std::string>()
                                    : request["prompt"].get<std::string>();
    const int max_tokens = request["max_tokens"].get<int>();
    if (prompt == "fail") {
      const std::string error = R"({"error":{"message":"boom"}})";
      Send(fd, absl::StrCat("HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                            "Content-Length: ", error.size(), "\r\nConnection: close\r\n\r\n", error));
      return;
    }
    const bool chunked = prompt != "eof";
    Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n",
                          chunked ? "Transfer-Encoding: chunked\r\n" : "", "Connection: close\r\n\r\n"));
    const auto emit = [&](const std::string& bytes) {
      if (!chunked) return Send(fd, bytes);
      // Each event in two HTTP chunks, cut in the middle of its JSON.
      SendChunk(fd, bytes.substr(0, bytes.size() / 2));
      SendChunk(fd, bytes.substr(bytes.size() / 2));
    };
    std::this_thread::sleep_for(kFirstDelay);
    const int chunks = (max_tokens + 1) / 2;
    for (int i = 0; i < chunks; ++i) {
      if (i > 0) std::this_thread::sleep_for(kGap);
      Json chunk = chat ? Json{{"object", "chat.completion.chunk"},
                               {"choices", {{{"index", 0}, {"delta", {{"content", "ab"}}}}}}}
                        : Json{{"object", "text_completion"}, {"choices", {{{"index", 0}, {"text", "ab"}}}}};
      emit("data: " + chunk.dump() + "\n\n");
      if (prompt == "drop") return;  // closed mid-stream
    }
    if (prompt != "nousage") {
      emit("data: " +
           Json{{"choices", Json::array()}, {"usage", {{"prompt_tokens", 7}, {"completion_tokens", max_tokens}}}}
               .dump() +
           "\n\n");
    }
    finishing();
    emit("data: [DONE]\n\n");
    if (chunked) Send(fd, "0\r\n\r\n");
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> posts_{0};
  std::atomic<int> in_flight_{0};
  std::atomic<int> peak_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mu_);
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
};

constexpr double kFirstDelaySeconds = 0.040;

BenchRequest Req(const std::string& prompt, int64_t output_len) { return BenchRequest{prompt, 3, output_len}; }

TEST(EndToEndTest, CountsCompletedAndFailedRequests) {
  FakeOpenAiServer server;
  ClientOptions options;
  options.server = server.address();
  options.model = "test-model";
  options.api_key = "secret";
  std::vector<BenchRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Req("ok", 8));
  requests.push_back(Req("fail", 8));
  requests.push_back(Req("drop", 8));
  requests.push_back(Req("nousage", 5));
  requests.push_back(Req("eof", 4));
  std::vector<int64_t> progress;
  options.on_progress = [&](int64_t finished, int64_t total) {
    EXPECT_EQ(total, 10);
    progress.push_back(finished);
  };
  auto run = RunBenchmark(options, requests);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->outputs.size(), 10u);
  EXPECT_EQ(progress.size(), 10u);
  EXPECT_EQ(progress.back(), 10);
  EXPECT_EQ(server.last_authorization(), "Bearer secret");
  for (int i = 0; i < 6; ++i) {
    const RequestOutput& o = run->outputs[i];
    ASSERT_TRUE(o.success) << o.error;
    EXPECT_EQ(o.output_tokens, 8);  // from usage; 4 chunks were sent
    EXPECT_EQ(o.prompt_tokens, 7);
    EXPECT_EQ(o.generated_text, "abababab");
    EXPECT_GT(o.ttft, kFirstDelaySeconds);
    EXPECT_EQ(o.itl.size(), 3u);
    EXPECT_GE(o.latency, o.ttft);
  }
  EXPECT_FALSE(run->outputs[6].success);
  EXPECT_THAT(run->outputs[6].error, HasSubstr("HTTP 500"));
  EXPECT_THAT(run->outputs[6].error, HasSubstr("boom"));
  EXPECT_FALSE(run->outputs[7].success);
  EXPECT_FALSE(run->outputs[7].error.empty());
  EXPECT_TRUE(run->outputs[8].success) << run->outputs[8].error;
  EXPECT_EQ(run->outputs[8].output_tokens, 3);  // no usage: the chunks
  EXPECT_EQ(run->outputs[8].prompt_tokens, 3);  // no usage: the dataset's length
  EXPECT_TRUE(run->outputs[9].success) << run->outputs[9].error;
  EXPECT_EQ(run->outputs[9].output_tokens, 4);

  const BenchmarkMetrics m = CalculateMetrics(run->outputs, run->duration_s);
  EXPECT_EQ(m.completed, 8);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.total_output_tokens, 6 * 8 + 3 + 4);
  EXPECT_EQ(m.total_input_tokens, 7 * 7 + 3);
  EXPECT_GT(m.ttft.median_ms, 1000 * kFirstDelaySeconds);
  EXPECT_GT(m.tpot.mean_ms, 0);
  EXPECT_GT(run->duration_s, kFirstDelaySeconds);
  EXPECT_NEAR(m.request_throughput, 8 / run->duration_s, 1e-9);
}

TEST(EndToEndTest, ChatEndpoint) {
  FakeOpenAiServer server;
  ClientOptions options;
  options.server = server.address();
  options.endpoint = "/v1/chat/completions";
  options.model = "test-model";
  auto run = RunBenchmark(options, {Req("hello", 6)});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(run->outputs[0].success) << run->outputs[0].error;
  EXPECT_EQ(run->outputs[0].generated_text, "ababab");
  EXPECT_EQ(run->outputs[0].output_tokens, 6);
  EXPECT_GT(run->outputs[0].ttft, kFirstDelaySeconds);
}

TEST(EndToEndTest, MaxConcurrencyAndWarmups) {
  FakeOpenAiServer server;
  ClientOptions options;
  options.server = server.address();
  options.model = "test-model";
  options.max_concurrency = 2;
  options.num_warmups = 3;
  std::vector<BenchRequest> requests(8, Req("ok", 4));
  auto run = RunBenchmark(options, requests);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->outputs.size(), 8u);
  EXPECT_EQ(CalculateMetrics(run->outputs, run->duration_s).completed, 8);
  EXPECT_EQ(server.posts(), 8 + 3);
  EXPECT_EQ(server.peak_in_flight(), 2);
  // Four waves of two, each at least the first delay long.
  EXPECT_GT(run->duration_s, 4 * kFirstDelaySeconds);
}

TEST(EndToEndTest, ManyStreamsAtOnceOnOneThread) {
  FakeOpenAiServer server;
  ClientOptions options;
  options.server = server.address();
  options.model = "test-model";
  std::vector<BenchRequest> requests(300, Req("ok", 6));
  auto run = RunBenchmark(options, requests);
  ASSERT_TRUE(run.ok()) << run.status();
  const BenchmarkMetrics m = CalculateMetrics(run->outputs, run->duration_s);
  EXPECT_EQ(m.completed, 300) << run->outputs[0].error;
  EXPECT_GT(server.peak_in_flight(), 50);
  EXPECT_EQ(m.max_concurrent_requests, 300);
}

TEST(EndToEndTest, RequestRateSpacesTheSends) {
  FakeOpenAiServer server;
  ClientOptions options;
  options.server = server.address();
  options.model = "test-model";
  options.request_rate = 20;
  options.seed = 5;
  std::vector<BenchRequest> requests(6, Req("ok", 2));
  auto run = RunBenchmark(options, requests);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<double> offsets = ArrivalOffsets(6, 20, 5);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(run->outputs[i].success) << run->outputs[i].error;
    EXPECT_GE(run->outputs[i].start_time, offsets[i] - 1e-3) << i;
    EXPECT_LT(run->outputs[i].start_time, offsets[i] + 0.25) << i;
  }
  EXPECT_GT(run->duration_s, offsets.back() + kFirstDelaySeconds);
}

TEST(EndToEndTest, ModelListAndUnreachableServer) {
  {
    FakeOpenAiServer server;
    auto model = FetchFirstModelId(server.address(), "");
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(*model, "test-model");
  }
  // A port nobody listens on.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  const ServerAddress nobody{"127.0.0.1", std::to_string(ntohs(address.sin_port)), ""};
  ClientOptions options;
  options.server = nobody;
  options.model = "m";
  auto run = RunBenchmark(options, {Req("ok", 2)});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(run.status().message(), HasSubstr("is the server running"));
  EXPECT_EQ(FetchFirstModelId(nobody, "").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::bench
