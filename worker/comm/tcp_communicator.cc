// Every socket is non-blocking; each blocking step is a poll() with a
// deadline, so one helper pair (ReadSome / WriteAll) serves the handshake, the
// receiver and the sender threads, and shutdown() wakes whoever is waiting.
#include "worker/comm/tcp_communicator.h"

#include <netdb.h>
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <iterator>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

constexpr uint32_t kHelloMagic = 0x484d4454;  // "TDMH" on the wire
constexpr uint32_t kFrameMagic = 0x464d4454;  // "TDMF" on the wire
constexpr uint32_t kVersion = 1;
// How long an accepted connection may take to send its hello. A real peer
// sends it right after connecting; this only bounds a silent stranger.
constexpr absl::Duration kHelloTimeout = absl::Seconds(2);

// A reply's verdict; indexes kVerdictText.
enum Verdict : uint32_t {
  kAccepted,
  kBadVersion,
  kWrongWorldSize,
  kWrongEpoch,
  kUnexpectedRank,
  kDuplicateRank
};
constexpr const char* kVerdictText[] = {"accepted",
                                        "protocol version mismatch",
                                        "world size mismatch",
                                        "group epoch mismatch (a peer from another group)",
                                        "unexpected rank",
                                        "rank already connected"};
const char* VerdictText(uint32_t v) {
  return v < std::size(kVerdictText) ? kVerdictText[v] : "unknown verdict";
}

// The wire structs are copied as they are: every target we build for is
// little-endian, which the header's wire format names.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");

// The hello and its reply share one layout (see the header).
struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kVersion;
  int32_t from = 0;
  int32_t to = 0;
  int32_t world_size = 0;
  uint32_t verdict = kAccepted;
  uint64_t epoch = 0;
};
static_assert(sizeof(Hello) == 32, "hello layout");

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t reserved = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 16, "frame header layout");

// The acceptor's verdict on a hello; `links` holds the ranks accepted so far.
template <typename Links>
Verdict Judge(const Hello& h, int32_t rank, int32_t world_size, uint64_t epoch,
              const Links& links) {
  if (h.version != kVersion) return kBadVersion;
  if (h.world_size != world_size) return kWrongWorldSize;
  if (h.epoch != epoch) return kWrongEpoch;
  if (h.to != rank || h.from <= rank || h.from >= world_size) return kUnexpectedRank;
  if (links[h.from].fd >= 0) return kDuplicateRank;
  return kAccepted;
}

// The bytes of a wire struct, const or not.
template <typename T>
auto* AsBytes(T* t) {
  return reinterpret_cast<std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>*>(t);
}

std::string ErrnoText(int err) {
  char buf[128];
  return std::string(strerror_r(err, buf, sizeof(buf)));  // GNU variant
}

// Milliseconds for poll(): -1 for no deadline, rounded up otherwise.
int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      INT_MAX, absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
}

// OK once `fd` reports any event (errors included: the next I/O call names
// them), DeadlineExceeded at the deadline.
absl::Status PollFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, PollMs(deadline));
    if (r > 0) return absl::OkStatus();
    if (r == 0 && absl::Now() >= deadline) return absl::DeadlineExceededError("timed out");
    if (r < 0 && errno != EINTR)
      return absl::UnavailableError(absl::StrCat("poll: ", ErrnoText(errno)));
  }
}

// A connected socket and, with TLS, its session. `ssl_mu` serializes the SSL
// calls of a Peer's sender thread and its reader; null while one thread owns
// the connection (the handshake).
struct Conn {
  int fd = -1;
  SSL* ssl = nullptr;
  absl::Mutex* ssl_mu = nullptr;
};

