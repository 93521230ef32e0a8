// HttpServer: a small HTTP/1.1 server on Boost.Beast (Asio), for the OpenAI
// frontend; it knows routes, bodies and streams, not OpenAI. A fixed pool of threads runs every connection asynchronously, so a
// thousand streaming clients cost a thousand sockets and no threads.
//
// Each connection reads one request at a time and hands it to the Handler
// with a ResponseWriter. The handler answers at once or later, from any
// thread (the engine thread streams tokens through it). While a response is
// pending the connection keeps reading, so a client that hangs up is noticed
// at once, not at the next write; the writer's OnClientGone callback then
// runs (the frontend aborts the request and its KV blocks are freed).
//
// A whole response carries Content-Length; a stream (SSE) uses chunked
// transfer encoding. Pipelined requests are answered in order.
//
// What a client may not do (HttpServerOptions has the limits): send a header
// or a body over the limit (431, 413), send something that is not HTTP/1.1
// (400), take longer than the request timeout over one request (408), stop
// reading a response, or stay silent between requests beyond the idle
// timeout; each answer is followed by closing that connection only.
//
// Beast is slow to compile; it stays out of this header.
#ifndef TANDEM_SCHEDULER_SERVER_HTTP_HTTP_SERVER_H_
#define TANDEM_SCHEDULER_SERVER_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string query;   // after '?', may be empty
  absl::flat_hash_map<std::string, std::string> headers;  // names in lower case
  std::string body;

  // The header's value, or "" when absent. `name` in lower case.
  const std::string& header(const std::string& name) const;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// One response. Thread-safe: every call is carried out, in call order, on the
// connection's strand; calls after the response ended, or after the client
// went away, are ignored.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;

  // A whole response with Content-Length.
  virtual void Respond(int status, std::string content_type, std::string body, HeaderList headers = {}) = 0;
  // A streamed response (chunked): the header, any number of Writes, End.
  virtual void StartStream(int status, std::string content_type, HeaderList headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;

  // Runs `fn` on the connection's strand, after everything queued before it:
  // state touched only from posted functions needs no lock.
  virtual void Post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, if the client goes away before the
  // response has ended. Set it before the response can end.
  virtual void OnClientGone(std::function<void()> fn) = 0;
};

using Handler = std::function<void(HttpRequest request, std::shared_ptr<ResponseWriter> writer)>;

// The body of an error the server answers by itself (a malformed request, a
// body over the limit), in the application's format.
struct ErrorBody {
  std::string content_type;
  std::string body;
};
using ErrorBodyRenderer = std::function<ErrorBody(int status, const std::string& message)>;

// Limits on what one client can hold: each bad case is answered with its
// 4xx and the connection closed, and the server goes on serving the others.
struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0: any free port
  int threads = 2;          // run every connection
  size_t max_body_bytes = 8 << 20;     // a larger body is answered 413
  size_t max_header_bytes = 16 << 10;  // request line and header fields; more is answered 431
  double idle_timeout_seconds = 120;   // a connection silent between requests is closed
  // From a request's first byte to its last: a slower sender is answered 408
  // and closed, so that it cannot hold a connection by trickling bytes.
  double request_timeout_seconds = 30;
  // One write the client does not take within this (it stopped reading)
  // closes the connection, as a hang-up does.
  double write_timeout_seconds = 60;
  ErrorBodyRenderer error_body;       // unset: the message as text/plain
  // HTTPS on the port when both are set (PEM files; the scheduler's
  // --https-cert/--https-key): TLS 1.2 or 1.3, no client certificate. A
  // plaintext request there is answered 400 in plaintext and closed.
  std::string tls_cert_file;  // the certificate chain
  std::string tls_key_file;   // its private key
};

// Every ResponseWriter must be released before the server is destroyed (a
// writer keeps its connection, whose socket belongs to the server's
// io_context); Shutdown may come first.
class HttpServer {
 public:
  // Binds and starts serving; the handler runs on the server's threads.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options, Handler handler);
  ~HttpServer();

  int port() const;
  // Stops accepting connections; those open keep being served (draining).
  void StopAccepting();
  // Responses begun and not yet written out (or abandoned by their client).
  int active_responses() const;
  // Stops accepting, closes every connection and joins the threads.
  void Shutdown();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_SCHEDULER_SERVER_HTTP_HTTP_SERVER_H_
