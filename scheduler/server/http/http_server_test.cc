#include "scheduler/server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

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

 private:
  int fd_ = -1;
};

std::unique_ptr<HttpServer> StartServer(Handler handler, size_t max_body = 1 << 20,
                                        ErrorBodyRenderer error_body = nullptr) {
  HttpServerOptions options;
  options.port = 0;
  options.max_body_bytes = max_body;
  options.error_body = std::move(error_body);
  auto server = HttpServer::Start(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
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
  auto server = StartServer([](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
    // From another thread, as the engine does.
    std::thread([writer] {
      writer->StartStream(200, "text/event-stream");
      writer->Write("data: 1\n\n");
      writer->Write("");  // ignored: it would end the stream
      writer->Write(std::string(300, 'x'));
      writer->End();
      writer->Write("too late");
    }).detach();
  });
  Client client(server->port());
  client.Send("GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(client.ReadUntilClosed(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            "9\r\ndata: 1\n\n\r\n12c\r\n" + std::string(300, 'x') + "\r\n0\r\n\r\n");
}

TEST(HttpServerTest, OversizedBodyIs413AndMalformedIs400) {
  int handled = 0;
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

}  // namespace
}  // namespace tandem::http