// Reads until buf[0, n) is full, advancing *got so that a caller can resume
// after DeadlineExceeded. Unavailable on EOF or a socket error.
absl::Status PlainReadSome(int fd, uint8_t* buf, size_t n, size_t* got, absl::Time deadline) {
  while (*got < n) {
    ssize_t r = recv(fd, buf + *got, n - *got, MSG_DONTWAIT);
    if (r > 0) {
      *got += static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError(
          *got == 0 ? "peer closed the connection"
                    : absl::StrCat("peer closed the connection after ", *got, " of ", n, " bytes"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TANDEM_RETURN_IF_ERROR(PollFd(fd, POLLIN, deadline));
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status PlainWriteAll(int fd, const uint8_t* buf, size_t n, absl::Time deadline) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = send(fd, buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) {
      done += static_cast<size_t>(r);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TANDEM_RETURN_IF_ERROR(PollFd(fd, POLLOUT, deadline));
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

// One non-blocking SSL call's outcome, with the reason read while the
// session was still held.
struct TlsStep {
  int result = 0;
  int error = SSL_ERROR_NONE;
  int saved_errno = 0;
  std::string reason;
};

std::string TlsReason(SSL* ssl) {
  const long verify = SSL_get_verify_result(ssl);
  std::string text = DrainTlsErrors();
  if (verify != X509_V_OK) {
    return absl::StrCat("certificate verify failed: ", X509_verify_cert_error_string(verify), " (",
                        text, ")");
  }
  return text;
}

template <typename Call>
TlsStep TlsCall(const Conn& c, const Call& call) {
  TlsStep step;
  auto run = [&] {
    ERR_clear_error();
    errno = 0;
    step.result = call(c.ssl);
    step.error = step.result > 0 ? SSL_ERROR_NONE : SSL_get_error(c.ssl, step.result);
    step.saved_errno = errno;
    if (step.error == SSL_ERROR_SSL) step.reason = TlsReason(c.ssl);
  };
  if (c.ssl_mu != nullptr) {
    absl::MutexLock lock(c.ssl_mu);
    run();
  } else {
    run();
  }
  return step;
}

// After an SSL call that made no progress: OK once it may be retried (after
// waiting for the socket), PermissionDenied for a TLS failure (a refused
// certificate, a peer that does not speak TLS), Unavailable otherwise.
absl::Status TlsWait(const Conn& c, const TlsStep& step, absl::Time deadline) {
  switch (step.error) {
    case SSL_ERROR_WANT_READ:
      return PollFd(c.fd, POLLIN, deadline);
    case SSL_ERROR_WANT_WRITE:
      return PollFd(c.fd, POLLOUT, deadline);
    case SSL_ERROR_ZERO_RETURN:
      return absl::UnavailableError("peer closed the connection");
    case SSL_ERROR_SYSCALL:
      if (step.saved_errno == EINTR) return absl::OkStatus();
      return absl::UnavailableError(step.saved_errno == 0 ? "peer closed the connection"
                                                          : ErrnoText(step.saved_errno));
    default:
      return absl::PermissionDeniedError(absl::StrCat("TLS: ", step.reason));
  }
}

absl::Status ReadSome(const Conn& c, uint8_t* buf, size_t n, size_t* got, absl::Time deadline) {
  if (c.ssl == nullptr) return PlainReadSome(c.fd, buf, n, got, deadline);
  while (*got < n) {
    const int want = static_cast<int>(std::min<size_t>(n - *got, INT_MAX));
    const TlsStep step = TlsCall(c, [&](SSL* ssl) { return SSL_read(ssl, buf + *got, want); });
    if (step.result > 0) {
      *got += static_cast<size_t>(step.result);
    } else {
      TANDEM_RETURN_IF_ERROR(TlsWait(c, step, deadline));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(const Conn& c, const uint8_t* buf, size_t n, absl::Time deadline) {
  if (c.ssl == nullptr) return PlainWriteAll(c.fd, buf, n, deadline);
  size_t done = 0;
  while (done < n) {
    // After WANT_WRITE the retry repeats the same arguments, as OpenSSL asks.
    const int want = static_cast<int>(std::min<size_t>(n - done, INT_MAX));
    const TlsStep step = TlsCall(c, [&](SSL* ssl) { return SSL_write(ssl, buf + done, want); });
    if (step.result > 0) {
      done += static_cast<size_t>(step.result);
    } else {
      TANDEM_RETURN_IF_ERROR(TlsWait(c, step, deadline));
    }
  }
  return absl::OkStatus();
}

// A session over `fd` in the given role; null when OpenSSL cannot make one.
SSL* NewSession(const TlsContext& tls, int fd, bool dialer) {
  SSL* ssl = SSL_new(tls.ctx());
  if (ssl == nullptr) return nullptr;
  SSL_set_fd(ssl, fd);
  if (dialer) {
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  return ssl;
}

// Both certificates checked (tls_context.h). PermissionDenied when either
// side refused the other's; Unavailable when the peer hung up (a plaintext
// peer, or one that refused us before a reason reached us).
absl::Status TlsHandshake(const Conn& c, absl::Time deadline) {
  if (c.ssl == nullptr) return absl::InternalError(absl::StrCat("TLS: ", DrainTlsErrors()));
  for (;;) {
    const TlsStep step = TlsCall(c, [](SSL* ssl) { return SSL_do_handshake(ssl); });
    if (step.result == 1) return absl::OkStatus();
    absl::Status s = TlsWait(c, step, deadline);
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(absl::StrCat(
          s.message(), " during the TLS handshake (does the peer run without TLS?)"));
    }
    TANDEM_RETURN_IF_ERROR(s);
  }
}

void CloseConn(Conn& c) {
  if (c.ssl != nullptr) SSL_free(c.ssl);
  if (c.fd >= 0) close(c.fd);
  c = Conn{};
}

// "ip:port" of the connection's other end, for messages.
std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[INET6_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(a->sin_port));
}

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

absl::StatusOr<Endpoint> Resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ":", port, ": ", std::string(gai_strerror(rc))));
  }
  Endpoint e;
  std::memcpy(&e.addr, res->ai_addr, res->ai_addrlen);
  e.len = res->ai_addrlen;
  e.family = res->ai_family;
  freeaddrinfo(res);
  return e;
}

// "host:port" or "[v6]:port".
absl::Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "': want host:port"));
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best effort
}

// One connect + handshake (TLS's, when `tls`, then the hello).
// FailedPrecondition when the peer refused us or TLS failed (final); any
// other error may be retried.
absl::StatusOr<Conn> DialOnce(const Endpoint& ep, const Hello& hello, const TlsContext* tls,
                              absl::Time deadline) {
  int fd = socket(ep.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  Conn conn{fd};
  auto fail = [&conn](absl::Status s) {
    CloseConn(conn);
    if (absl::IsPermissionDenied(s)) {
      return absl::FailedPreconditionError(
          absl::StrCat("failed the TLS handshake (", s.message(), ")"));
    }
    return s;
  };
  if (connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0) {
    if (errno != EINPROGRESS) return fail(absl::UnavailableError(ErrnoText(errno)));
    absl::Status s = PollFd(fd, POLLOUT, deadline);
    if (!s.ok()) return fail(s);
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return fail(absl::UnavailableError(ErrnoText(err)));
  }
  SetNoDelay(fd);
  if (tls != nullptr) {
    conn.ssl = NewSession(*tls, fd, /*dialer=*/true);
    if (absl::Status s = TlsHandshake(conn, deadline); !s.ok()) return fail(s);
  }
  Hello reply;
  size_t got = 0;
  // With TLS 1.3 the dialer's handshake ends before the acceptor has checked
  // its certificate: a refusal arrives here, as an alert (PermissionDenied).
  absl::Status s = WriteAll(conn, AsBytes(&hello), sizeof(hello), deadline);
  if (s.ok()) s = ReadSome(conn, AsBytes(&reply), sizeof(reply), &got, deadline);
  if (!s.ok()) return fail(s);
  if (reply.magic != kHelloMagic) return fail(absl::UnavailableError("not a tandem communicator"));
  if (reply.verdict != kAccepted) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("refused our handshake: ", VerdictText(reply.verdict), " (theirs: rank ",
                     reply.from, ", world ", reply.world_size, ", epoch ", reply.epoch, ")")));
  }
  if (reply.from != hello.to || reply.world_size != hello.world_size ||
      reply.epoch != hello.epoch) {
    return fail(absl::FailedPreconditionError(absl::StrCat("answered as rank ", reply.from, " of ",
                                                           reply.world_size, " epoch ", reply.epoch,
                                                           "; addresses are mixed up")));
  }
  return conn;
}

}  // namespace

