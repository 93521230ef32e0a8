// TcpCommunicator with TLS (Options::tls): groups on 127.0.0.1 with a CA and
// certificates that openssl makes at test time in a fresh directory (what a
// Kubernetes Secret would mount): messages both ways inside TLS, a peer whose
// certificate another CA signed refused on both sides by name, and a
// plaintext rank never joining a TLS group.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/comm/tls_context.h"

namespace tandem::worker {
namespace {

using Comms = std::vector<std::unique_ptr<TcpCommunicator>>;
constexpr absl::Duration kLong = absl::Seconds(10);

// A CA ("ca"), a second one ("other"), and leaves signed by each, made once
// for the test program. EC P-256 keys: quick to make.
class Pki {
 public:
  static const Pki& Get() {
    static const Pki* pki = new Pki();
    return *pki;
  }
  std::string cert(const std::string& name) const { return dir_ + "/" + name + ".crt"; }
  std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }
  bool ok() const { return ok_; }

  std::shared_ptr<const TlsContext> Context(const std::string& leaf, const std::string& ca) const {
    auto ctx = TlsContext::Load(cert(leaf), key(leaf), cert(ca));
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    return ctx.ok() ? *ctx : nullptr;
  }

 private:
  Pki() {
    char tmpl[] = "/tmp/tandem_comm_tls_XXXXXX";
    dir_ = mkdtemp(tmpl);
    ok_ = MakeCa("ca") && MakeCa("other") && MakeLeaf("worker-a", "ca") &&
          MakeLeaf("worker-b", "ca") && MakeLeaf("rogue", "other");
  }
  bool Run(const std::string& args) const {
    const std::string cmd = absl::StrCat("cd ", dir_, " && openssl ", args, " >openssl.log 2>&1");
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd;
    return rc == 0;
  }
  bool MakeCa(const std::string& name) const {
    return Run(absl::StrCat(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
        ".key -out ", name, ".crt -days 2 -subj /CN=", name));
  }
  bool MakeLeaf(const std::string& name, const std::string& ca) const {
    return Run(absl::StrCat("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
                            name, ".key -out ", name, ".csr -subj /CN=", name)) &&
           Run(absl::StrCat("x509 -req -in ", name, ".csr -CA ", ca, ".crt -CAkey ", ca,
                            ".key -CAcreateserial -out ", name, ".crt -days 2"));
  }
  std::string dir_;
  bool ok_ = false;
};

void RunRanks(int32_t world, const std::function<void(int32_t)>& fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Rank r listens with tls[r] (null: plaintext).
Comms ListenAll(const std::vector<std::shared_ptr<const TlsContext>>& tls) {
  Comms comms;
  for (size_t r = 0; r < tls.size(); ++r) {
    TcpCommunicator::Options options;
    options.tls = tls[r];
    auto comm = TcpCommunicator::Listen(static_cast<int32_t>(r), static_cast<int32_t>(tls.size()),
                                        options);
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

// Connects every rank; returns each rank's status.
std::vector<absl::Status> ConnectAll(Comms& comms, absl::Duration timeout) {
  const auto addresses = Addresses(comms);
  std::vector<absl::Status> status(comms.size());
  RunRanks(static_cast<int32_t>(comms.size()),
           [&](int32_t r) { status[r] = comms[r]->Connect(addresses, 7, timeout); });
  return status;
}

std::vector<uint8_t> Pattern(size_t bytes, int seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t j = 0; j < bytes; ++j) v[j] = static_cast<uint8_t>(seed * 31 + j * 7);
  return v;
}

class TcpTlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Pki::Get().ok()) << "openssl could not make the certificates"; }
  const Pki& pki = Pki::Get();
};

// Three ranks, every pair both ways at once (the sender thread and Recv share
// each session), sizes from empty to several TLS records, in order.
TEST_F(TcpTlsTest, GroupTalksBothWaysInsideTls) {
  const auto a = pki.Context("worker-a", "ca"), b = pki.Context("worker-b", "ca");
  Comms comms = ListenAll({a, b, a});
  for (const absl::Status& s : ConnectAll(comms, kLong)) ASSERT_TRUE(s.ok()) << s;
  constexpr int kMessages = 60;
  auto size_of = [](int i) { return i % 7 == 0 ? 0 : static_cast<size_t>(i * 9973 % 70000); };
  RunRanks(3, [&](int32_t r) {
    for (int i = 0; i < kMessages; ++i) {
      for (int32_t p = 0; p < 3; ++p) {
        if (p == r) continue;
        auto msg = Pattern(size_of(i), r * 100 + p * 10 + i);
        ASSERT_TRUE(comms[r]->Send(p, msg.data(), msg.size()).ok());
      }
      for (int32_t p = 0; p < 3; ++p) {
        if (p == r) continue;
        std::vector<uint8_t> got(size_of(i));
        absl::Status s = comms[r]->Recv(p, got.data(), got.size(), kLong);
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_EQ(got, Pattern(size_of(i), p * 100 + r * 10 + i)) << "rank " << r << " from " << p;
      }
    }
  });
}

