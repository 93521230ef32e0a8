#include "scheduler/server/http/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

const std::string& HttpRequest::header(const std::string& name) const {
  static const std::string* const kEmpty = new std::string;
  auto it = headers.find(name);
  return it == headers.end() ? *kEmpty : it->second;
}

namespace {

// The status line and headers of a response, as Beast serializes them.
using ResponseHead = bhttp::response<bhttp::empty_body>;

ResponseHead MakeHead(int status, const std::string& content_type) {
  ResponseHead head(bhttp::int_to_status(static_cast<unsigned>(status)), 11);
  head.set(bhttp::field::content_type, content_type);
  return head;
}

// The status line and header fields, with the handler's `headers` last but
// for Connection.
std::string Serialize(ResponseHead& head, const HeaderList& headers, bool keep_alive) {
  for (const auto& [name, value] : headers) head.insert(name, value);
  head.keep_alive(keep_alive);
  std::ostringstream out;
  out << head.base();
  return std::move(out).str();
}

template <class Stream>
class Session;

template <class Stream>
class Writer : public ResponseWriter {
 public:
  Writer(std::shared_ptr<Session<Stream>> session, uint64_t generation)
      : session_(std::move(session)), generation_(generation) {}

  void Respond(int status, std::string content_type, std::string body, HeaderList headers) override;
  void StartStream(int status, std::string content_type, HeaderList headers) override;
  void Write(std::string data) override;
  void End() override;
  void Post(std::function<void()> fn) override;
  void OnClientGone(std::function<void()> fn) override;

 private:
  const std::shared_ptr<Session<Stream>> session_;
  const uint64_t generation_;  // which of the connection's requests this answers
};

// One connection, plain (PlainStream) or HTTPS (TlsStream). Every member
// runs on the connection's strand.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