struct TcpCommunicator::Link {
  int fd = -1;
  SSL* ssl = nullptr;
};

// One connection. The sender thread and Send share the queue under `mu`; the
// receive state belongs to the thread calling Recv for this peer. Waits are
// Awaits on conditions over the guarded state, re-evaluated whenever `mu` is
// released, so writers do not signal.
struct TcpCommunicator::Peer {
  Peer(int32_t r, int f, SSL* s) : rank(r), fd(f), ssl(s) {}
  // The connection as the I/O helpers take it.
  Conn conn() { return Conn{fd, ssl, ssl != nullptr ? &ssl_mu : nullptr}; }
  const int32_t rank;
  const int fd;  // closed by ~TcpCommunicator only, so it is never reused early
  SSL* const ssl;  // null: plaintext; freed by ~TcpCommunicator after the sender stops
  absl::Mutex ssl_mu;  // held around each SSL call on `ssl` (never while waiting)

  absl::Mutex mu;
  struct Frame {
    std::unique_ptr<uint8_t[]> bytes;  // header + payload, left uninitialized by new[]
    size_t size = 0;
  };
  std::deque<Frame> queue ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;  // sender holds a message
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Status failure ABSL_GUARDED_BY(mu);  // first failure, OK while healthy
  std::thread sender;

