// WorkerServer's output thread, on the CPU backend wrapped so that the
// device-to-host copies complete only when the test says so: the compute
// thread runs step N+1 while step N's output waits; results leave in step
// order; an error on the output thread fails that step toward the scheduler
// as before, and the epoch's later steps are ignored until the next
// ConfigureGroup.
#include "worker/server/worker_server.h"

#include <algorithm>
#include <deque>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/gguf/model_file.h"
#include "common/gguf/random_llama.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/server/backend_factory.h"
#include "worker/testing/forwarding_backend.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

// Opens (or fails) every copy made so far and later; until then the copies'
// events are not done.
class Gate {
 public:
  void Open(absl::Status result = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    open_ = true;
    result_ = std::move(result);
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
    return result_;
  }
  bool IsOpen() {
    absl::MutexLock lock(&mu_);
    return open_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

class GatedEvent : public Event {
 public:
  explicit GatedEvent(Gate* gate) : gate_(gate) {}
  absl::Status Wait() override { return gate_->Wait(); }
  bool Done() override { return gate_->IsOpen(); }

 private:
  Gate* const gate_;
};

// The CPU backend, whose downloads complete when the gate opens, counting
// the forward passes (one embedding each) and the downloads.
class GatedBackend : public testing::ForwardingBackend {
 public:
  explicit GatedBackend(Gate* gate) : ForwardingBackend(std::make_unique<CpuBackend>(1)), gate_(gate) {}
  absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) override {
    auto copied = inner().DownloadAsync(src, dst, bytes);  // the CPU copies at once
    if (!copied.ok()) return copied.status();
    absl::MutexLock lock(&mu_);
    ++downloads_;
    return std::unique_ptr<Event>(new GatedEvent(gate_));
  }
  absl::Status Embedding(const EmbeddingParams& p) override {
    {
      absl::MutexLock lock(&mu_);
      ++forwards_;
    }
    return inner().Embedding(p);
  }

  // Waits until `forwards` forward passes and `downloads` downloads were
  // enqueued; false after 10 s.
  bool AwaitProgress(int forwards, int downloads) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return forwards_ >= forwards && downloads_ >= downloads;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

 private:
  Gate* const gate_;
  absl::Mutex mu_;
  int forwards_ ABSL_GUARDED_BY(mu_) = 0;
  int downloads_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records what the worker sends, in order (stats aside).
class RecordingLink : public SchedulerLink {
 public:
  void Send(const v1::WorkerMessage& message) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (message.has_stats()) return;
    absl::MutexLock lock(&mu_);
    messages_.push_back(message);
  }
  // The messages of `kind` once there are at least `n`; what there is after 10 s.
  std::vector<v1::WorkerMessage> Await(v1::WorkerMessage::KindCase kind, size_t n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Count(kind) >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    std::vector<v1::WorkerMessage> out;
    for (const auto& m : messages_) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }
  size_t CountOf(v1::WorkerMessage::KindCase kind) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return Count(kind);
  }

 private:
  size_t Count(v1::WorkerMessage::KindCase kind) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t n = 0;
    for (const auto& m : messages_) n += m.kind_case() == kind ? 1 : 0;
    return n;
  }
  absl::Mutex mu_;
  std::vector<v1::WorkerMessage> messages_ ABSL_GUARDED_BY(mu_);
};

const std::string& TinyModel() {
  static const std::string path = [] {
    gguf::RandomLlamaOptions options;
    options.weight_scale = 0.2;
    static const TemporaryFile file = *TemporaryFile::Create("tandem_worker_server", *gguf::MakeRandomLlama(options));
    return file.path();
  }();
  return path;
}

v1::SchedulerMessage Configure(int64_t epoch) {
  v1::SchedulerMessage m;
  m.mutable_configure()->set_epoch(epoch);
  m.mutable_configure()->set_num_kv_blocks(8);
  m.mutable_configure()->set_block_size(16);
  return m;
}

v1::SchedulerMessage Connect(int64_t epoch) {
  v1::SchedulerMessage m;
  m.mutable_connect()->set_epoch(epoch);
  return m;
}

// Step 1: request `id`'s 5-token prompt in block 3, greedy. Step k > 1: its
// next token, a placeholder the worker fills in from its own sample.
v1::SchedulerMessage Execute(uint64_t seq, RequestId id = 7) {
  v1::SchedulerMessage m;
  v1::SchedulerOutput* step = m.mutable_execute();
  step->set_step_seq(seq);
  step->add_scheduled_request_ids(id);
  if (seq == 1) {
    v1::NewRequest* r = step->add_new_requests();
    r->set_request_id(id);
    for (int t : {10, 20, 30, 40, 50}) r->add_prompt_token_ids(t);
    r->mutable_sampling()->set_temperature(0.0f);
    r->add_block_ids(3);
    step->add_num_scheduled_tokens(5);
  } else {
    v1::CachedRequests* c = step->mutable_cached_requests();
    c->add_request_ids(id);
    c->add_resumed(false);
    c->add_num_computed_tokens(static_cast<int32_t>(5 + seq - 2));
    c->add_num_new_block_ids(0);
    step->add_num_scheduled_tokens(1);
  }
  return m;
}

