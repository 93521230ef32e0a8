// gpu_bench: the worker's step loop on one GPU, measured. It drives a
// ModelRunner as the worker does (Execute, Sample, then the step's output
// taken without waiting; the output of step k is waited for only after step
// k+1 is enqueued: async scheduling with the output thread) on a model file
// (the SmolLM2-shaped random model that `tools/gpu_check.sh run` makes) and
// reports:
//
//   decode_b{1,64,256}   tokens/s of decode steps at batch B with contexts
//                        of --context tokens (the runner's whole path:
//                        uploads, forward, sampling, the copy of the ids);
//                        with the fraction of the H200's HBM bandwidth the
//                        step's bytes (weights + KV read) would need
//   prefill_512          tokens/s of one --prefill-tokens prompt in one
//                        step; with the fraction of the bf16 dense roofline
//                        its FLOPs would need
//   busy_b*              the GPU's busy fraction between steps in async
//                        (and, for contrast, sync) mode: CUDA events on the
//                        compute stream before and after each step's work;
//                        busy = 1 - (sum of the gaps between one step's end
//                        and the next's start) / (last end - first start).
//                        Time the GPU waits for launches inside a step
//                        counts as busy there; the next two figures split
//                        the step into the host's part and the device's
//   host_ms_b*           the host's time in Execute and Sample per step
//                        (launching; in async mode it need not wait for
//                        the device)
//   device_ms_b*         the device's time for one step's work when all of
//                        it is queued before the device starts on it (the
//                        stream held at a gate, then released): the step's
//                        time were launching free
//
// Roofline ceilings are the H200 SXM datasheet's: 4.8 TB/s HBM3e and about
// 990 TFLOP/s dense bf16. Every figure goes to stdout as "name value" lines
// and, with --output, to a JSON file.
//
// Without a usable device it prints "gpu_bench: skipped: <cause>" and exits
// 77. --backend cpu runs the same harness on the CPU (a check of the harness
// itself; the figures mean nothing there).
//
//   gpu_bench --model /tmp/smollm2-shaped.gguf --output $OUT/bench.json
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/step.pb.h"
#include "worker/runner/model_runner.h"
#include "worker/server/backend_factory.h"
#if TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/backends/cuda/cuda_backend.h"
#endif

// The pointees of cudaStream_t and cudaEvent_t, for builds without CUDA too.
struct CUstream_st;
struct CUevent_st;

namespace tandem::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr double kH200BytesPerSecond = 4.8e12;
constexpr double kH200Bf16FlopsPerSecond = 990e12;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxStepTokens = 8192;  // prefill chunks when filling the contexts

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The CUDA backend's compute stream; null off the GPU.
CUstream_st* ComputeStream(worker::Backend* backend) {
#if TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<worker::CudaBackend*>(backend)) return cuda->compute_stream();
#endif
  (void)backend;
  return nullptr;
}

// Marks on the compute stream around each step; no-ops off the GPU.
class StepTimeline {
 public:
  explicit StepTimeline(worker::Backend* backend) : stream_(ComputeStream(backend)) {}
  ~StepTimeline() {
#if TANDEM_HAVE_CUDA
    for (auto* e : events_) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e));