  FrameHeader header;  // Recv state: valid once header_got == sizeof(header)
  size_t header_got = 0;
  size_t payload_got = 0;
  std::vector<uint8_t> stash;  // payload_got bytes kept by a timed-out Recv
};

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Listen(int32_t rank,
                                                                         int32_t world_size,
                                                                         const std::string& host) {
  Options options;
  options.host = host;
  return Listen(rank, world_size, options);
}

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Listen(int32_t rank,
                                                                         int32_t world_size,
                                                                         const Options& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rank ", rank, " of world size ", world_size));
  }
  TANDEM_ASSIGN_OR_RETURN(Endpoint ep, Resolve(options.host, std::to_string(options.port), true));
  int fd = socket(ep.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("rank ", rank, ": cannot listen on ", options.host,
                                               ":", options.port, ": ", ErrnoText(err)));
  }
  uint16_t port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  std::string host = options.host.find(':') != std::string::npos
                         ? absl::StrCat("[", options.host, "]")
                         : options.host;
  return std::unique_ptr<TcpCommunicator>(
      new TcpCommunicator(rank, world_size, options, fd, absl::StrCat(host, ":", port)));
}

TcpCommunicator::TcpCommunicator(int32_t rank, int32_t world_size, const Options& options,
                                 int listen_fd, std::string address)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      listen_fd_(listen_fd),
      address_(std::move(address)) {}

TcpCommunicator::~TcpCommunicator() {
  // Let the senders flush what was queued, but never wait past the linger.
  const absl::Time linger_end = absl::Now() + options_.close_linger;
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    Peer* const peer = p.get();
    absl::MutexLock lock(&peer->mu);
    peer->stop = true;
    auto flushed = [peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mu) {
      return (peer->queue.empty() && !peer->writing) || !peer->failure.ok();
    };
    peer->mu.AwaitWithDeadline(absl::Condition(&flushed), linger_end);
  }
  // shutdown() wakes a sender stuck in poll() on a stalled peer.
  for (auto& p : peers_) {
    if (p != nullptr) shutdown(p->fd, SHUT_RDWR);
  }
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    p->sender.join();
    if (p->ssl != nullptr) SSL_free(p->ssl);
    close(p->fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
}

absl::Status TcpCommunicator::Connect(const std::vector<std::string>& peer_addresses,
                                      uint64_t group_epoch, absl::Duration timeout) {
  if (!peers_.empty() || listen_fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": already connected"));
  }
  if (peer_addresses.size() != static_cast<size_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": got ", peer_addresses.size(),
                                                   " addresses for world size ", world_size_));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<Link> links(world_size_);
  // Lower ranks accept, higher ranks dial. Dialing lower ranks first cannot
  // deadlock: rank 0 only accepts, and each rank's dials only wait on ranks
  // below it.
  absl::Status status;
  for (int32_t r = 0; r < rank_ && status.ok(); ++r) {
    absl::StatusOr<Link> link = Dial(r, peer_addresses[r], group_epoch, deadline);
    if (link.ok()) links[r] = *link;
    status = link.status();
  }
  if (status.ok()) status = AcceptAll(links, group_epoch, deadline);
  if (!status.ok()) {
    for (Link& link : links) {
      Conn conn{link.fd, link.ssl};
      CloseConn(conn);
    }
    return status;
  }
  close(listen_fd_);  // nobody else may join this group
  listen_fd_ = -1;
  peers_.resize(world_size_);
  for (int32_t r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    peers_[r] = std::make_unique<Peer>(r, links[r].fd, links[r].ssl);
    Peer* p = peers_[r].get();
    p->sender = std::thread([this, p] { SenderLoop(p); });
  }
  return absl::OkStatus();
}