  // `tls`: the server's context, for an HTTPS session (nothing for plain).
  template <class... Tls>
  Session(tcp::socket socket, const HttpServerOptions* options, const Handler* handler,
          std::atomic<int>* active_responses, Tls&... tls)
      : stream_(std::move(socket), tls...),
        options_(options),
        handler_(handler),
        active_responses_(active_responses),
        read_timer_(stream_.get_executor()) {}
  ~Session() { EndResponse(); }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls) {
        self->DetectTls();
      } else {
        self->ReadRequest();
      }
    });
  }

  void Post(std::function<void()> fn) { net::post(stream_.get_executor(), std::move(fn)); }

  void DoRespond(uint64_t generation, int status, const std::string& content_type, std::string body,
                 const HeaderList& headers) {
    if (!Current(generation) || response_started_) return;
    response_started_ = true;
    response_ended_ = true;
    ResponseHead head = MakeHead(status, content_type);
    head.content_length(body.size());
    std::string bytes = Serialize(head, headers, keep_alive_);
    if (!head_) bytes += body;  // HEAD: the headers of a GET, no body
    Queue(std::move(bytes));
  }

  void DoStartStream(uint64_t generation, int status, const std::string& content_type, const HeaderList& headers) {
    if (!Current(generation) || response_started_) return;
    response_started_ = true;
    ResponseHead head = MakeHead(status, content_type);
    head.set(bhttp::field::cache_control, "no-cache");
    head.chunked(true);
    Queue(Serialize(head, headers, keep_alive_));
  }

  void DoWrite(uint64_t generation, const std::string& data) {
    // An empty chunk would end the stream.
    if (!Current(generation) || !response_started_ || response_ended_ || data.empty()) return;
    Queue(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
  }

  void DoEnd(uint64_t generation) {
    if (!Current(generation) || !response_started_ || response_ended_) return;
    response_ended_ = true;
    Queue("0\r\n\r\n");
  }

  void DoOnClientGone(uint64_t generation, std::function<void()> fn) {
    if (generation != generation_) return;
    if (gone_) {
      if (!response_ended_) fn();
      return;
    }
    on_gone_ = std::move(fn);
  }

  void Close() {
    EndResponse();
    if (closed_) return;
    closed_ = true;
    awaiting_ = false;
    read_timer_.cancel();
    beast::error_code ignored;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    tcp().close();
  }

 private:
  // The TCP layer under the stream (the stream itself when plain).
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }

  // HTTPS: the first bytes tell a TLS client from a plaintext one, which is
  // answered 400 in plaintext (it could read nothing else) and closed; a
  // failed handshake closes this connection only. Both within the request
  // timeout.
  void DetectTls() {
    tcp().expires_after(Millis(options_->request_timeout_seconds));
    beast::async_detect_ssl(tcp(), buffer_, [self = shared_from_this()](beast::error_code ec, bool tls) {
      if (ec) return self->Close();
      if (!tls) return self->RefusePlaintext();
      if constexpr (kTls) {
        self->stream_.async_handshake(net::ssl::stream_base::server, self->buffer_.data(),
                                      [self](beast::error_code ec, size_t used) {
                                        if (ec) return self->Close();
                                        self->buffer_.consume(used);
                                        self->ReadRequest();
                                      });
      }
    });
  }

  void RefusePlaintext() {
    const std::string message = "this port serves HTTPS only: use an https:// URL";
    ErrorBody error =
        options_->error_body ? options_->error_body(400, message) : ErrorBody{"text/plain", message};
    ResponseHead head = MakeHead(400, error.content_type);
    head.content_length(error.body.size());
    writing_bytes_ = Serialize(head, {}, /*keep_alive=*/false) + error.body;
    net::async_write(tcp(), net::buffer(writing_bytes_),
                     [self = shared_from_this()](beast::error_code, size_t) { self->Close(); });
  }

  bool Current(uint64_t generation) const { return generation == generation_ && handling_ && !gone_; }

  // Reading, in two phases: the next request's first byte may take up to the
  // idle timeout; from there the whole request must arrive within the
  // request timeout. Both deadlines are read_timer_'s, not the stream's:
  // Beast's own timeout closes the socket (no 408 could follow), and a
  // deadline set while a read is pending does not apply to that read.
  void ReadRequest() {
    if (closed_) return;
    if (buffer_.size() == 0) return AwaitRequest();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(options_->max_header_bytes, UINT32_MAX)));
    parser_->body_limit(options_->max_body_bytes);
    tcp().expires_never();
    request_timed_out_ = false;
    ArmReadTimer(options_->request_timeout_seconds, [this] {
      request_timed_out_ = true;
      beast::error_code ignored;
      tcp().socket().cancel(ignored);  // the read ends with operation_aborted
    });
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  // Waits for a first byte with the idle timeout. The watch read, which
  // may still be pending from the last response, brings it.
  void AwaitRequest() {
    awaiting_ = true;
    Watch();
    ArmReadTimer(options_->idle_timeout_seconds, [this] { Close(); });
  }

  // Runs `on_expiry` on the strand after `seconds`, unless the timer is
  // re-armed or DisarmReadTimer runs first.
  void ArmReadTimer(double seconds, std::function<void()> on_expiry) {
    const uint64_t id = ++read_deadline_;
    read_timer_.expires_after(Millis(seconds));
    read_timer_.async_wait([self = shared_from_this(), id, on_expiry = std::move(on_expiry)](beast::error_code ec) {
      // A handler already queued when the timer was re-armed is stale.
      if (!ec && id == self->read_deadline_) on_expiry();
    });
  }
  void DisarmReadTimer() {
    ++read_deadline_;
    read_timer_.cancel();
  }

  void OnRequest(beast::error_code ec) {
    DisarmReadTimer();
    if (ec == bhttp::error::body_limit) {
      RejectAndClose(413, absl::StrCat("the request body is larger than ", options_->max_body_bytes, " bytes"));
      return;
    }
    if (ec == bhttp::error::header_limit) {
      RejectAndClose(431, absl::StrCat("the request line and headers are larger than ", options_->max_header_bytes,
                                       " bytes"));
      return;
    }
    if (ec && request_timed_out_) {
      RejectAndClose(408, absl::StrCat("the request did not arrive within ", options_->request_timeout_seconds,
                                       " s of its first byte"));
      return;
    }
    if (ec == bhttp::error::end_of_stream || ec == net::error::operation_aborted || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      Close();
      return;
    }
    if (ec) {
      RejectAndClose(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      return;
    }
    tcp().expires_never();
    bhttp::request<bhttp::string_body> raw = parser_->release();
    HttpRequest request;
    request.method = std::string(raw.method_string());
    const std::string_view target(raw.target().data(), raw.target().size());
    const size_t q = target.find('?');
    request.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
    for (const auto& field : raw) {
      request.headers[absl::AsciiStrToLower(std::string(field.name_string().data(), field.name_string().size()))] =
          std::string(field.value());
    }
    request.body = std::move(raw.body());
    keep_alive_ = raw.keep_alive();
    head_ = raw.method() == bhttp::verb::head;
    BeginResponse();
    auto writer = std::make_shared<Writer<Stream>>(shared_from_this(), generation_);
    Watch();
    (*handler_)(std::move(request), std::move(writer));
  }

  void BeginResponse() {
    ++generation_;
    handling_ = true;
    if (!counted_) {
      counted_ = true;
      ++*active_responses_;
    }
    response_started_ = false;
    response_ended_ = false;
    on_gone_ = nullptr;
  }

  // Answers a request that could not be parsed, then closes. The client may
  // still be sending its body: it is read and dropped meanwhile (for 5 s at
  // most), so the client sees the answer rather than a reset connection.
  void RejectAndClose(int status, const std::string& message) {
    keep_alive_ = false;
    head_ = false;
    drain_ = true;
    BeginResponse();
    // In the application's format, so that clients parse this error like any other.
    ErrorBody error = options_->error_body ? options_->error_body(status, message) : ErrorBody{"text/plain", message};
    DoRespond(generation_, status, error.content_type, std::move(error.body), {});
  }

  // Keeps a read pending while a response is being produced, to learn at
  // once that the client hung up. Bytes that arrive instead are the client's
  // next request (pipelined, or sent as soon as it had our answer): they stay
  // in buffer_ for the next ReadRequest, and the watch ends there, since a
  // client that sends is still there (a later hang-up shows as a failed
  // write). Bytes already buffered (pipelined with the last request) make a
  // watch pointless: the next request is read from them once this one is
  // answered.
  void Watch() {
    if (watching_ || gone_ || closed_ || buffer_.size() > 0) return;
    watching_ = true;
    tcp().expires_never();  // the read direction only, when a write is pending
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (ec) {
        self->ClientGone();
        return;
      }
      self->buffer_.commit(n);
      if (self->awaiting_) {
        self->awaiting_ = false;
        self->DisarmReadTimer();
        self->ReadRequest();
      }
    });
  }

  void ClientGone() {
    if (gone_) return;
    gone_ = true;
    if (handling_ && !response_ended_ && on_gone_) {
      auto fn = std::move(on_gone_);
      on_gone_ = nullptr;
      fn();
    }
    Close();
  }

  void Queue(std::string bytes) {
    pending_.push_back(std::move(bytes));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (pending_.empty()) {
      writing_ = false;
      if (response_ended_ && handling_) Finished();
      return;
    }
    writing_ = true;
    // A client that stops reading is treated as gone once a write stalls.
    tcp().expires_after(Millis(options_->write_timeout_seconds));
    // Everything queued goes out in one write.
    writing_bytes_.clear();
    for (std::string& piece : pending_) writing_bytes_ += piece;
    pending_.clear();
    net::async_write(stream_, net::buffer(writing_bytes_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->writing_ = false;
        self->ClientGone();
        return;
      }
      self->WriteNext();
    });
  }

  // This connection's response no longer counts as active.
  void EndResponse() {
    if (!counted_) return;
    counted_ = false;
    --*active_responses_;
  }

  // The response is on the wire.
  void Finished() {
    handling_ = false;
    EndResponse();
    on_gone_ = nullptr;
    if (drain_ && !gone_) {
      Drain();
    } else if (!keep_alive_ || gone_) {
      Close();
    } else {
      ReadRequest();
    }
  }

  // After a rejected request: stop sending, read and drop what the client
  // still sends for a few seconds, then close.
  void Drain() {
    beast::error_code ignored;
    tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
    tcp().expires_after(std::chrono::seconds(5));
    DrainSome();
  }
  void DrainSome() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(64 << 10), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->Close();
      } else {
        self->DrainSome();
      }
    });
  }

  Stream stream_;
  const HttpServerOptions* const options_;
  const Handler* const handler_;
  std::atomic<int>* const active_responses_;
  bool counted_ = false;  // this connection's response is in *active_responses_
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  uint64_t generation_ = 0;
  bool handling_ = false;
  bool response_started_ = false;
  bool response_ended_ = false;
  bool keep_alive_ = true;
  bool head_ = false;  // the request is a HEAD
  bool watching_ = false;
  bool writing_ = false;
  bool gone_ = false;
  bool closed_ = false;
  bool drain_ = false;
  bool awaiting_ = false;           // waiting for the first byte of a request
  bool request_timed_out_ = false;  // the request timeout cut the read short
  net::steady_timer read_timer_;    // the idle or the request deadline
  uint64_t read_deadline_ = 0;      // which arming of read_timer_ is current
  std::function<void()> on_gone_;
  std::deque<std::string> pending_;
  std::string writing_bytes_;
};