#endif
  }
  bool available() const { return stream_ != nullptr; }
  void Mark() {
#if TANDEM_HAVE_CUDA
    if (stream_ == nullptr) return;
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    cudaEventRecord(e, stream_);
    events_.push_back(reinterpret_cast<CUevent_st*>(e));
#endif
  }
  // Seconds between the first two marks; -1 when not measured.
  double FirstPairSeconds() {
#if TANDEM_HAVE_CUDA
    if (events_.size() < 2) return -1;
    cudaStreamSynchronize(stream_);
    float t = 0;
    cudaEventElapsedTime(&t, reinterpret_cast<cudaEvent_t>(events_[0]), reinterpret_cast<cudaEvent_t>(events_[1]));
    return t / 1e3;
#else
    return -1;
#endif
  }
  // Marks come in pairs (start, end) per step. The busy fraction between
  // the first start and the last end; -1 when not measured.
  double BusyFraction() {
#if TANDEM_HAVE_CUDA
    if (events_.size() < 4) return -1;
    cudaStreamSynchronize(stream_);
    auto ms = [&](size_t a, size_t b) {
      float t = 0;
      cudaEventElapsedTime(&t, reinterpret_cast<cudaEvent_t>(events_[a]), reinterpret_cast<cudaEvent_t>(events_[b]));
      return static_cast<double>(t);
    };
    double gaps = 0;
    for (size_t i = 1; i + 1 < events_.size(); i += 2) gaps += std::max(0.0, ms(i, i + 1));
    const double total = ms(0, events_.size() - 1);
    return total > 0 ? 1.0 - gaps / total : -1;
#else
    return -1;
#endif
  }

 private:
  CUstream_st* const stream_;
  std::vector<CUevent_st*> events_;
};

// Holds the compute stream until Open(): a host function enqueued on it
// blocks on a condition variable, so every launch made meanwhile queues up
// behind it. A watchdog opens it after `limit` (a step that waits for its
// own device work inside would otherwise never return), and says so.
class StreamGate {
 public:
  explicit StreamGate(worker::Backend* backend) : stream_(ComputeStream(backend)) {}
  bool available() const { return stream_ != nullptr; }
  void Close() {
#if TANDEM_HAVE_CUDA
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = false;
    }
    cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream_), &StreamGate::Wait, this);
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(2), [this] { return open_; })) {
        timed_out_ = true;
        open_ = true;
        cv_.notify_all();
      }
    });
#endif
  }
  // False when the watchdog had to open it.
  bool Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    return !timed_out_;
  }

 private:
  static void Wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(gate->mu_);
    gate->cv_.wait(lock, [gate] { return gate->open_; });
  }
  CUstream_st* const stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  bool timed_out_ = false;
  std::thread watchdog_;
};

struct Setup {
  std::unique_ptr<gguf::GgufFile> file;
  gguf::LlamaConfig config;
  std::unique_ptr<worker::Backend> backend;
  std::unique_ptr<worker::LlamaModel> model;
};

// Builds the runner's steps for a batch of requests, as the scheduler would.
class StepWriter {
 public:
  explicit StepWriter(int32_t vocab) : vocab_(vocab) {}
  // New requests `first`..`first + n - 1` with `prompt` tokens each and
  // blocks for `total` tokens, prefilled in chunks of at most kMaxStepTokens.
  std::vector<v1::SchedulerOutput> Prefill(int64_t first, int32_t n, int32_t prompt, int32_t total) {
    std::vector<v1::SchedulerOutput> steps;
    const int32_t per_step = std::max(1, kMaxStepTokens / prompt);
    for (int32_t i = 0; i < n; i += per_step) {
      v1::SchedulerOutput step;
      step.set_step_seq(++seq_);
      for (int32_t j = i; j < std::min(n, i + per_step); ++j) {
        v1::NewRequest* r = step.add_new_requests();
        r->set_request_id(first + j);
        for (int32_t t = 0; t < prompt; ++t) r->add_prompt_token_ids(static_cast<int32_t>((first + j) * 131 + t * 7) % vocab_);
        r->mutable_sampling()->set_temperature(0.0f);
        for (int32_t b = 0; b < (total + kBlockSize - 1) / kBlockSize; ++b) r->add_block_ids(next_block_++);
        step.add_scheduled_request_ids(first + j);
        step.add_num_scheduled_tokens(prompt);
      }
      steps.push_back(std::move(step));
    }
    return steps;
  }
  // One decode token for each of the requests, which have `computed` tokens.
  v1::SchedulerOutput Decode(int64_t first, int32_t n, int32_t computed) {
    v1::SchedulerOutput step;
    step.set_step_seq(++seq_);
    v1::CachedRequests* c = step.mutable_cached_requests();
    for (int32_t j = 0; j < n; ++j) {
      c->add_request_ids(first + j);
      c->add_resumed(false);
      c->add_num_computed_tokens(computed);
      c->add_num_new_block_ids(0);
      step.add_scheduled_request_ids(first + j);
      step.add_num_scheduled_tokens(1);
    }
    return step;
  }
  uint64_t seq() const { return seq_; }
  int32_t blocks_used() const { return next_block_; }
  void ResetBlocks() { next_block_ = 1; }