absl::StatusOr<TcpCommunicator::Link> TcpCommunicator::Dial(int32_t peer,
                                                           const std::string& address,
                                                           uint64_t epoch, absl::Time deadline) {
  std::string host, port;
  TANDEM_RETURN_IF_ERROR(SplitAddress(address, &host, &port));
  const Hello hello{kHelloMagic, kVersion, rank_, peer, world_size_, kAccepted, epoch};
  absl::Duration backoff = absl::Milliseconds(5);
  absl::Status last;
  for (;;) {
    absl::StatusOr<Endpoint> ep = Resolve(host, port, false);
    absl::StatusOr<Conn> conn =
        ep.ok() ? DialOnce(*ep, hello, options_.tls.get(), deadline) : ep.status();
    if (conn.ok()) return Link{conn->fd, conn->ssl};
    last = conn.status();
    if (absl::IsFailedPrecondition(last)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank_, ": rank ", peer, " at ", address, " ", last.message()));
    }
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": could not connect to rank ",
                                                  peer, " at ", address,
                                                  " in time; last error: ", last.message()));
}

absl::Status TcpCommunicator::AcceptTls(Link& link, absl::Time deadline) {
  const std::string who = PeerName(link.fd);  // before a refused peer hangs up
  Conn conn{link.fd, NewSession(*options_.tls, link.fd, /*dialer=*/false)};
  link.ssl = conn.ssl;
  absl::Status s = TlsHandshake(conn, deadline);
  if (s.ok()) return s;
  return absl::PermissionDeniedError(
      absl::StrCat("TLS handshake with ", who, " failed: ", s.message()));
}

absl::Status TcpCommunicator::AcceptAll(std::vector<Link>& links, uint64_t epoch,
                                        absl::Time deadline) {
  int32_t missing = world_size_ - 1 - rank_;
  std::string refused;  // the last refusal, to explain a timeout
  while (missing > 0) {
    if (!PollFd(listen_fd_, POLLIN, deadline).ok()) {
      std::string who;
      for (int32_t r = rank_ + 1; r < world_size_; ++r) {
        if (links[r].fd < 0) absl::StrAppend(&who, who.empty() ? "" : ", ", r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, ": ranks {", who, "} did not connect in time",
                       refused.empty() ? "" : "; refused a peer: ", refused));
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return absl::UnavailableError(absl::StrCat("rank ", rank_, ": accept: ", ErrnoText(errno)));
    }
    Link link{fd};
    const absl::Time hello_deadline = std::min(deadline, absl::Now() + kHelloTimeout);
    if (options_.tls != nullptr) {
      absl::Status s = AcceptTls(link, hello_deadline);
      if (!s.ok()) {
        // The dialer learns it from its own handshake; we wait for the right peer.
        if (absl::IsPermissionDenied(s)) refused = std::string(s.message());
        Conn conn{link.fd, link.ssl};
        CloseConn(conn);
        continue;
      }
    }
    const Conn conn{link.fd, link.ssl};
    Hello h;
    size_t got = 0;
    if (!ReadSome(conn, AsBytes(&h), sizeof(h), &got, hello_deadline).ok() ||
        h.magic != kHelloMagic) {
      Conn c = conn;
      CloseConn(c);  // a stranger or a broken dial: no answer
      continue;
    }
    const Verdict verdict = Judge(h, rank_, world_size_, epoch, links);
    const Hello reply{kHelloMagic, kVersion, rank_, h.from, world_size_, verdict, epoch};
    const bool sent = WriteAll(conn, AsBytes(&reply), sizeof(reply), hello_deadline).ok();
    if (verdict != kAccepted) {
      refused = absl::StrCat("rank ", h.from, " epoch ", h.epoch, ": ", VerdictText(verdict));
    }
    if (verdict != kAccepted || !sent) {
      Conn c = conn;
      CloseConn(c);
      continue;
    }
    SetNoDelay(fd);
    links[h.from] = link;
    --missing;
  }
  return absl::OkStatus();
}

absl::StatusOr<TcpCommunicator::Peer*> TcpCommunicator::CheckPeer(int32_t peer, size_t bytes,
                                                                  bool null_data) {
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": bad peer ", peer));
  }
  if (bytes > options_.max_message_bytes || (null_data && bytes > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": bad message of ", bytes, " bytes for rank ", peer));
  }
  if (peers_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, ": not connected"));
  }
  return peers_[peer].get();
}

