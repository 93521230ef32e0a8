#include "scheduler/server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A blocking client socket to 127.0.0.1:port.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Client() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  void Send(const std::string& bytes) { ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size())); }
  // Reads until `bytes` have arrived, the peer closes, or 5 s pass.
  std::string Read(size_t bytes) {
    std::string out;
    char buf[4096];
    while (out.size() < bytes) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, n);
    }
    return out;
  }
  std::string ReadUntilClosed() { return Read(SIZE_MAX); }
  int fd() const { return fd_; }
  // Whether the server closed the connection (EOF or a reset) within 5 s,
  // dropping whatever else arrives.
  bool ClosedByServer() {
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;  // EAGAIN: 5 s passed
    }
  }

 private:
  int fd_ = -1;
};

std::unique_ptr<HttpServer> StartServer(Handler handler, HttpServerOptions options) {
  options.port = 0;
  auto server = HttpServer::Start(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

std::unique_ptr<HttpServer> StartServer(Handler handler, size_t max_body = 1 << 20,
                                        ErrorBodyRenderer error_body = nullptr) {
  HttpServerOptions options;
  options.max_body_bytes = max_body;
  options.error_body = std::move(error_body);
  return StartServer(std::move(handler), std::move(options));
}

// Threads the handlers start to answer from elsewhere, as the engine does.
// They are joined before the server is destroyed: a writer used or released
// after its server is gone touches freed connections (the server's contract,
// which tandem serve keeps by stopping the engine first). Declare one after
// the server's unique_ptr and assign the server after it, so that it is
// joined first whichever way the test ends.
class HandlerThreads {
 public:
  ~HandlerThreads() {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : threads_) t.join();
  }
  void Start(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back(std::move(fn));
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// Answers "ok" with the path, at once.
void Echo(HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
  writer->Respond(200, "text/plain", "ok " + request.path);
}

// The server still answers a well-behaved client.
void ExpectServing(const HttpServer& server) {
  Client client(server.port());
  client.Send("GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(client.ReadUntilClosed(), EndsWith("\r\n\r\nok /fine"));
}

TEST(HttpServerTest, WholeResponsesOnAKeptAliveConnection) {
  auto server = StartServer([](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    writer->Respond(200, "text/plain", request.method + " " + request.path + " " + request.query + " " +
                                           request.header("x-test") + " " + request.body);
  });
  Client client(server->port());
  client.Send("POST /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Test: yes\r\nContent-Length: 4\r\n\r\nbody");
  const std::string first = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n\r\nPOST /a b=1 yes body";
  EXPECT_EQ(client.Read(first.size()), first);
  // HEAD: a GET's headers, Content-Length included, and no body.
  client.Send("HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n";
  EXPECT_EQ(client.Read(head.size()), head);
  client.Send("GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(client.ReadUntilClosed(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\nGET /c   ");
}

TEST(HttpServerTest, StreamsChunksByteForByte) {
  std::unique_ptr<HttpServer> server;
  HandlerThreads handlers;
  server = StartServer([&handlers](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
    handlers.Start([writer] {
      writer->StartStream(200, "text/event-stream");
      writer->Write("data: 1\n\n");
      writer->Write("");  // ignored: it would end the stream
      writer->Write(std::string(300, 'x'));
      writer->End();
      writer->Write("too late");
    });
  });
  Client client(server->port());
  client.Send("GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(client.ReadUntilClosed(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            "9\r\ndata: 1\n\n\r\n12c\r\n" + std::string(300, 'x') + "\r\n0\r\n\r\n");
}

TEST(HttpServerTest, OversizedBodyIs413AndMalformedIs400) {
  std::atomic<int> handled = 0;
  // The application renders the server's own errors.
  auto server = StartServer(
      [&](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
        ++handled;
        writer->Respond(200, "text/plain", "ok");
      },
      /*max_body=*/100,
      [](int status, const std::string& message) { return ErrorBody{"application/x-test", "E" + std::to_string(status)}; });
  {
    Client client(server->port());
    client.Send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'a'));
    const std::string reply = client.ReadUntilClosed();
    EXPECT_THAT(reply, StartsWith("HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/x-test\r\n"));
    EXPECT_THAT(reply, EndsWith("\r\n\r\nE413"));
  }
  {
    Client client(server->port());
    client.Send("NOT HTTP AT ALL\r\n\r\n");
    EXPECT_THAT(client.ReadUntilClosed(), StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  }
  // The server still answers.
  Client client(server->port());
  client.Send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(client.ReadUntilClosed(), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(handled, 1);
}

TEST(HttpServerTest, OwnErrorsAreTextWithoutARenderer) {
  auto server = StartServer([](HttpRequest, std::shared_ptr<ResponseWriter>) {}, /*max_body=*/10);
  Client client(server->port());
  client.Send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + std::string(20, 'a'));
  const std::string reply = client.ReadUntilClosed();
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain\r\n"));
  EXPECT_THAT(reply, EndsWith("the request body is larger than 10 bytes"));
}

TEST(HttpServerTest, AClientThatHangsUpIsNoticedWhileTheResponseIsPending) {
  std::promise<void> gone;
  std::mutex mu;
  std::shared_ptr<ResponseWriter> kept;  // the "engine" holds the writer and never answers
  auto server = StartServer([&](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
    writer->OnClientGone([&gone] { gone.set_value(); });
    writer->StartStream(200, "text/event-stream");
    std::lock_guard<std::mutex> lock(mu);
    kept = writer;
  });
  Client client(server->port());
  client.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(client.Read(10), StartsWith("HTTP/1.1 2"));
  client.Close();
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  std::lock_guard<std::mutex> lock(mu);
  kept->Write("after the client left");  // ignored, no crash
  kept->End();
  kept.reset();  // writers go before their server
}

TEST(HttpServerTest, ManyConcurrentStreamsOnTwoThreads) {
  constexpr int kClients = 300;
  auto server = StartServer([](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    writer->StartStream(200, "text/event-stream");
    writer->Write("data: " + request.path + "\n\n");
    writer->End();
  });
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    clients.back()->Send("GET /" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  }
  for (int i = 0; i < kClients; ++i) {
    EXPECT_THAT(clients[i]->ReadUntilClosed(), HasSubstr("data: /" + std::to_string(i) + "\n\n")) << i;
  }
}

// Each connection is served by one thread of the pool, its requests and the
// functions posted to its writer alike, and connections are spread over the
// threads: a token streamed at concurrency 1 then wakes one thread, not the
// pool (one shared io_context hopped between the threads).
TEST(HttpServerTest, AConnectionStaysOnOneThreadAndConnectionsShareThePool) {
  std::mutex mu;
  std::map<std::string, std::set<std::thread::id>> threads;  // by connection
  std::unique_ptr<HttpServer> server;
  HandlerThreads handlers;
  server = StartServer([&](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    const std::string connection = request.header("x-connection");
    {
      std::lock_guard<std::mutex> lock(mu);
      threads[connection].insert(std::this_thread::get_id());
    }
    // From another thread, as the engine posts outputs.
    handlers.Start([&mu, &threads, connection, writer] {
      writer->Post([&mu, &threads, connection, writer] {
        {
          std::lock_guard<std::mutex> lock(mu);
          threads[connection].insert(std::this_thread::get_id());
        }
        writer->Respond(200, "text/plain", "ok");
      });
    });
  });
  Client a(server->port()), b(server->port());
  const std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
  for (int i = 0; i < 20; ++i) {
    for (auto [client, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      client->Send(absl::StrCat("GET /", i, " HTTP/1.1\r\nHost: x\r\nX-Connection: ", name, "\r\n\r\n"));
      ASSERT_EQ(client->Read(answer.size()), answer);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(threads["a"].size(), 1u);
  ASSERT_EQ(threads["b"].size(), 1u);
  EXPECT_NE(*threads["a"].begin(), *threads["b"].begin());
}

// Request line and headers over max_header_bytes: 431, whether one long
// field or many; a URL over the limit too.
TEST(HttpServerTest, OversizedHeaderIs431) {
  HttpServerOptions options;
  options.max_header_bytes = 1024;
  auto server = StartServer(Echo, options);
  const std::vector<std::string> requests = {
      "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\n" + [] {
        std::string many;
        for (int i = 0; i < 200; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
        return many;
      }() + "\r\n",
      "GET /" + std::string(2000, 'u') + " HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (const std::string& request : requests) {
    Client client(server->port());
    client.Send(request);
    const std::string reply = client.ReadUntilClosed();
    EXPECT_THAT(reply, StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n")) << request.substr(0, 40);
    EXPECT_THAT(reply, EndsWith("the request line and headers are larger than 1024 bytes"));
  }
  // A header just under the limit is fine.
  Client client(server->port());
  client.Send("GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + std::string(900, 'a') + "\r\n\r\n");
  EXPECT_THAT(client.ReadUntilClosed(), EndsWith("ok /ok"));
}

// Bytes that are not HTTP/1.1 get 400, and the connection is closed; the
// server goes on.
TEST(HttpServerTest, MalformedRequestsAre400) {
  std::atomic<int> handled = 0;
  auto server = StartServer([&](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    ++handled;
    Echo(std::move(request), std::move(writer));
  });
  const std::vector<std::string> requests = {
      "\r\n\r\n\r\n",
      std::string("GET / HTTP/1.1\r\nHost: x\0y\r\n\r\n", 28),
      "GET / HTTP/9.9\r\nHost: x\r\n\r\n",
      "GET  HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
      "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
      "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  // a TLS ClientHello
  };
  for (const std::string& request : requests) {
    Client client(server->port());
    client.Send(request);
    const std::string reply = client.ReadUntilClosed();
    EXPECT_THAT(reply, StartsWith("HTTP/1.1 400 Bad Request\r\n")) << testing::PrintToString(request);
    EXPECT_THAT(reply, HasSubstr("Connection: close\r\n"));
  }
  EXPECT_EQ(handled, 0);
  ExpectServing(*server);
}

// Requests sent back to back without waiting are answered in order, also
// when they arrive in one packet with the first.
TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::unique_ptr<HttpServer> server;
  HandlerThreads handlers;
  server = StartServer([&handlers](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    // Later answers would overtake earlier ones if the server let them.
    handlers.Start([request = std::move(request), writer] {
      if (request.path == "/1") std::this_thread::yield();
      writer->Respond(200, "text/plain", request.path + ":" + request.body);
    });
  });
  Client client(server->port());
  client.Send(
      "POST /1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"
      "GET /2 HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nc\r\n0\r\n\r\n"
      "GET /4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string reply = client.ReadUntilClosed();
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ";
  EXPECT_EQ(reply, head + "4\r\n\r\n/1:a" + head + "3\r\n\r\n/2:" + head + "4\r\n\r\n/3:c" + head +
                       "3\r\nConnection: close\r\n\r\n/4:");
}

// A client that starts a request and then trickles it (a byte every 50 ms,
// never a silent gap) is answered 408 once the request timeout has passed
// since its first byte, and closed; others are served meanwhile.
TEST(HttpServerTest, ASlowSenderGets408AndIsClosed) {
  HttpServerOptions options;
  options.request_timeout_seconds = 0.5;
  auto server = StartServer(Echo, options);
  for (const std::string& start : {std::string("GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "),
                                   std::string("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")}) {
    Client slow(server->port());
    const auto began = std::chrono::steady_clock::now();
    slow.Send(start);
    std::atomic<bool> stop = false;
    std::thread trickle([&] {
      // The scenario itself: bytes spaced in time. Send fails once closed.
      while (!stop && send(slow.fd(), "a", 1, MSG_NOSIGNAL) == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    ExpectServing(*server);
    const std::string reply = slow.ReadUntilClosed();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    stop = true;
    trickle.join();
    EXPECT_THAT(reply, StartsWith("HTTP/1.1 408 Request Timeout\r\n")) << start;
    EXPECT_THAT(reply, HasSubstr("Connection: close\r\n"));
    EXPECT_GE(seconds, 0.5);
    EXPECT_LT(seconds, 4.0);
  }
  ExpectServing(*server);
}

// The idle timeout holds between requests on a kept-alive connection too,
// after a response (when the read that watched for a hang-up is still
// pending), not only before the first request.
TEST(HttpServerTest, AnIdleConnectionIsClosedAfterAResponse) {
  HttpServerOptions options;
  options.idle_timeout_seconds = 0.3;
  auto server = StartServer(Echo, options);
  {
    Client silent(server->port());
    EXPECT_TRUE(silent.ClosedByServer());
  }
  Client client(server->port());
  client.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(client.Read(60), EndsWith("ok /a"));
  client.Send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n");  // kept alive
  EXPECT_THAT(client.Read(60), EndsWith("ok /b"));
  EXPECT_TRUE(client.ClosedByServer());
}

// A client that stops reading a stream is dropped once a write stalls for
// the write timeout: its OnClientGone runs (the frontend then aborts the
// request) rather than the response waiting forever.
TEST(HttpServerTest, AClientThatStopsReadingIsDropped) {
  HttpServerOptions options;
  options.write_timeout_seconds = 0.5;
  std::promise<void> gone;
  std::shared_ptr<ResponseWriter> kept;
  std::mutex mu;
  auto server = StartServer(
      [&](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
        writer->OnClientGone([&gone] { gone.set_value(); });
        writer->StartStream(200, "text/event-stream");
        // Far more than the socket buffers hold.
        for (int i = 0; i < 64; ++i) writer->Write(std::string(1 << 20, 'x'));
        std::lock_guard<std::mutex> lock(mu);
        kept = writer;
      },
      options);
  Client client(server->port());
  client.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard<std::mutex> lock(mu);
  kept.reset();
}

}  // namespace
}  // namespace tandem::http