 private:
  const int32_t vocab_;
  uint64_t seq_ = 0;
  int32_t next_block_ = 1;
};

// Runs `step` through the runner; the output is kept in `in_flight` and the
// oldest waited for when more than `depth` are (0: sync; 1: async, as the
// worker's output thread does).
absl::Status RunStep(worker::ModelRunner& runner, const v1::SchedulerOutput& step, size_t depth,
                     std::deque<std::shared_ptr<worker::StepOutput>>& in_flight, StepTimeline* timeline,
                     double* host_seconds = nullptr) {
  if (timeline) timeline->Mark();
  const auto start = Clock::now();
  TANDEM_RETURN_IF_ERROR(runner.Execute(step));
  v1::SampleCommand sample;
  sample.set_step_seq(step.step_seq());
  TANDEM_RETURN_IF_ERROR(runner.Sample(sample));
  if (host_seconds) *host_seconds += Since(start);
  if (timeline) timeline->Mark();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<worker::StepOutput> out, runner.TakeOutput(step.step_seq()));
  in_flight.push_back(std::move(out));
  while (in_flight.size() > depth) {
    TANDEM_RETURN_IF_ERROR(in_flight.front()->Serialize().status());
    in_flight.pop_front();
  }
  return absl::OkStatus();
}

absl::Status Drain(std::deque<std::shared_ptr<worker::StepOutput>>& in_flight) {
  for (auto& out : in_flight) TANDEM_RETURN_IF_ERROR(out->Wait());
  in_flight.clear();
  return absl::OkStatus();
}

struct DecodeFigures {
  double tokens_per_second = 0;
  double step_seconds = 0;
  double bandwidth_fraction = 0;
  double busy_async = -1;
  double busy_sync = -1;
  double host_seconds = 0;     // per step, async mode
  double device_seconds = -1;  // per step, launched behind a gate; -1: not measured
};