absl::Status TcpCommunicator::Send(int32_t peer, const void* data, size_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(Peer * p, CheckPeer(peer, bytes, data == nullptr));
  FrameHeader header;
  header.length = bytes;
  Peer::Frame frame{std::unique_ptr<uint8_t[]>(new uint8_t[sizeof(header) + bytes]),
                    sizeof(header) + bytes};
  std::memcpy(&frame.bytes[0], &header, sizeof(header));
  if (bytes > 0) std::memcpy(&frame.bytes[sizeof(header)], data, bytes);
  absl::MutexLock lock(&p->mu);
  if (!p->failure.ok()) return p->failure;
  p->queue.push_back(std::move(frame));
  return absl::OkStatus();
}

absl::Status TcpCommunicator::Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) {
  TANDEM_ASSIGN_OR_RETURN(Peer * p, CheckPeer(peer, bytes, data == nullptr));
  {
    absl::MutexLock lock(&p->mu);
    if (!p->failure.ok()) return p->failure;
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto what = [&] { return absl::StrCat("rank ", rank_, " receiving from rank ", peer, ": "); };
  if (p->header_got < sizeof(p->header)) {
    absl::Status s =
        ReadSome(p->conn(), AsBytes(&p->header), sizeof(p->header), &p->header_got, deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what(), "no message within ", absl::FormatDuration(timeout)));
    }
    if (!s.ok()) return Fail(p, absl::UnavailableError(absl::StrCat(what(), s.message())));
    if (p->header.magic != kFrameMagic) {
      return Fail(
          p, absl::DataLossError(absl::StrCat(what(), "bad frame header; stream out of sync")));
    }
    if (p->header.length > options_.max_message_bytes) {
      return Fail(p, absl::DataLossError(absl::StrCat(what(), "frame announces ", p->header.length,
                                                      " bytes, over the limit")));
    }
  }
  if (p->header.length != bytes) {
    return Fail(p, absl::DataLossError(absl::StrCat(what(), "message has ", p->header.length,
                                                    " bytes, expected ", bytes)));
  }
  uint8_t* out = static_cast<uint8_t*>(data);
  if (p->payload_got > 0) {  // resume what a timed-out Recv began
    std::memcpy(out, p->stash.data(), p->payload_got);
    std::vector<uint8_t>().swap(p->stash);
  }
  absl::Status s = ReadSome(p->conn(), out, bytes, &p->payload_got, deadline);
  if (absl::IsDeadlineExceeded(s)) {
    p->stash.assign(out, out + p->payload_got);
    return absl::DeadlineExceededError(absl::StrCat(what(), "got ", p->payload_got, " of ", bytes,
                                                    " bytes within ", absl::FormatDuration(timeout),
                                                    "; the rest comes with the next Recv"));
  }
  if (!s.ok()) return Fail(p, absl::UnavailableError(absl::StrCat(what(), s.message())));
  p->header_got = 0;
  p->payload_got = 0;
  return absl::OkStatus();
}

void TcpCommunicator::SenderLoop(Peer* p) {
  auto woken = [p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) {
    return p->stop || !p->queue.empty() || !p->failure.ok();
  };
  for (;;) {
    Peer::Frame frame;
    {
      absl::MutexLock lock(&p->mu);
      p->mu.Await(absl::Condition(&woken));
      if (!p->failure.ok() || p->queue.empty()) return;  // failed, or stopped and flushed
      frame = std::move(p->queue.front());
      p->queue.pop_front();
      p->writing = true;
    }
    absl::Status s = WriteAll(p->conn(), frame.bytes.get(), frame.size, absl::InfiniteFuture());
    {
      absl::MutexLock lock(&p->mu);
      p->writing = false;
    }
    if (!s.ok()) {
      (void)Fail(p, absl::UnavailableError(absl::StrCat("rank ", rank_, " sending to rank ",
                                                        p->rank, ": ", s.message())));
      return;
    }
  }
}

absl::Status TcpCommunicator::Fail(Peer* p, absl::Status status) {
  {
    absl::MutexLock lock(&p->mu);
    if (p->failure.ok()) {
      p->failure =
          absl::UnavailableError(absl::StrCat("connection between rank ", rank_, " and rank ",
                                              p->rank, " has failed: ", status.message()));
    }
    p->queue.clear();
  }
  shutdown(p->fd, SHUT_RDWR);  // the peer sees EOF instead of waiting for a timeout
  return status;
}

}  // namespace tandem::worker
