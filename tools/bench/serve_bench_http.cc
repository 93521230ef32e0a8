#include <chrono>
#include <deque>
#include <memory>
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
#include "tools/bench/serve_bench.h"

// The HTTP driver: every request on one Asio thread. Beast is slow to
// compile, so it is only here.

namespace tandem::bench {

using Json = nlohmann::ordered_json;

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