// Decode at batch `batch` with `context`-token contexts: prefill, warm up,
// then `steps` timed async steps and as many sync ones (for the busy
// fraction's contrast).
absl::StatusOr<DecodeFigures> BenchDecode(Setup& s, int32_t batch, int32_t context, int32_t steps) {
  const int32_t warmup = 4;
  const int32_t total = context + 2 * (warmup + steps) + 2;
  StepWriter writer(s.config.vocab_size);
  worker::ModelRunnerOptions options;
  options.block_size = kBlockSize;
  worker::ModelRunner runner(s.backend.get(), s.model.get(), options);
  std::deque<std::shared_ptr<worker::StepOutput>> in_flight;
  for (const auto& step : writer.Prefill(1, batch, context, total)) {
    TANDEM_RETURN_IF_ERROR(RunStep(runner, step, 0, in_flight, nullptr));
  }
  int32_t computed = context;  // the prefill sampled token `context` of each
  for (int32_t i = 0; i < warmup; ++i, ++computed) {
    TANDEM_RETURN_IF_ERROR(RunStep(runner, writer.Decode(1, batch, computed), 1, in_flight, nullptr));
  }
  TANDEM_RETURN_IF_ERROR(Drain(in_flight));
  DecodeFigures f;
  StepTimeline async_timeline(s.backend.get());
  const auto start = Clock::now();
  for (int32_t i = 0; i < steps; ++i, ++computed) {
    TANDEM_RETURN_IF_ERROR(
        RunStep(runner, writer.Decode(1, batch, computed), 1, in_flight, &async_timeline, &f.host_seconds));
  }
  TANDEM_RETURN_IF_ERROR(Drain(in_flight));
  const double seconds = Since(start);
  f.step_seconds = seconds / steps;
  f.host_seconds /= steps;
  f.tokens_per_second = batch * steps / seconds;
  f.busy_async = async_timeline.BusyFraction();
  // The device's own time: each step queued whole behind the gate, then
  // timed with events from the gate's opening to the step's end.
  StreamGate gate(s.backend.get());
  if (gate.available()) {
    std::vector<double> device;
    for (int32_t i = 0; i < std::min(steps, 8); ++i, ++computed) {
      StepTimeline timeline(s.backend.get());
      gate.Close();
      timeline.Mark();
      TANDEM_RETURN_IF_ERROR(runner.Execute(writer.Decode(1, batch, computed)));
      v1::SampleCommand sample;
      sample.set_step_seq(writer.seq());
      TANDEM_RETURN_IF_ERROR(runner.Sample(sample));
      timeline.Mark();
      const bool gated = gate.Open();
      TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<worker::StepOutput> out, runner.TakeOutput(writer.seq()));
      TANDEM_RETURN_IF_ERROR(out->Wait());
      if (!gated) {
        std::printf("device time not measured: the step waited for its own device work\n");
        device.clear();
        ++computed;  // the step ran: the loop's increment is skipped
        break;
      }
      device.push_back(timeline.FirstPairSeconds());
    }
    if (!device.empty()) {
      std::sort(device.begin(), device.end());
      f.device_seconds = device[device.size() / 2];
    }
  }
  StepTimeline sync_timeline(s.backend.get());
  for (int32_t i = 0; i < steps; ++i, ++computed) {
    TANDEM_RETURN_IF_ERROR(RunStep(runner, writer.Decode(1, batch, computed), 0, in_flight, &sync_timeline));
  }
  f.busy_sync = sync_timeline.BusyFraction();
  // Bytes a step must read: every weight once, and each row's K and V.
  const double kv_per_token = static_cast<double>(s.model->KvBytesPerBlock(kBlockSize)) / kBlockSize;
  const double bytes = static_cast<double>(s.model->weight_bytes()) + batch * (context + steps / 2.0) * kv_per_token;
  f.bandwidth_fraction = bytes / f.step_seconds / kH200BytesPerSecond;
  return f;
}

struct PrefillFigures {
  double tokens_per_second = 0;
  double step_seconds = 0;
  double compute_fraction = 0;
};

// FLOPs of a `tokens`-token prompt's forward: 2 per weight per token in the
// layers, the causal attention's two products, the logits of its last row.
double PrefillFlops(const gguf::LlamaConfig& c, int32_t tokens) {
  const double h = c.hidden_size, kv = static_cast<double>(c.num_kv_heads) * c.head_dim,
               q = static_cast<double>(c.num_heads) * c.head_dim, inter = c.intermediate_size;
  const double per_token = 2.0 * c.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * inter);
  const double attention = 2.0 * 2.0 * c.num_layers * q * tokens * (tokens + 1) / 2.0;
  return per_token * tokens + attention + 2.0 * h * c.vocab_size;
}

