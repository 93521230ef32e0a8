// TcpCommunicator: the Communicator of CPU workers and CI, over one TCP
// connection per pair of ranks (full mesh; meant for world sizes up to ~16).
//
// Construction has two phases so that ranks can learn each other's addresses
// through the scheduler:
//
//   TANDEM_ASSIGN_OR_RETURN(auto comm, TcpCommunicator::Listen(rank, world));
//   register(comm->address());               // "host:port", via the scheduler
//   TANDEM_RETURN_IF_ERROR(comm->Connect(all_addresses, group_epoch, timeout));
//
// In Connect the lower rank of each pair accepts and the higher rank dials
// (retrying until the timeout, since peers start at different times). The
// dialer sends a hello {magic, version, from rank, to rank, world size, group
// epoch}; the acceptor answers with its own values and a verdict. A hello from
// another group (a different epoch or world size, an unexpected rank, garbage)
// is refused and the acceptor keeps waiting for the right peer; the refused
// dialer's Connect fails with FailedPrecondition.
//
// Wire format (integers little-endian), version 1:
//   hello and its reply (32 bytes): u32 magic "TDMH", u32 version, i32 from,
//       i32 to, i32 world_size, u32 verdict (0 = accepted), u64 group_epoch
//   each message: u32 magic "TDMF", u32 reserved (0), u64 length, then
//       `length` bytes.
//
// Send copies the message into a per-peer queue (unbounded: the pipeline's
// queue depth bounds it) and returns; one sender thread per peer writes the
// queue in order. Recv reads on the caller's thread with poll() and the
// timeout, straight into the caller's buffer.
//
// What a timed-out Recv leaves behind: the stream stays in sync. Whatever part
// of the message was already read is kept, and the next Recv from the same
// peer continues that message (it must ask for the same size). So a caller may
// Recv with short timeouts in a loop. Any other failure (peer closed, socket
// error, DataLoss, a failed write) marks the connection failed in both
// directions: it is shut down, so the peer sees EOF at once, queued messages
// are dropped, and every later Send or Recv for that peer returns Unavailable
// with the first reason. Since Send is asynchronous, a Send issued just as the
// peer dies may still return OK; the failure shows on the next call.
//
// TLS (Options::tls set, the worker's --tls-* files): each connection is TLS
// 1.3 with both certificates verified against the CA (tls_context.h) before
// the hello, and every byte above (hello, frames) travels inside it. A peer
// whose certificate the CA did not sign is refused: the acceptor drops it and
// keeps waiting (a later timeout names it), the dialer's Connect fails at once
// with FailedPrecondition naming TLS and the address. Without it nothing
// changes: the plaintext path has no TLS code but one null check per call.
// With TLS the sender thread and Recv share one OpenSSL session, which
// OpenSSL does not allow at once: a per-peer mutex serializes the
// non-blocking SSL calls, and the waits (poll) run outside it.
//
// Threading: Listen/Connect/the destructor on one thread; after Connect
// returns OK, Send may be called from any thread and Recv from one thread per
// peer at a time (the worker's compute thread calls both). The destructor must
// not run concurrently with Send or Recv.
#ifndef TANDEM_WORKER_COMM_TCP_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_TCP_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/tls_context.h"

namespace tandem::worker {

class TcpCommunicator : public Communicator {
 public:
  struct Options {
    // Interface to bind and the host part of address(): give one that the
    // other ranks can dial (not 0.0.0.0).
    std::string host = "127.0.0.1";
    uint16_t port = 0;  // 0: the kernel picks a free port
    // Largest message accepted by Send and Recv; a frame header announcing more
    // is treated as a corrupt stream (DataLoss).
    size_t max_message_bytes = size_t{1} << 30;
    // How long the destructor lets the sender threads flush queued messages
    // before it shuts the sockets down.
    absl::Duration close_linger = absl::Milliseconds(200);
    // TLS with mutual authentication on every connection; null: plaintext.
    // Every rank of a group must agree (a TLS rank and a plaintext one never
    // connect: the handshake fails and Connect times out naming the peer).
    std::shared_ptr<const TlsContext> tls;
  };

  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Listen(
      int32_t rank, int32_t world_size, const std::string& host = "127.0.0.1");
  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Listen(int32_t rank, int32_t world_size,
                                                                 const Options& options);

  // Flushes for at most close_linger, then shuts every socket down and joins
  // the sender threads; never blocks on a dead or stalled peer beyond that.
  ~TcpCommunicator() override;
  TcpCommunicator(const TcpCommunicator&) = delete;
  TcpCommunicator& operator=(const TcpCommunicator&) = delete;

  // "host:port" of the listening socket, for the other ranks' Connect.
  std::string address() const { return address_; }

  // Connects to every other rank. `peer_addresses[r]` is rank r's address()
  // (this rank's own entry is ignored); `group_epoch` identifies this group
  // and must be the same on every rank. Errors: InvalidArgument (bad
  // addresses), DeadlineExceeded (a peer did not come in time),
  // FailedPrecondition (a peer refused our handshake, or already connected).
  // After an error nothing stays connected and Connect may be tried again.
  absl::Status Connect(const std::vector<std::string>& peer_addresses, uint64_t group_epoch,
                       absl::Duration timeout);

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_size_; }
  // Host memory. Zero-byte messages are allowed.
  absl::Status Send(int32_t peer, const void* data, size_t bytes) override;
  absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) override;

 private:
  struct Peer;
  struct Link;  // a connected socket and, with TLS, its session

  TcpCommunicator(int32_t rank, int32_t world_size, const Options& options, int listen_fd,
                  std::string address);
  absl::StatusOr<Link> Dial(int32_t peer, const std::string& address, uint64_t epoch,
                            absl::Time deadline);
  absl::Status AcceptAll(std::vector<Link>& links, uint64_t epoch, absl::Time deadline);
  // The accepted connection's TLS handshake; PermissionDenied naming the
  // peer's address when its certificate is refused.
  absl::Status AcceptTls(Link& link, absl::Time deadline);
  absl::StatusOr<Peer*> CheckPeer(int32_t peer, size_t bytes, bool null_data);
  void SenderLoop(Peer* peer);
  // Records the first failure of `peer`'s connection and shuts it down.
  // Returns `status` for the caller to pass on.
  absl::Status Fail(Peer* peer, absl::Status status);

  const int32_t rank_;
  const int32_t world_size_;
  const Options options_;
  int listen_fd_;  // closed once Connect succeeds
  const std::string address_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for self until Connect
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_TCP_COMMUNICATOR_H_