v1::SchedulerMessage Sample(uint64_t seq) {
  v1::SchedulerMessage m;
  m.mutable_sample()->set_step_seq(seq);
  return m;
}

// The sampled tokens of a plain run of the same steps, waiting for each
// copy on the caller's thread.
std::vector<TokenId> Reference(int steps) {
  auto file = gguf::OpenModelFile(TinyModel());
  CpuBackend cpu(1);
  auto config = gguf::ReadLlamaConfig(**file);
  auto model = LlamaModel::Load(**file, *config, &cpu, {});
  EXPECT_TRUE((*model)->AllocateKvCache(8, 16).ok());
  ModelRunner runner(&cpu, model->get(), ModelRunnerOptions{16, 1});
  std::vector<TokenId> tokens;
  for (int k = 1; k <= steps; ++k) {
    EXPECT_TRUE(runner.Execute(Execute(k).execute()).ok());
    EXPECT_TRUE(runner.Sample(Sample(k).sample()).ok());
    auto out = runner.CollectOutput(k);
    EXPECT_TRUE(out.ok()) << out.status();
    tokens.push_back(out->sampled_token_ids(0));
  }
  return tokens;
}

// A worker on the tiny model with a small KV cache.
WorkerOptions TinyOptions() {
  WorkerOptions options;
  options.model_path = TinyModel();
  options.kv_cache_bytes = int64_t{4} << 20;
  return options;
}

class WorkerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = std::make_unique<GatedBackend>(&gate_);
    backend_ = backend.get();
    auto server = WorkerServer::Create(TinyOptions(), std::move(backend));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    run_ = std::thread([this] { run_status_ = server_->Run(&link_); });
    Form(1);
  }
  void TearDown() override {
    gate_.Open();
    if (server_ != nullptr) server_->OnDisconnected("the test ends");
    if (run_.joinable()) run_.join();
    EXPECT_THAT(std::string(run_status_.message()), HasSubstr("the test ends"));
  }
  void Form(int64_t epoch) {
    server_->OnMessage(Configure(epoch));
    server_->OnMessage(Connect(epoch));
    ASSERT_EQ(link_.Await(v1::WorkerMessage::kReady, epoch).size(), static_cast<size_t>(epoch));
  }
  Gate gate_;
  GatedBackend* backend_ = nullptr;
  RecordingLink link_;
  std::unique_ptr<WorkerServer> server_;
  std::thread run_;
  absl::Status run_status_;
};

TEST_F(WorkerServerTest, TheComputeThreadRunsTheNextStepWhileAnOutputWaits) {
  for (uint64_t k = 1; k <= 3; ++k) {
    server_->OnMessage(Execute(k));
    server_->OnMessage(Sample(k));
  }
  // Three forward passes and three copies enqueued while step 1's copy is
  // still in flight: the compute thread never waited for it.
  ASSERT_TRUE(backend_->AwaitProgress(3, 3));
  EXPECT_EQ(link_.CountOf(v1::WorkerMessage::kResult), 0u);
  gate_.Open();
  const auto results = link_.Await(v1::WorkerMessage::kResult, 3);
  ASSERT_EQ(results.size(), 3u);
  const std::vector<TokenId> expected = Reference(3);
  for (uint64_t k = 1; k <= 3; ++k) {
    const v1::StepResult& r = results[k - 1].result();
    EXPECT_EQ(r.epoch(), 1);
    EXPECT_EQ(r.output().step_seq(), k);  // in step order
    ASSERT_EQ(r.output().sampled_token_ids_size(), 1);
    EXPECT_EQ(r.output().sampled_token_ids(0), expected[k - 1]) << "step " << k;
  }
  EXPECT_EQ(link_.CountOf(v1::WorkerMessage::kError), 0u);
}

TEST_F(WorkerServerTest, AFailedCopyFailsItsStepOnceAndTheEpochStopsUntilTheNextConfigure) {
  server_->OnMessage(Execute(1));
  server_->OnMessage(Sample(1));
  server_->OnMessage(Execute(2));
  server_->OnMessage(Sample(2));
  ASSERT_TRUE(backend_->AwaitProgress(2, 2));
  gate_.Open(absl::InternalError("the copy engine fell over"));
  const auto errors = link_.Await(v1::WorkerMessage::kError, 1);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].error().epoch(), 1);
  EXPECT_EQ(errors[0].error().step_seq(), 1u);
  EXPECT_THAT(errors[0].error().message(), HasSubstr("the copy engine fell over"));
  // Later steps of the epoch are ignored, not answered.
  server_->OnMessage(Execute(3));
  server_->OnMessage(Sample(3));
  // A new epoch works again.
  gate_.Close();
  gate_.Open();
  Form(2);
  server_->OnMessage(Execute(1, 8));
  server_->OnMessage(Sample(1));
  const auto results = link_.Await(v1::WorkerMessage::kResult, 1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].result().epoch(), 2);
  EXPECT_EQ(results[0].result().output().step_seq(), 1u);
  EXPECT_EQ(link_.CountOf(v1::WorkerMessage::kError), 1u);
}