absl::StatusOr<PrefillFigures> BenchPrefill(Setup& s, int32_t tokens, int32_t repeats) {
  StepWriter writer(s.config.vocab_size);
  worker::ModelRunnerOptions options;
  options.block_size = kBlockSize;
  worker::ModelRunner runner(s.backend.get(), s.model.get(), options);
  std::deque<std::shared_ptr<worker::StepOutput>> in_flight;
  std::vector<double> times;
  for (int32_t i = 0; i < repeats + 2; ++i) {
    writer.ResetBlocks();  // each prompt reuses the same blocks; the previous request is finished
    auto steps = writer.Prefill(i + 1, 1, tokens, tokens + 1);
    if (steps.size() != 1) return absl::InvalidArgumentError("the prompt does not fit one step");
    if (i > 0) steps[0].add_finished_request_ids(i);
    const auto start = Clock::now();
    TANDEM_RETURN_IF_ERROR(RunStep(runner, steps[0], 0, in_flight, nullptr));
    if (i >= 2) times.push_back(Since(start));  // two warm-ups
  }
  std::sort(times.begin(), times.end());
  PrefillFigures f;
  f.step_seconds = times[times.size() / 2];
  f.tokens_per_second = tokens / f.step_seconds;
  f.compute_fraction = PrefillFlops(s.config, tokens) / f.step_seconds / kH200Bf16FlopsPerSecond;
  return f;
}

absl::StatusOr<Setup> Load(const std::string& path, const worker::BackendChoice& choice, int32_t kv_blocks) {
  Setup s;
  TANDEM_ASSIGN_OR_RETURN(s.backend, worker::MakeBackend(choice));
  TANDEM_ASSIGN_OR_RETURN(s.file, gguf::OpenModelFile(path));
  TANDEM_ASSIGN_OR_RETURN(s.config, gguf::ReadLlamaConfig(*s.file));
  TANDEM_ASSIGN_OR_RETURN(s.model, worker::LlamaModel::Load(*s.file, s.config, s.backend.get(), {}));
  TANDEM_RETURN_IF_ERROR(s.model->AllocateKvCache(kv_blocks, kBlockSize));
  return s;
}