// A timed-out Recv inside TLS leaves the stream in sync, as in plaintext.
TEST_F(TcpTlsTest, RecvTimeoutKeepsTheStreamInSync) {
  Comms comms = ListenAll({pki.Context("worker-a", "ca"), pki.Context("worker-b", "ca")});
  for (const absl::Status& s : ConnectAll(comms, kLong)) ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> got(5000);
  EXPECT_TRUE(absl::IsDeadlineExceeded(comms[1]->Recv(0, got.data(), got.size(), absl::Milliseconds(20))));
  auto msg = Pattern(got.size(), 3);
  ASSERT_TRUE(comms[0]->Send(1, msg.data(), msg.size()).ok());
  ASSERT_TRUE(comms[1]->Recv(0, got.data(), got.size(), kLong).ok());
  EXPECT_EQ(got, msg);
  comms[0].reset();  // a closed peer is Unavailable, not a hang
  EXPECT_TRUE(absl::IsUnavailable(comms[1]->Recv(0, got.data(), got.size(), kLong)));
}

// Rank `rogue` holds a certificate that the group's CA did not sign. The
// dialer of each pair fails at once naming TLS and the address it dialed; the
// acceptor refuses the handshake, keeps waiting and names the refused peer's
// address when it gives up.
void ExpectRogueRefused(const Pki& pki, int32_t rogue) {
  std::vector<std::shared_ptr<const TlsContext>> tls = {pki.Context("worker-a", "ca"),
                                                         pki.Context("worker-b", "ca")};
  tls[rogue] = pki.Context("rogue", "other");
  Comms comms = ListenAll(tls);
  const std::string acceptor_address = comms[0]->address();
  const absl::Time start = absl::Now();
  const std::vector<absl::Status> status = ConnectAll(comms, absl::Seconds(1));
  // Rank 1 dials rank 0.
  EXPECT_TRUE(absl::IsFailedPrecondition(status[1])) << status[1];
  EXPECT_NE(status[1].message().find("TLS"), std::string::npos) << status[1];
  EXPECT_NE(status[1].message().find(acceptor_address), std::string::npos) << status[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(status[0])) << status[0];
  EXPECT_NE(status[0].message().find("refused a peer: TLS handshake with 127.0.0.1:"), std::string::npos)
      << status[0];
  std::cout << "[ refused  ] dialer: " << status[1].message() << "\n[ refused  ] acceptor: "
            << status[0].message() << "\n";
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

TEST_F(TcpTlsTest, DialerFromAnotherCaIsRefused) { ExpectRogueRefused(pki, 1); }
TEST_F(TcpTlsTest, AcceptorFromAnotherCaIsRefused) { ExpectRogueRefused(pki, 0); }

// A rank without TLS never joins a TLS group, whichever side it is on; each
// Connect ends at its timeout and says why.
TEST_F(TcpTlsTest, PlaintextAndTlsRanksNeverConnect) {
  for (int32_t plain : {0, 1}) {
    std::vector<std::shared_ptr<const TlsContext>> tls = {pki.Context("worker-a", "ca"),
                                                           pki.Context("worker-b", "ca")};
    tls[plain] = nullptr;
    Comms comms = ListenAll(tls);
    const std::vector<absl::Status> status = ConnectAll(comms, absl::Seconds(1));
    for (const absl::Status& s : status) EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    // The TLS acceptor names the failed handshake; a TLS dialer says the
    // peer may run without TLS.
    if (plain == 1) {
      EXPECT_NE(status[0].message().find("TLS handshake with"), std::string::npos) << status[0];
    } else {
      EXPECT_NE(status[1].message().find("TLS"), std::string::npos) << status[1];
    }
  }
}

TEST_F(TcpTlsTest, UnusableFilesAreNamed) {
  auto missing = TlsContext::Load("/nonexistent.crt", pki.key("worker-a"), pki.cert("ca"));
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(missing.status().message().find("--tls-cert"), std::string::npos) << missing.status();
  auto mismatched = TlsContext::Load(pki.cert("worker-a"), pki.key("worker-b"), pki.cert("ca"));
  EXPECT_NE(mismatched.status().message().find("--tls-key"), std::string::npos) << mismatched.status();
}

// Not asserted: a figure for the log (wall time on a shared machine).
TEST_F(TcpTlsTest, LoopbackThroughput) {
  Comms comms = ListenAll({pki.Context("worker-a", "ca"), pki.Context("worker-b", "ca")});
  for (const absl::Status& s : ConnectAll(comms, kLong)) ASSERT_TRUE(s.ok()) << s;
  constexpr int kMessages = 200;
  constexpr size_t kBytes = size_t{1} << 20;
  std::vector<uint8_t> out(kBytes, 7), in(kBytes);
  const absl::Time start = absl::Now();
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(comms[0]->Send(1, out.data(), kBytes).ok());
  });
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(comms[1]->Recv(0, in.data(), kBytes, kLong).ok());
  sender.join();
  std::cout << "[ figure   ] TLS loopback, 1 MiB messages: "
            << kMessages / absl::ToDoubleSeconds(absl::Now() - start) << " MiB/s\n";
}

}  // namespace
}  // namespace tandem::worker