TEST_F(WorkerServerTest, AComputeErrorFollowsTheOutputsBeforeIt) {
  server_->OnMessage(Execute(1));
  server_->OnMessage(Sample(1));
  v1::SchedulerMessage bad = Execute(2);
  bad.mutable_execute()->mutable_cached_requests()->set_num_computed_tokens(0, 4);  // the worker computed 5
  server_->OnMessage(bad);
  ASSERT_TRUE(backend_->AwaitProgress(1, 1));
  gate_.Open();
  const auto errors = link_.Await(v1::WorkerMessage::kError, 1);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].error().step_seq(), 2u);
  EXPECT_THAT(errors[0].error().message(), HasSubstr("the worker computed 5 tokens, the scheduler says 4"));
  EXPECT_EQ(link_.CountOf(v1::WorkerMessage::kResult), 1u);  // step 1's result went first
}

// A link that pulls, as the gRPC one does: Run's thread blocks in Receive.
class PullingLink : public SchedulerLink {
 public:
  void Send(const v1::WorkerMessage& message) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    sent_.push_back(message);
  }
  bool pulls() const override { return true; }
  bool Receive(v1::SchedulerMessage* message, std::string* reason) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ || !inbox_.empty(); };
    mu_.Await(absl::Condition(&news));
    if (inbox_.empty()) {
      *reason = "the link ended";
      return false;
    }
    *message = std::move(inbox_.front());
    inbox_.pop_front();
    return true;
  }
  void Push(v1::SchedulerMessage message) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(std::move(message));
  }
  void End() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  // What was sent of `kind` once there are at least `n` (what there is after 10 s).
  std::vector<v1::WorkerMessage> Await(v1::WorkerMessage::KindCase kind, size_t n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<size_t>(std::count_if(sent_.begin(), sent_.end(),
                                               [&](const v1::WorkerMessage& m) { return m.kind_case() == kind; })) >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    std::vector<v1::WorkerMessage> out;
    for (const auto& m : sent_) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::SchedulerMessage> inbox_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::WorkerMessage> sent_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerServerPullTest, RunsStepsReadOnItsOwnThreadAndReportsIdleTimeWhileBlockedInARead) {
  auto server = WorkerServer::Create(TinyOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  PullingLink link;
  absl::Status run_status;
  std::thread run([&] { run_status = (*server)->Run(&link); });
  link.Push(Configure(1));
  link.Push(Connect(1));
  link.Push(Execute(1));
  link.Push(Sample(1));
  const auto results = link.Await(v1::WorkerMessage::kResult, 1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].result().output().step_seq(), 1u);
  EXPECT_EQ(results[0].result().output().sampled_token_ids(0), Reference(1)[0]);
  // Nothing more arrives, so the compute thread stays in Receive; the
  // reports still come, and the wait under way counts as idle.
  const size_t before = link.Await(v1::WorkerMessage::kStats, 0).size();
  const auto stats = link.Await(v1::WorkerMessage::kStats, before + 2);
  ASSERT_GE(stats.size(), before + 2);
  EXPECT_EQ(stats.back().stats().steps(), 1);
  EXPECT_GT(stats.back().stats().idle_seconds(), stats[stats.size() - 2].stats().idle_seconds());
  link.End();
  run.join();
  EXPECT_THAT(std::string(run_status.message()), HasSubstr("the link ended"));
}

TEST(WorkerServerRegistrationTest, NamesItsBackendAndDevice) {
  auto server = WorkerServer::Create(TinyOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  const v1::RegisterWorker r = (*server)->Registration();
  EXPECT_EQ(r.backend(), "cpu");
  EXPECT_EQ(r.device(), "cpu");
}

// A CPU worker's cache is resident from the start: a budget beyond the
// machine's memory is refused with the figures, not left to the OOM killer.
TEST(WorkerServerRegistrationTest, AKvCacheLargerThanTheMachineIsRefused) {
  WorkerOptions options = TinyOptions();
  options.kv_cache_bytes = int64_t{1} << 50;
  auto server = WorkerServer::Create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("--kv-cache-memory of 1125899906842624 bytes is more than this machine's available memory"));
}

// `--backend cuda` on the tiny model is refused whatever the machine: where
// no device can be had, naming the flag and the cause; on a GPU, because the
// device's attention has no kernel for the tiny model's 16-wide heads.
TEST(WorkerServerRegistrationTest, AnUnavailableBackendIsRefusedWithItsCause) {
  WorkerOptions options;
  options.model_path = TinyModel();
  options.backend = "cuda";
  auto server = WorkerServer::Create(options);
  ASSERT_FALSE(server.ok());
  BackendChoice cuda;
  cuda.backend = "cuda";
  if (BackendAvailable(cuda).ok()) {
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_THAT(std::string(server.status().message()), HasSubstr("head_dim 16"));
    return;
  }
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("--backend cuda"));
}

}  // namespace
}  // namespace tandem::worker