int Main(const std::vector<std::string>& args) {
  std::string model, output, batches_text = "1,64,256", backend = "cuda";
  bool enforce_eager = false;
  int64_t device = 0, context = 128, steps = 32, prefill_tokens = 512, repeats = 5;
  FlagParser flags("gpu_bench", "The worker's step loop on one GPU: decode and prefill throughput, GPU busy fraction.");
  flags.AddString("model", &model, "GGUF model file (required)");
  flags.AddString("backend", &backend, "cuda, or cpu to check the harness");
  flags.AddInt("device", &device, "CUDA device", 0, 1023);
  flags.AddString("batches", &batches_text, "decode batch sizes, comma-separated");
  flags.AddInt("context", &context, "tokens of context of each decoding sequence", 1, 1 << 20);
  flags.AddInt("steps", &steps, "timed decode steps per batch size and mode", 2, 1 << 20);
  flags.AddInt("prefill-tokens", &prefill_tokens, "tokens of the prefill prompt", 1, kMaxStepTokens);
  flags.AddInt("repeats", &repeats, "timed prefill repeats (the median is reported)", 1, 1000);
  flags.AddString("output", &output, "write every figure to this JSON file too");
  flags.AddBool("enforce-eager", &enforce_eager, "record no CUDA graphs: every kernel launched from the host");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  std::vector<int32_t> batches;
  for (absl::string_view b : absl::StrSplit(batches_text, ',')) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < 1) {
      std::fprintf(stderr, "gpu_bench: flag --batches wants positive integers, got '%s'\n", batches_text.c_str());
      return 2;
    }
    batches.push_back(v);
  }
  if (model.empty()) {
    std::fprintf(stderr, "gpu_bench: flag --model is required\n");
    return 2;
  }
  const worker::BackendChoice choice{backend, static_cast<int32_t>(device), 0, "auto", enforce_eager};
  if (absl::Status s = worker::BackendAvailable(choice); !s.ok()) {
    std::printf("gpu_bench: skipped: %s\n", std::string(s.message()).c_str());
    return 77;
  }
  // Blocks for the largest batch's contexts (and the decode steps), or the prompt.
  const int32_t largest = *std::max_element(batches.begin(), batches.end());
  const int32_t per_request = static_cast<int32_t>((context + 2 * (4 + steps) + 2 + kBlockSize - 1) / kBlockSize);
  const int32_t kv_blocks =
      std::max<int32_t>(largest * per_request, static_cast<int32_t>(prefill_tokens / kBlockSize + 2)) + 1;
  auto setup = Load(model, choice, kv_blocks);
  if (!setup.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", std::string(setup.status().message()).c_str());
    return 1;
  }
  Json json;
  json["device"] = worker::DeviceName(*setup->backend);
  json["model"] = setup->config.name;
  json["weight_bytes"] = setup->model->weight_bytes();
  json["context"] = context;
  json["roofline"] = {{"bytes_per_second", kH200BytesPerSecond}, {"bf16_flops_per_second", kH200Bf16FlopsPerSecond}};
  std::printf("device %s\nweight_bytes %lld\n", worker::DeviceName(*setup->backend).c_str(),
              static_cast<long long>(setup->model->weight_bytes()));
  int status = 0;
  for (int32_t batch : batches) {
    auto f = BenchDecode(*setup, batch, static_cast<int32_t>(context), static_cast<int32_t>(steps));
    const std::string name = "decode_b" + std::to_string(batch);
    if (!f.ok()) {
      std::printf("%s failed: %s\n", name.c_str(), std::string(f.status().message()).c_str());
      json[name] = {{"error", std::string(f.status().message())}};
      status = 1;
      continue;
    }
    std::printf("%s_tokens_per_s %.1f\n%s_step_ms %.3f\n%s_hbm_fraction %.4f\n%s_busy_async %.4f\n%s_busy_sync %.4f\n"
                "%s_host_ms %.3f\n%s_device_ms %.3f\n",
                name.c_str(), f->tokens_per_second, name.c_str(), f->step_seconds * 1e3, name.c_str(),
                f->bandwidth_fraction, name.c_str(), f->busy_async, name.c_str(), f->busy_sync, name.c_str(),
                f->host_seconds * 1e3, name.c_str(), f->device_seconds * 1e3);
    json[name] = {{"tokens_per_second", f->tokens_per_second}, {"step_ms", f->step_seconds * 1e3},
                  {"hbm_bandwidth_fraction", f->bandwidth_fraction}, {"gpu_busy_async", f->busy_async},
                  {"gpu_busy_sync", f->busy_sync}, {"host_ms", f->host_seconds * 1e3},
                  {"device_ms", f->device_seconds * 1e3}};
    std::fflush(stdout);
  }
  auto p = BenchPrefill(*setup, static_cast<int32_t>(prefill_tokens), static_cast<int32_t>(repeats));
  const std::string name = "prefill_" + std::to_string(prefill_tokens);
  if (p.ok()) {
    std::printf("%s_tokens_per_s %.1f\n%s_step_ms %.3f\n%s_bf16_fraction %.4f\n", name.c_str(), p->tokens_per_second,
                name.c_str(), p->step_seconds * 1e3, name.c_str(), p->compute_fraction);
    json[name] = {{"tokens_per_second", p->tokens_per_second}, {"step_ms", p->step_seconds * 1e3},
                  {"bf16_roofline_fraction", p->compute_fraction}};
  } else {
    std::printf("%s failed: %s\n", name.c_str(), std::string(p.status().message()).c_str());
    json[name] = {{"error", std::string(p.status().message())}};
    status = 1;
  }
#if TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<worker::CudaBackend*>(setup->backend.get())) {
    const worker::CudaGraphCounts g = cuda->graph_counts();
    std::printf("graphs eager %lld, captured %lld, replayed %lld, failed captures %lld\n",
                static_cast<long long>(g.eager), static_cast<long long>(g.captures),
                static_cast<long long>(g.replays), static_cast<long long>(g.failed_captures));
    json["graphs"] = {{"eager", g.eager}, {"captures", g.captures}, {"replays", g.replays},
                      {"failed_captures", g.failed_captures}};
  }
#endif
  if (!output.empty()) std::ofstream(output) << json.dump(2) << "\n";
  return status;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) { return tandem::tools::Main(std::vector<std::string>(argv + 1, argv + argc)); }