template <class Stream>
void Writer<Stream>::Respond(int status, std::string content_type, std::string body, HeaderList headers) {
  session_->Post([s = session_, g = generation_, status, content_type = std::move(content_type), body = std::move(body),
                  headers = std::move(headers)]() mutable {
    s->DoRespond(g, status, content_type, std::move(body), headers);
  });
}

template <class Stream>
void Writer<Stream>::StartStream(int status, std::string content_type, HeaderList headers) {
  session_->Post([s = session_, g = generation_, status, content_type = std::move(content_type),
                  headers = std::move(headers)] { s->DoStartStream(g, status, content_type, headers); });
}

template <class Stream>
void Writer<Stream>::Write(std::string data) {
  session_->Post([s = session_, g = generation_, data = std::move(data)] { s->DoWrite(g, data); });
}

template <class Stream>
void Writer<Stream>::End() {
  session_->Post([s = session_, g = generation_] { s->DoEnd(g); });
}

template <class Stream>
void Writer<Stream>::Post(std::function<void()> fn) {
  session_->Post(std::move(fn));
}

template <class Stream>
void Writer<Stream>::OnClientGone(std::function<void()> fn) {
  session_->Post([s = session_, g = generation_, fn = std::move(fn)]() mutable { s->DoOnClientGone(g, std::move(fn)); });
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, Handler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        ios_(MakeContexts(options_.threads)),
        acceptor_(*ios_[0]),
        retry_(*ios_[0]) {}

  absl::Status Listen() {
    if (absl::Status s = LoadTls(); !s.ok()) return s;
    beast::error_code ec;
    const auto address = net::ip::make_address(options_.host, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("bad --host '", options_.host, "': ", ec.message()));
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options_.host, ":", options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (const std::unique_ptr<net::io_context>& io : ios_) {
      // A context without a connection yet has nothing to wait for: the
      // guard keeps its thread running until Shutdown stops it.
      threads_.emplace_back([&io = *io] {
        auto guard = net::make_work_guard(io);
        io.run();
      });
    }
    return absl::OkStatus();
  }

  void StopAccepting() {
    net::post(*ios_[0], [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
  }

  int active_responses() const { return active_responses_.load(); }

  void Shutdown() {
    if (stopped_) return;
    stopped_ = true;
    net::post(*ios_[0], [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    for (const std::unique_ptr<net::io_context>& io : ios_) io->stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  int port() const { return port_; }

 private:
  // One io_context per thread, each run by its thread alone (concurrency
  // hint 1): a handler posted to a context wakes that thread and no other.
  // One context shared by the threads woke the idle peer at almost every
  // handler (Asio hands "more work" to another thread), about 1.8 extra
  // context switches per streamed token at concurrency 1.
  static std::vector<std::unique_ptr<net::io_context>> MakeContexts(int threads) {
    std::vector<std::unique_ptr<net::io_context>> ios;
    for (int i = 0; i < std::max(1, threads); ++i) ios.push_back(std::make_unique<net::io_context>(1));
    return ios;
  }

  // Connections go to the threads' contexts in turn; each keeps its strand,
  // which ResponseWriter::Post relies on.
  void Accept() {
    net::io_context& io = *ios_[next_io_++ % ios_.size()];
    acceptor_.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (ec) {
        // Out of file descriptors, most likely: wait before trying again
        // rather than spin.
        std::fprintf(stderr, "tandem http: accept failed: %s\n", ec.message().c_str());
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](beast::error_code wait_ec) {
          if (!wait_ec) Accept();
        });
        return;
      }
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (tls_ != nullptr) {
        std::make_shared<Session<TlsStream>>(std::move(socket), &options_, &handler_, &active_responses_, *tls_)
            ->Start();
      } else {
        std::make_shared<Session<PlainStream>>(std::move(socket), &options_, &handler_, &active_responses_)
            ->Start();
      }
      Accept();
    });
  }

  // HTTPS when both files are set: TLS 1.2 or 1.3, no client certificate.
  absl::Status LoadTls() {
    if (options_.tls_cert_file.empty() && options_.tls_key_file.empty()) return absl::OkStatus();
    if (options_.tls_cert_file.empty() || options_.tls_key_file.empty()) {
      return absl::InvalidArgumentError("HTTPS needs both a certificate and its key");
    }
    tls_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
    tls_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                      net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
    beast::error_code ec;
    tls_->use_certificate_chain_file(options_.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("HTTPS certificate '", options_.tls_cert_file, "' unusable: ", ec.message()));
    }
    tls_->use_private_key_file(options_.tls_key_file, net::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("HTTPS key '", options_.tls_key_file, "' unusable: ", ec.message()));
    }
    return absl::OkStatus();
  }

  const HttpServerOptions options_;
  const Handler handler_;
  std::unique_ptr<net::ssl::context> tls_;  // null: plain HTTP
  // Before ios_: sessions still queued in a context are destroyed with it and count down.
  std::atomic<int> active_responses_{0};
  std::vector<std::unique_ptr<net::io_context>> ios_;
  size_t next_io_ = 0;  // the context of the next connection; the accept handler's only
  tcp::acceptor acceptor_;
  net::steady_timer retry_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options, Handler handler) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Shutdown(); }
int HttpServer::port() const { return impl_->port(); }
void HttpServer::Shutdown() { impl_->Shutdown(); }
void HttpServer::StopAccepting() { impl_->StopAccepting(); }
int HttpServer::active_responses() const { return impl_->active_responses(); }

}  // namespace tandem::http
