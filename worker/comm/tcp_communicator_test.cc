// Tests for TcpCommunicator: whole groups of ranks in one process on
// 127.0.0.1 (port 0 only), one thread per rank, plus hand-written raw peers
// that speak the documented wire format badly.
#include "worker/comm/tcp_communicator.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

using Comms = std::vector<std::unique_ptr<TcpCommunicator>>;
constexpr absl::Duration kLong = absl::Seconds(5);

// Runs fn(rank) on one thread per rank and waits for all of them.
void RunRanks(int32_t world, const std::function<void(int32_t)>& fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

Comms ListenAll(int32_t world) {
  Comms comms;
  for (int32_t r = 0; r < world; ++r) {
    auto comm = TcpCommunicator::Listen(r, world);
    EXPECT_TRUE(comm.ok()) << comm.status();
    comms.push_back(std::move(*comm));
  }
  return comms;
}

std::vector<std::string> Addresses(const Comms& comms) {
  std::vector<std::string> out;
  for (const auto& c : comms) out.push_back(c->address());
  return out;
}

Comms ConnectedGroup(int32_t world, uint64_t epoch = 1) {
  Comms comms = ListenAll(world);
  const auto addresses = Addresses(comms);
  RunRanks(world, [&](int32_t r) { ASSERT_TRUE(comms[r]->Connect(addresses, epoch, kLong).ok()); });
  return comms;
}

// How many threads of this process are inside poll() or ppoll() now: the
// syscall number that /proc/self/task/<tid>/syscall shows while a thread is
// in a system call (Linux). Every blocking step of TcpCommunicator is a
// poll(), and an idle sender thread waits on a futex instead, so a test can
// wait for a Recv or a stalled sender to be really blocked before it acts.
int ThreadsInPoll() {
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  while (dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream file(std::string("/proc/self/task/") + entry->d_name + "/syscall");
    long number = -1;
    if (file >> number && (number == SYS_poll || number == SYS_ppoll)) ++count;
  }
  closedir(tasks);
  return count;
}

// Polls (every millisecond, for at most 10 s) until exactly `n` threads wait
// in poll().
bool WaitForThreadsInPoll(int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ThreadsInPoll() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

std::vector<uint8_t> Pattern(size_t bytes, int32_t from, int32_t to, int64_t index) {
  std::vector<uint8_t> v(bytes);
  for (size_t j = 0; j < bytes; ++j)
    v[j] = static_cast<uint8_t>(from * 31 + to * 7 + index * 13 + j);
  return v;
}

size_t SizeOf(int64_t i) {
  if (i == 17 || i == 111) return (size_t{3} << 20) + 13;  // a few MB
  if (i % 10 == 0) return 0;
  return static_cast<size_t>(i * 7919 % 20000);
}

class TcpGroupTest : public ::testing::TestWithParam<int32_t> {};

// Every rank talks to every other rank at once; each stream stays in order.
TEST_P(TcpGroupTest, OrderedDeliveryBothWaysAtOnce) {
  const int32_t world = GetParam();
  Comms comms = ConnectedGroup(world);
  constexpr int64_t kMessages = 150;
  RunRanks(world, [&](int32_t r) {
    for (int64_t i = 0; i < kMessages; ++i) {
      for (int32_t p = 0; p < world; ++p) {
        if (p == r) continue;
        auto msg = Pattern(SizeOf(i), r, p, i);
        ASSERT_TRUE(comms[r]->Send(p, msg.data(), msg.size()).ok());
      }
      for (int32_t p = 0; p < world; ++p) {
        if (p == r) continue;
        std::vector<uint8_t> got(SizeOf(i));
        absl::Status s = comms[r]->Recv(p, got.data(), got.size(), kLong);
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_EQ(got, Pattern(SizeOf(i), p, r, i)) << "message " << i << " from " << p;
      }
    }
  });
}

// The pipeline's pattern: r -> r+1, last -> 0, two steps in flight.
TEST_P(TcpGroupTest, RingOfThousandSteps) {
  const int32_t world = GetParam();
  Comms comms = ConnectedGroup(world);
  constexpr int64_t kSteps = 1000;
  constexpr int64_t kInFlight = 2;
  RunRanks(world, [&](int32_t r) {
    TcpCommunicator& c = *comms[r];
    const int32_t next = (r + 1) % world;
    const int32_t prev = (r + world - 1) % world;
    int64_t msg[8] = {};
    if (r == 0) {
      for (int64_t s = 0; s < kSteps + kInFlight; ++s) {
        if (s >= kInFlight) {
          ASSERT_TRUE(c.Recv(prev, msg, sizeof(msg), kLong).ok());
          ASSERT_EQ(msg[0], s - kInFlight);
          ASSERT_EQ(msg[1], world - 1);  // one hop per stage
        }
        if (s < kSteps) {
          int64_t out[8] = {s, 0};
          ASSERT_TRUE(c.Send(next, out, sizeof(out)).ok());
        }
      }
    } else {
      for (int64_t s = 0; s < kSteps; ++s) {
        ASSERT_TRUE(c.Recv(prev, msg, sizeof(msg), kLong).ok());
        ASSERT_EQ(msg[0], s);
        ++msg[1];
        ASSERT_TRUE(c.Send(next, msg, sizeof(msg)).ok());
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, TcpGroupTest, ::testing::Values(2, 3, 4));

TEST(TcpCommunicatorTest, RecvTimeoutKeepsTheStreamInSync) {
  Comms comms = ConnectedGroup(2);
  char buf[4];
  absl::Time start = absl::Now();
  absl::Status s = comms[0]->Recv(1, buf, sizeof(buf), absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(comms[1]->Send(0, "abcd", 4).ok());
  ASSERT_TRUE(comms[0]->Recv(1, buf, sizeof(buf), kLong).ok());
  EXPECT_EQ(std::string(buf, 4), "abcd");
}

// Short timeouts in a loop may cut a big message; the rest comes later.
TEST(TcpCommunicatorTest, RecvResumesAPartlyReadMessage) {
  Comms comms = ConnectedGroup(2);
  auto big = Pattern(size_t{16} << 20, 1, 0, 5);
  ASSERT_TRUE(comms[1]->Send(0, big.data(), big.size()).ok());
  ASSERT_TRUE(comms[1]->Send(0, "tail", 4).ok());
  std::vector<uint8_t> got(big.size());
  int timeouts = 0;
  absl::Status s;
  while (absl::IsDeadlineExceeded(
      s = comms[0]->Recv(1, got.data(), got.size(), absl::Microseconds(300)))) {
    ++timeouts;
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got == big) << "after " << timeouts << " timeouts";
  std::cout << "[ info     ] 16 MiB message read across " << timeouts << " timed-out Recvs\n";
  char tail[4];
  ASSERT_TRUE(comms[0]->Recv(1, tail, 4, kLong).ok());
  EXPECT_EQ(std::string(tail, 4), "tail");
}

// A Recv already waiting in poll() is woken by the peer's destruction.
TEST(TcpCommunicatorTest, DestroyedPeerIsUnavailableNotAHang) {
  Comms comms = ConnectedGroup(2);
  char buf[8];
  absl::Status s;
  std::thread receiver([&] { s = comms[0]->Recv(1, buf, sizeof(buf), kLong); });
  // Destroying the peer before the Recv waits would prove nothing about a hang.
  EXPECT_TRUE(WaitForThreadsInPoll(1)) << "the Recv never waited in poll()";
  const absl::Time start = absl::Now();
  comms[1].reset();
  receiver.join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  s = comms[0]->Send(1, buf, sizeof(buf));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("rank 1"), absl::string_view::npos) << s;
}

// A sender stuck on a peer that never reads must not hold up destruction.
TEST(TcpCommunicatorTest, DestructionIsPromptWithASendBlocked) {
  Comms comms = ConnectedGroup(2);
  std::vector<uint8_t> big(size_t{64} << 20);
  ASSERT_TRUE(comms[0]->Send(1, big.data(), big.size()).ok());
  // The sender has filled the socket once it waits in poll() for room.
  EXPECT_TRUE(WaitForThreadsInPoll(1)) << "the sender never blocked";
  absl::Time start = absl::Now();
  comms[0].reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The reader sees the cut: a short message, then EOF.
  absl::Status s = comms[1]->Recv(0, big.data(), big.size(), kLong);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST(TcpCommunicatorTest, WrongSizeIsDataLossAndBreaksTheConnection) {
  Comms comms = ConnectedGroup(2);
  std::vector<uint8_t> msg(100);
  ASSERT_TRUE(comms[1]->Send(0, msg.data(), msg.size()).ok());
  std::vector<uint8_t> got(200);
  absl::Status s = comms[0]->Recv(1, got.data(), got.size(), kLong);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(absl::IsUnavailable(comms[0]->Recv(1, got.data(), 100, kLong)));
  // The peer learns at once rather than at its timeout.
  absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsUnavailable(comms[1]->Recv(0, got.data(), 1, kLong)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(TcpCommunicatorTest, StalePeerFromAnotherEpochIsRefused) {
  Comms comms = ListenAll(2);
  auto stale = TcpCommunicator::Listen(1, 2);
  ASSERT_TRUE(stale.ok());
  const auto addresses = Addresses(comms);
  absl::Status rank0;
  std::thread t([&] { rank0 = comms[0]->Connect(addresses, /*group_epoch=*/8, kLong); });
  absl::Status s = (*stale)->Connect(addresses, /*group_epoch=*/7, kLong);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("epoch"), absl::string_view::npos) << s;
  // Rank 0 kept waiting and takes the right peer.
  EXPECT_TRUE(comms[1]->Connect(addresses, 8, kLong).ok());
  t.join();
  ASSERT_TRUE(rank0.ok()) << rank0;
  ASSERT_TRUE(comms[1]->Send(0, "ok", 2).ok());
  char buf[2];
  EXPECT_TRUE(comms[0]->Recv(1, buf, 2, kLong).ok());
}

TEST(TcpCommunicatorTest, ConnectTimesOutCleanlyWhenAPeerNeverComes) {
  Comms comms = ListenAll(2);
  auto addresses = Addresses(comms);
  absl::Time start = absl::Now();
  absl::Status s = comms[0]->Connect(addresses, 1, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The dialing side: nobody listens at rank 0's address any more.
  comms[0].reset();
  start = absl::Now();
  s = comms[1]->Connect(addresses, 1, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(TcpCommunicatorTest, BadArguments) {
  Comms comms = ListenAll(2);
  char buf[1];
  EXPECT_TRUE(absl::IsFailedPrecondition(comms[0]->Send(1, buf, 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(comms[0]->Send(0, buf, 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(comms[0]->Recv(2, buf, 1, kLong)));
  EXPECT_TRUE(absl::IsInvalidArgument(comms[0]->Connect({"x:1"}, 1, kLong)));
  EXPECT_FALSE(TcpCommunicator::Listen(2, 2).ok());
}

// A hand-written peer that dials `address` over raw TCP.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  }
  ~RawPeer() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  void Write(const std::vector<uint8_t>& bytes) {
    EXPECT_EQ(write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // The hello of the wire format in tcp_communicator.h.
  void Hello(int32_t from, int32_t to, int32_t world, uint64_t epoch) {
    std::vector<uint8_t> b;
    for (uint64_t v : {uint64_t{0x484d4454}, uint64_t{1}, uint64_t(from), uint64_t(to),
                       uint64_t(world), uint64_t{0}}) {
      Le(&b, v, 4);
    }
    Le(&b, epoch, 8);
    Write(b);
    uint8_t reply[32];
    ASSERT_EQ(recv(fd_, reply, sizeof(reply), MSG_WAITALL), 32);
    ASSERT_EQ(reply[20], 0) << "refused";
  }
  void Frame(uint64_t length, size_t payload) {
    std::vector<uint8_t> b;
    Le(&b, 0x464d4454, 4);
    Le(&b, 0, 4);
    Le(&b, length, 8);
    b.resize(b.size() + payload);
    Write(b);
  }
  static void Le(std::vector<uint8_t>* b, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }

 private:
  int fd_;
};

TEST(TcpCommunicatorTest, GarbageHandshakeIsIgnored) {
  Comms comms = ListenAll(2);
  const auto addresses = Addresses(comms);
  RawPeer stranger(addresses[0]);
  stranger.Write(std::vector<uint8_t>(32, 0xab));
  RunRanks(2, [&](int32_t r) { EXPECT_TRUE(comms[r]->Connect(addresses, 3, kLong).ok()); });
}

TEST(TcpCommunicatorTest, BadFramesAreErrorsNotCrashes) {
  for (bool absurd : {true, false}) {
    Comms comms = ListenAll(2);
    const auto addresses = Addresses(comms);
    absl::Status connected;
    std::thread t([&] { connected = comms[0]->Connect(addresses, 4, kLong); });
    RawPeer peer(addresses[0]);
    peer.Hello(1, 0, 2, 4);
    t.join();
    ASSERT_TRUE(connected.ok()) << connected;
    std::vector<uint8_t> buf(100);
    if (absurd) {
      peer.Frame(uint64_t{1} << 40, 0);
      absl::Status s = comms[0]->Recv(1, buf.data(), buf.size(), kLong);
      EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    } else {
      peer.Frame(100, 10);
      peer.Close();  // EOF mid-message
      absl::Status s = comms[0]->Recv(1, buf.data(), buf.size(), kLong);
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    }
  }
}

// Not asserted: a figure for the log.
TEST(TcpCommunicatorTest, LoopbackThroughput) {
  Comms comms = ConnectedGroup(2);
  constexpr int kMessages = 200;
  constexpr size_t kBytes = size_t{1} << 20;
  std::vector<uint8_t> out(kBytes, 7), in(kBytes);
  absl::Time start = absl::Now();
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(comms[0]->Send(1, out.data(), kBytes).ok());
  });
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(comms[1]->Recv(0, in.data(), kBytes, kLong).ok());
  sender.join();
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::cout << "[ figure   ] TCP loopback, 1 MiB messages: "
            << kMessages * (kBytes / 1048576.0) / seconds << " MiB/s\n";
}

}  // namespace
}  // namespace tandem::worker
