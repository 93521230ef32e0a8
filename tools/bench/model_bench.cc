// model_bench: CPU throughput of the default model (SmolLM2-135M, Q4_1
// weights, the output projection Q8_0) on the CPU backend.
//
//   BM_Decode/B/C    one decode step for B sequences of C cached tokens
//                    (a forward pass of B tokens plus greedy sampling); C
//                    640 is the end of a 512-token prompt's 128 outputs;
//                    loops, in_loops and busy: see ReportPool
//   BM_Prefill/N     one N-token prompt in one forward pass
//   BM_Matmul/W/M/F  one matmul of M rows of x by the model's weight W
//                    (0: blk.0.ffn_down, 1: blk.0.ffn_up, 2: token_embd, the
//                    output projection; 3 and 4: the first 128 rows of 0 and
//                    2, in L2) on the quantized path (F=0) or the float path
//                    (F=1); bytes_per_second counts weight bytes
//   BM_ReadBandwidth/H/D  the machine's memory read bandwidth (a 256 MiB
//                    sum read with AVX2, in 4 KiB pages (H=0) or 2 MiB ones,
//                    with software prefetches D bytes ahead or none): with
//                    BM_Gemv's DRAM cases, which read faster still, the
//                    bound of a batch-1 decode step
//   BM_DecodeBound/C  a batch-1 step of C cached tokens against the time
//                    to read the bytes it must read, alternated in rounds
//                    (the fraction of the bound each reader sets: flat
//                    streams, reads in the step's own pieces and order, and
//                    a stream through 2 GiB that no cache holds)
//   BM_PrefetchAB/C  a batch-1 step with and without the quantized kernels'
//                    software prefetches, alternated
//   BM_Gemv/T/N/H    the decode GEMV alone: one row of x by N weight rows
//                    of type T (2: Q4_0, 3: Q4_1, 8: Q8_0), in L2 or DRAM
//   BM_GemvFar/T/N   the decode GEMV from weights no cache holds, against
//                    the bare reader of the same bytes, alternated
//   BM_Attention/B/C  a decode step's attention alone: 30 layers of
//                    PagedAttention for B sequences of C cached tokens
//                    (SmolLM2's 9 query and 3 KV heads of 64), each layer's
//                    cache its own, scattered blocks; bytes_per_second counts
//                    the keys and values a step must read
//   BM_ParallelForOverhead  one ParallelFor of empty chunks: the cost of
//                    waking the pool, paid about 450 times per step
//   BM_ComputeScaling  a fixed amount of register-only FMA work that fills a
//                    core's FMA pipes, split over the pool: 2 threads take
//                    half the time of 1 only if the two CPUs are two cores
//                    (not SMT siblings, not shared)
//
// tokens/s is reported as items_per_second.
//
//   build/bin/model_bench --threads=2   (default: 2)
//   --float-gemm-min-rows=N  CpuBackendOptions::float_gemm_min_rows
//   --prefetch-bytes=N       cpu::SetQuantPrefetchBytes (this CPU's default otherwise)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/cpu/quant_gemm.h"
#include "worker/model/llama_model.h"

namespace tandem::worker {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kContext = 128;      // tokens already cached per decoding sequence
constexpr int32_t kLongContext = 640;  // ... in the long-prompt cases
int32_t g_threads = 2;
int64_t g_float_gemm_min_rows = CpuBackendOptions::kDefaultFloatGemmMinRows;

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  gguf::LlamaConfig config;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<LlamaModel> model;
};

Loaded& Model() {
  static Loaded* loaded = [] {
    auto* l = new Loaded;
    auto file = gguf::GgufFile::Open(std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    TANDEM_CHECK(file.ok()) << file.status() << " (run tools/setup.sh)";
    l->file = std::move(file).value();
    auto config = gguf::ReadLlamaConfig(*l->file);
    TANDEM_CHECK_OK(config.status());
    l->config = *config;
    l->backend = std::make_unique<CpuBackend>(g_threads, CpuBackendOptions{g_float_gemm_min_rows});
    auto model = LlamaModel::Load(*l->file, l->config, l->backend.get(), {});
    TANDEM_CHECK_OK(model.status());
    l->model = std::move(model).value();
    TANDEM_CHECK_OK(l->model->AllocateKvCache(std::max(64 * (kContext / kBlockSize + 1), 16 * (kLongContext / kBlockSize + 1)) + 40, kBlockSize));
    return l;
  }();
  return *loaded;
}

// Device copies of one step's inputs.
struct Step {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  ForwardInputs in;
  std::unique_ptr<DeviceBuffer> logits;
  std::unique_ptr<DeviceBuffer> sampled;
  const SampleRow* rows = nullptr;  // device: greedy rows

  template <typename T>
  const T* Put(Backend& backend, const std::vector<T>& host) {
    auto b = backend.Allocate(host.size() * sizeof(T));
    TANDEM_CHECK_OK(b.status());
    TANDEM_CHECK_OK(backend.Upload(**b, 0, host.data(), host.size() * sizeof(T)));
    buffers.push_back(std::move(b).value());
    return static_cast<const T*>(buffers.back()->data());
  }
};

// `seqs` sequences, each computing `tokens` positions after `cached` ones.
std::unique_ptr<Step> MakeStep(int32_t seqs, int32_t cached, int32_t tokens) {
  Loaded& m = Model();
  auto step = std::make_unique<Step>();
  std::mt19937 rng(1);
  std::vector<TokenId> ids;
  std::vector<int32_t> positions, query_start{0}, lens, table_start{0}, rows;
  std::vector<int64_t> slots;
  std::vector<BlockId> tables;
  const int32_t blocks_per_seq = (cached + tokens + kBlockSize - 1) / kBlockSize;
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b) tables.push_back(1 + s * blocks_per_seq + b);
    for (int32_t p = cached; p < cached + tokens; ++p) {
      ids.push_back(static_cast<TokenId>(rng() % m.config.vocab_size));
      positions.push_back(p);
      slots.push_back(int64_t{tables[s * blocks_per_seq + p / kBlockSize]} * kBlockSize + p % kBlockSize);
    }
    rows.push_back(static_cast<int32_t>(ids.size()) - 1);
    query_start.push_back(static_cast<int32_t>(ids.size()));
    lens.push_back(cached + tokens);
    table_start.push_back(static_cast<int32_t>(tables.size()));
  }
  Backend& backend = *m.backend;
  step->in.input_ids = step->Put(backend, ids);
  step->in.positions = step->Put(backend, positions);
  step->in.kv_slots = step->Put(backend, slots);
  step->in.num_tokens = static_cast<int32_t>(ids.size());
  step->in.query_start = step->Put(backend, query_start);
  step->in.seq_lens = step->Put(backend, lens);
  step->in.block_table_start = step->Put(backend, table_start);
  step->in.block_tables = step->Put(backend, tables);
  step->in.num_seqs = seqs;
  step->in.logits_rows = step->Put(backend, rows);
  step->in.num_logits_rows = seqs;
  step->logits = std::move(backend.Allocate(size_t{1} * seqs * m.config.vocab_size * sizeof(float))).value();
  step->sampled = std::move(backend.Allocate(seqs * sizeof(TokenId))).value();
  std::vector<SampleRow> greedy(seqs);
  for (SampleRow& row : greedy) row.options.temperature = 0.0f;
  step->rows = step->Put(backend, greedy);
  return step;
}

void Run(Step& step) {
  Loaded& m = Model();
  TANDEM_CHECK_OK(m.model->Forward(step.in, nullptr, nullptr, step.logits->as<float>()));
  SampleParams sample;
  sample.logits = step.logits->as<float>();
  sample.num_rows = step.in.num_logits_rows;
  sample.vocab = m.config.vocab_size;
  sample.rows = step.rows;
  sample.tokens = step.sampled->as<TokenId>();
  sample.logprobs = nullptr;
  sample.top_ids = nullptr;
  TANDEM_CHECK_OK(m.backend->Sample(sample));
}

// Where a step's time went: the share of it inside the pool's loops
// (`in_loops`; the rest is serial work between them) and how busy the
// threads were inside them (`busy`: their time running units over threads x
// loop time).
void ReportPool(benchmark::State& state, const ThreadPool::Stats& before, const ThreadPool::Stats& after,
                uint64_t step_ticks) {
  const double loop_ticks = static_cast<double>(after.loop_ticks - before.loop_ticks);
  state.counters["loops"] = static_cast<double>(after.loops - before.loops) / static_cast<double>(state.iterations());
  state.counters["in_loops"] = loop_ticks / static_cast<double>(step_ticks);
  state.counters["busy"] = static_cast<double>(after.busy_ticks - before.busy_ticks) / (g_threads * loop_ticks);
}

void BM_Decode(benchmark::State& state) {
  const auto batch = static_cast<int32_t>(state.range(0));
  const auto context = static_cast<int32_t>(state.range(1));
  // Fill the cache of every sequence once, then time single-token steps.
  auto prefill = MakeStep(batch, 0, context);
  Run(*prefill);
  auto decode = MakeStep(batch, context, 1);
  ThreadPool& pool = Model().backend->pool();
  pool.EnableStats(true);
  const ThreadPool::Stats before = pool.stats();
  uint64_t step_ticks = 0;
  for (auto _ : state) {
    const uint64_t start = __rdtsc();
    Run(*decode);
    step_ticks += __rdtsc() - start;
  }
  const ThreadPool::Stats after = pool.stats();
  pool.EnableStats(false);
  ReportPool(state, before, after, step_ticks);
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["threads"] = g_threads;
}
BENCHMARK(BM_Decode)
    ->Args({1, kContext})
    ->Args({16, kContext})
    ->Args({64, kContext})
    ->Args({1, kLongContext})
    ->Args({16, kLongContext})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Prefill(benchmark::State& state) {
  const auto tokens = static_cast<int32_t>(state.range(0));
  auto prefill = MakeStep(1, 0, tokens);
  for (auto _ : state) Run(*prefill);
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["threads"] = g_threads;
}
BENCHMARK(BM_Prefill)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Matmul(benchmark::State& state) {
  // 3 and 4: the first 128 rows of 0 and 2, small enough to stay in L2, so
  // the kernel's arithmetic rather than memory sets the time.
  static const char* const kNames[] = {"blk.0.ffn_down.weight", "blk.0.ffn_up.weight", "token_embd.weight",
                                       "blk.0.ffn_down.weight", "token_embd.weight"};
  constexpr int64_t kCachedRows = 128;
  Loaded& m = Model();
  const gguf::GgufTensor* found = m.file->FindTensor(kNames[state.range(0)]);
  TANDEM_CHECK(found != nullptr);
  gguf::GgufTensor tensor = *found;
  if (state.range(0) >= 3) tensor.shape[1] = kCachedRows;
  const auto rows = state.range(1);
  // A backend of its own: the path is this benchmark's argument.
  CpuBackend backend(g_threads, CpuBackendOptions{state.range(2) ? 1 : CpuBackendOptions::kDefaultFloatGemmMinRows});
  auto weight = backend.LoadWeight(tensor);
  TANDEM_CHECK_OK(weight.status());
  std::vector<float> x(rows * weight->cols), y(rows * weight->rows);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (auto _ : state) TANDEM_CHECK_OK(backend.Matmul({x.data(), &*weight, rows, y.data()}));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(weight->buffer->size()));
  state.SetItemsProcessed(state.iterations() * rows);
  state.SetLabel(kNames[state.range(0)]);
}
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1}, {0}})
    ->ArgsProduct({{0, 1}, {4, 16, 32, 64, 128, 256, 512}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// `bytes` of zeroed memory at a 2 MiB boundary, in 2 MiB pages (transparent
// huge pages, where the kernel grants them) or in 4 KiB ones.
class PagedMemory {
 public:
  PagedMemory(size_t bytes, bool huge) : mapped_(bytes + kHuge) {
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TANDEM_CHECK(p != MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
    data_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base_) + kHuge - 1) & ~uintptr_t{kHuge - 1});
    madvise(data_, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(data_, 0, bytes);
  }
  ~PagedMemory() { munmap(base_, mapped_); }
  uint8_t* data() { return data_; }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  size_t mapped_;
  uint8_t* base_;
  uint8_t* data_;
};

// Sums `bytes` at p (a multiple of 128) as 64-bit lanes, four AVX2 loads at
// a time: the read bandwidth a kernel streaming weights could reach.
__attribute__((target("avx2"))) int64_t SumAvx2(const uint8_t* p, int64_t bytes, int64_t ahead) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < bytes; i += 128) {
    if (ahead > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead + 64), _MM_HINT_T0);
    }
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  return _mm256_extract_epi64(a0, 0) + _mm256_extract_epi64(a0, 1) + _mm256_extract_epi64(a0, 2) +
         _mm256_extract_epi64(a0, 3);
}

void BM_ReadBandwidth(benchmark::State& state) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (!__builtin_cpu_supports("avx2")) {
    state.SkipWithError("needs AVX2");
    return;
  }
  PagedMemory memory(kBytes, state.range(0) != 0);
  ThreadPool pool(g_threads);
  std::vector<int64_t> sums(g_threads);
  for (auto _ : state) {
    pool.ParallelFor(kBytes / kChunk, 1, [&](int64_t begin, int64_t end, int32_t t) {
      sums[t] += SumAvx2(memory.data() + begin * kChunk, (end - begin) * kChunk, state.range(1));
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  state.SetLabel(state.range(0) ? "2 MiB pages" : "4 KiB pages");
}
BENCHMARK(BM_ReadBandwidth)
    ->ArgsProduct({{0, 1}, {0, 2048, 4096}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The median of v.
double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median seconds of `calls` calls of f.
template <typename F>
double MedianSeconds(int calls, F&& f) {
  std::vector<double> seconds(calls);
  for (double& s : seconds) {
    const auto start = std::chrono::steady_clock::now();
    f();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Median(std::move(seconds));
}

// A batch-1 decode step against the memory bound for the bytes it must read
// (the model's weights and the keys and values of C cached tokens), both
// measured in the same second: the VM's bandwidth moves within seconds with
// its neighbours' load, so bound and step taken in different runs are not
// comparable. Each iteration is a round of kRound decode steps, then kRound
// reads of that many bytes (2 MiB pages, the step's own threads) by the
// plain AVX2 sum and kRound by the sum prefetching 2 KiB ahead, each in its
// own steady state; then kRound reads of the same bytes in the step's own
// shape (StepShapedReads): the pieces a step reads, in its order, one pool
// loop each; then kRound reads of as many bytes from a 2 GiB span, each
// where the last one ended, so that none finds its lines in a cache: the
// memory's own bandwidth, where the readers before reread one step's bytes
// as the step does (a cache as large as the Intel VM's 480 MiB L3 serves
// them part of those). Counters are medians over rounds: `step_ms`, the
// readers' GiB/s, and the step's time as a fraction of the bound each sets
// (`of_plain`, `of_fastest`: the faster flat reader of that round;
// `of_shaped`; `of_far`, `far_GiBs`: the 2 GiB span).
// The bytes a batch-1 step of `context` cached tokens reads, as the pieces
// it reads them in, in its order: per layer the Q, K and V weights (one
// loop), the layer's keys and values, the output projection, the gate and
// up weights (one loop) and the down projection; then the output head.
// Each is read by one pool loop (the plain AVX2 sum, 4 KiB units), after
// the previous one, the weights one after the other as CpuBackend's arena
// holds them and the keys and values elsewhere. Nothing but reading: what
// the memory gives to reads of these sizes made one after the other, the
// way a step's operations (each a loop over one or a few matrices of
// 0.2-1.1 MB) must make them; a flat stream of as many bytes reads faster,
// since it pays the start of a stream once.
class StepShapedReads {
 public:
  StepShapedReads(const Loaded& m, int32_t context) {
    const gguf::LlamaConfig& c = m.config;
    auto matrix = [&](const std::string& name) {
      const gguf::GgufTensor* t = m.file->FindTensor(name);
      TANDEM_CHECK(t != nullptr) << name;
      const auto type = static_cast<int32_t>(t->type);
      return cpu::IsQuantizedFormat(type) ? cpu::PackedWeightBytes(type, t->shape[1], t->shape[0])
                                          : t->shape[0] * t->shape[1] * int64_t{sizeof(float)};
    };
    const int64_t kv = m.model->KvBytesPerBlock(kBlockSize) * context / kBlockSize / c.num_layers;
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Add(matrix(b + "attn_q.weight") + matrix(b + "attn_k.weight") + matrix(b + "attn_v.weight"), false);
      Add(kv, true);
      Add(matrix(b + "attn_output.weight"), false);
      Add(matrix(b + "ffn_gate.weight") + matrix(b + "ffn_up.weight"), false);
      Add(matrix(b + "ffn_down.weight"), false);
    }
    Add(matrix(c.tied_embeddings ? "token_embd.weight" : "output.weight"), false);
    weights_ = std::make_unique<PagedMemory>(weight_bytes_, /*huge=*/true);
    kv_ = std::make_unique<PagedMemory>(kv_bytes_, /*huge=*/true);
  }

  int64_t bytes() const { return weight_bytes_ + kv_bytes_; }

  void Read(ThreadPool& pool, std::vector<int64_t>* sums) {
    for (const Piece& piece : pieces_) {
      const uint8_t* base = (piece.kv ? kv_->data() : weights_->data()) + piece.offset;
      pool.ParallelFor(piece.bytes / kUnit, 1, [&](int64_t begin, int64_t end, int32_t t) {
        (*sums)[t] += SumAvx2(base + begin * kUnit, (end - begin) * kUnit, 0);
      });
    }
    benchmark::DoNotOptimize(sums->data());
  }

 private:
  static constexpr int64_t kUnit = 4096;
  struct Piece {
    bool kv;
    int64_t offset, bytes;
  };
  void Add(int64_t bytes, bool kv) {
    bytes = (bytes + kUnit - 1) / kUnit * kUnit;
    int64_t& end = kv ? kv_bytes_ : weight_bytes_;
    pieces_.push_back({kv, end, bytes});
    end += bytes;
  }
  std::vector<Piece> pieces_;
  int64_t weight_bytes_ = 0, kv_bytes_ = 0;
  std::unique_ptr<PagedMemory> weights_, kv_;
};

void BM_DecodeBound(benchmark::State& state) {
  constexpr int kRound = 16;
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (!__builtin_cpu_supports("avx2")) {
    state.SkipWithError("needs AVX2");
    return;
  }
  const auto context = static_cast<int32_t>(state.range(0));
  Loaded& m = Model();
  auto prefill = MakeStep(1, 0, context);
  Run(*prefill);
  auto decode = MakeStep(1, context, 1);
  const int64_t bytes = m.model->weight_bytes() + m.model->KvBytesPerBlock(kBlockSize) * context / kBlockSize;
  const int64_t chunks = (bytes + kChunk - 1) / kChunk;
  PagedMemory memory(chunks * kChunk, /*huge=*/true);
  ThreadPool& pool = m.backend->pool();
  std::vector<int64_t> sums(pool.num_threads());
  // Reads `chunks` chunks at base, prefetching `ahead` bytes ahead.
  auto read = [&](const uint8_t* base, int64_t ahead) {
    pool.ParallelFor(chunks, 1, [&](int64_t begin, int64_t end, int32_t t) {
      sums[t] += SumAvx2(base + begin * kChunk, (end - begin) * kChunk, ahead);
    });
    benchmark::DoNotOptimize(sums.data());
  };
  auto median_of_round = [](auto&& f) { return MedianSeconds(kRound, f); };
  StepShapedReads shaped_reads(m, context);
  // The memory itself: as many bytes, prefetched 2 KiB ahead, from a span
  // of kFarBytes read in turn, so that no read finds another's lines in a
  // cache (the Intel VM's L3 is 480 MiB; the cyclic readers above, like the
  // step, reread one step's bytes and find some of them there).
  constexpr int64_t kFarBytes = int64_t{2} << 30;
  const int64_t far_slices = std::max<int64_t>(2, kFarBytes / (chunks * kChunk));
  PagedMemory far(far_slices * chunks * kChunk, /*huge=*/true);
  int64_t far_slice = 0;
  auto read_far = [&] {
    read(far.data() + far_slice * chunks * kChunk, 2048);
    far_slice = (far_slice + 1) % far_slices;
  };
  std::vector<double> step_ms, plain_gibs, ahead_gibs, shaped_gibs, far_gibs, of_plain, of_fastest, of_shaped,
      of_far;
  for (auto _ : state) {
    const double step = median_of_round([&] { Run(*decode); });
    const double plain = median_of_round([&] { read(memory.data(), 0); }) * bytes / (chunks * kChunk);
    const double ahead = median_of_round([&] { read(memory.data(), 2048); }) * bytes / (chunks * kChunk);
    // Its pieces are rounded up to whole units: scaled back to `bytes`.
    const double shaped =
        median_of_round([&] { shaped_reads.Read(pool, &sums); }) * bytes / shaped_reads.bytes();
    const double far_read = median_of_round(read_far) * bytes / (chunks * kChunk);
    step_ms.push_back(1e3 * step);
    far_gibs.push_back(bytes / far_read / (1 << 30));
    of_far.push_back(far_read / step);
    plain_gibs.push_back(bytes / plain / (1 << 30));
    ahead_gibs.push_back(bytes / ahead / (1 << 30));
    shaped_gibs.push_back(bytes / shaped / (1 << 30));
    of_plain.push_back(plain / step);
    of_fastest.push_back(std::min(plain, ahead) / step);
    of_shaped.push_back(shaped / step);
  }
  state.counters["MB"] = bytes / 1e6;
  state.counters["step_ms"] = Median(step_ms);
  state.counters["plain_GiBs"] = Median(plain_gibs);
  state.counters["ahead_GiBs"] = Median(ahead_gibs);
  state.counters["of_plain"] = Median(of_plain);
  state.counters["of_fastest"] = Median(of_fastest);
  state.counters["shaped_GiBs"] = Median(shaped_gibs);
  state.counters["of_shaped"] = Median(of_shaped);
  state.counters["far_GiBs"] = Median(far_gibs);
  state.counters["of_far"] = Median(of_far);
}
BENCHMARK(BM_DecodeBound)->Arg(kContext)->Arg(kLongContext)->Unit(benchmark::kMillisecond)->UseRealTime();

// A batch-1 step of C cached tokens with the kernels' software prefetches
// (QuantPrefetchBytes, or --prefetch-bytes) and without, alternated in
// rounds of kRound steps in one process: the VM's bandwidth moves within
// seconds, so only steps taken side by side compare. Counters: median step
// of each (`on_ms`, `off_ms`) and their ratio per round, median (`speedup`).
void BM_PrefetchAB(benchmark::State& state) {
  constexpr int kRound = 8;
  const int64_t on = cpu::QuantPrefetchBytes() != 0 ? cpu::QuantPrefetchBytes() : 8192;
  auto prefill = MakeStep(1, 0, static_cast<int32_t>(state.range(0)));
  Run(*prefill);
  auto decode = MakeStep(1, static_cast<int32_t>(state.range(0)), 1);
  auto round_ms = [&](int64_t prefetch) {
    cpu::SetQuantPrefetchBytes(prefetch);
    return 1e3 * MedianSeconds(kRound, [&] { Run(*decode); });
  };
  const int64_t before = cpu::QuantPrefetchBytes();
  std::vector<double> on_ms, off_ms, speedup;
  for (auto _ : state) {
    on_ms.push_back(round_ms(on));
    off_ms.push_back(round_ms(0));
    speedup.push_back(off_ms.back() / on_ms.back());
  }
  cpu::SetQuantPrefetchBytes(before);
  state.counters["prefetch_bytes"] = static_cast<double>(on);
  state.counters["on_ms"] = Median(on_ms);
  state.counters["off_ms"] = Median(off_ms);
  state.counters["speedup"] = Median(speedup);
}
BENCHMARK(BM_PrefetchAB)->Arg(kContext)->Arg(kLongContext)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

// One row of x (k = 576, SmolLM2's width) by N weight rows of type T
// (2: Q4_0, 3: Q4_1, 8: Q8_0), packed as CpuBackend::LoadWeight packs them,
// in 4 KiB (H=0) or 2 MiB pages (H=1): the decode GEMV alone. 384 and 2,048
// rows stay in L2 (the kernel's arithmetic sets the time; 384 rows are two
// threads' few microseconds, in which waking the pool counts); 196,608 rows
// (69 MB of Q4_1) stream from DRAM. bytes_per_second counts weight bytes, items_per_second
// weight rows (a thread's ns per row: 1e9 * --threads / items_per_second).
// A GEMV's operands: n rows of k random weights in GGUF blocks of `type`
// and one random row of x, quantized as the model quantizes it.
struct GemvOperands {
  std::vector<uint8_t> gguf_rows;
  cpu::QuantizedRows x;
};
GemvOperands RandomGemvOperands(ThreadPool& pool, int32_t type, int64_t n, int64_t k) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const int64_t row_bytes = cpu::QuantizedRowBytes(type, k);
  std::vector<float> row(k);
  GemvOperands o;
  o.gguf_rows.resize(n * row_bytes);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = normal(rng);
    TANDEM_CHECK_OK(gguf::QuantizeRow(static_cast<gguf::GgmlType>(type), row.data(), &o.gguf_rows[r * row_bytes], k));
  }
  for (float& v : row) v = normal(rng);
  cpu::QuantizeRows(pool, row.data(), 1, k, &o.x);
  return o;
}

void BM_Gemv(benchmark::State& state) {
  const auto type = static_cast<int32_t>(state.range(0));
  const int64_t n = state.range(1);
  constexpr int64_t k = 576;
  const int64_t row_bytes = cpu::QuantizedRowBytes(type, k);
  ThreadPool pool(g_threads);
  GemvOperands o = RandomGemvOperands(pool, type, n, k);
  PagedMemory w(cpu::PackedWeightBytes(type, n, k), state.range(2) != 0);
  cpu::PackWeightRows(type, o.gguf_rows.data(), n, k, w.data());
  o.gguf_rows = {};
  const cpu::QuantizedRows& x = o.x;
  std::vector<float> y(n);
  for (auto _ : state) cpu::QuantGemm(pool, x, w.data(), type, n, y.data(), false);
  state.SetBytesProcessed(state.iterations() * n * row_bytes);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Gemv)
    ->ArgsProduct({{2, 3, 8}, {384, 2048, 196608}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The decode GEMV (type T, k = 576) over N weight rows that no cache holds,
// against the bare AVX2 sum of the same bytes, alternated in rounds: each
// call reads the next of the copies of one packed matrix that fill a 2 GiB
// span, as each read does. Counters: the GEMV's and the reader's GiB/s
// (medians over rounds) and their ratio per round (`of_read`, median).
void BM_GemvFar(benchmark::State& state) {
  constexpr int64_t k = 576;
  constexpr int64_t kUnit = 4096;
  constexpr int64_t kSpan = int64_t{2} << 30;
  const auto type = static_cast<int32_t>(state.range(0));
  const int64_t n = state.range(1);
  ThreadPool pool(g_threads);
  const GemvOperands o = RandomGemvOperands(pool, type, n, k);
  const cpu::QuantizedRows& x = o.x;
  const int64_t packed = cpu::PackedWeightBytes(type, n, k);
  const int64_t slice = (packed + kUnit - 1) / kUnit * kUnit;
  const int64_t slices = std::max<int64_t>(2, kSpan / slice);
  PagedMemory far(slices * slice, /*huge=*/true);
  cpu::PackWeightRows(type, o.gguf_rows.data(), n, k, far.data());
  for (int64_t s = 1; s < slices; ++s) std::memcpy(far.data() + s * slice, far.data(), packed);
  std::vector<float> y(n);
  std::vector<int64_t> sums(pool.num_threads());
  const int64_t calls = std::max<int64_t>(16, (int64_t{256} << 20) / slice);
  int64_t at = 0;
  auto next = [&] {
    const uint8_t* p = far.data() + at * slice;
    at = (at + 1) % slices;
    return p;
  };
  auto timed = [&](auto&& f) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < calls; ++c) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> gemv_gibs, read_gibs, of_read;
  for (auto _ : state) {
    const double gemv = timed([&] { cpu::QuantGemm(pool, x, next(), type, n, y.data(), false); });
    const double read = timed([&] {
      const uint8_t* p = next();
      pool.ParallelFor(slice / kUnit, 1, [&](int64_t begin, int64_t end, int32_t t) {
        sums[t] += SumAvx2(p + begin * kUnit, (end - begin) * kUnit, 2048);
      });
    });
    benchmark::DoNotOptimize(sums.data());
    gemv_gibs.push_back(calls * packed / gemv / (1 << 30));
    read_gibs.push_back(calls * slice / read / (1 << 30));
    of_read.push_back(read / gemv * packed / slice);
  }
  state.counters["MB"] = packed / 1e6;
  state.counters["gemv_GiBs"] = Median(gemv_gibs);
  state.counters["read_GiBs"] = Median(read_gibs);
  state.counters["of_read"] = Median(of_read);
}
BENCHMARK(BM_GemvFar)->Args({3, 3072})->Args({3, 196608})->Args({8, 49152})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Attention(benchmark::State& state) {
  constexpr int32_t kLayers = 30, kHeads = 9, kKvHeads = 3, kHeadDim = 64;
  const auto batch = static_cast<int32_t>(state.range(0));
  const auto context = static_cast<int32_t>(state.range(1));
  CpuBackend backend(g_threads);
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  // At least the 8 MiB a layer's keys take in `tandem serve` (2 MiB pages,
  // as there), the sequences' blocks scattered over all of it.
  const int32_t blocks = std::max(1 + batch * blocks_per_seq, 700);
  const int64_t layer_elements = int64_t{blocks} * kBlockSize * kKvHeads * kHeadDim;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  // Each sequence's blocks scattered over the cache, as a running server's are.
  std::vector<BlockId> tables(blocks - 1);
  std::iota(tables.begin(), tables.end(), 1);
  std::shuffle(tables.begin(), tables.end(), rng);
  tables.resize(batch * blocks_per_seq);
  // Written as the model writes them (WriteKv), in the backend's element type.
  std::vector<std::unique_ptr<DeviceBuffer>> caches;
  std::vector<float> keys(int64_t{kBlockSize} * kKvHeads * kHeadDim), values(keys.size());
  std::vector<int64_t> slots(kBlockSize);
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t kv = 0; kv < 2; ++kv) {
      auto buffer = backend.Allocate(layer_elements * KvElementBytes(backend.kv_type()));
      TANDEM_CHECK_OK(buffer.status());
      caches.push_back(std::move(buffer).value());
    }
    const KvCacheLayer cache{caches[2 * layer]->data(), caches[2 * layer + 1]->data(), backend.kv_type()};
    for (BlockId b : tables) {
      for (float& f : keys) f = normal(rng);
      for (float& f : values) f = normal(rng);
      std::iota(slots.begin(), slots.end(), int64_t{b} * kBlockSize);
      TANDEM_CHECK_OK(backend.WriteKv({cache, keys.data(), values.data(), slots.data(), kBlockSize, kKvHeads * kHeadDim}));
    }
  }
  std::vector<int32_t> query_start(batch + 1), seq_lens(batch, context + 1), table_start(batch + 1);
  for (int32_t s = 0; s <= batch; ++s) {
    query_start[s] = s;
    table_start[s] = s * blocks_per_seq;
  }
  std::vector<float> q(int64_t{batch} * kHeads * kHeadDim), out(q.size());
  for (float& f : q) f = normal(rng);
  AttentionParams p{};
  p.q = q.data();
  p.out = out.data();
  p.query_start = query_start.data();
  p.seq_lens = seq_lens.data();
  p.block_table_start = table_start.data();
  p.block_tables = tables.data();
  p.num_seqs = batch;
  p.max_seq_len = context;
  p.max_query_len = 1;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.block_size = kBlockSize;
  p.scale = 0.125f;
  // The step's own key/value row sits past `context`: attend to context rows.
  for (int32_t s = 0; s < batch; ++s) seq_lens[s] = context;
  for (auto _ : state) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      p.cache = {caches[2 * layer]->data(), caches[2 * layer + 1]->data(), backend.kv_type()};
      TANDEM_CHECK_OK(backend.PagedAttention(p));
    }
  }
  benchmark::DoNotOptimize(out.data());
  state.SetBytesProcessed(state.iterations() * int64_t{kLayers} * batch * context * 2 * kKvHeads * kHeadDim *
                          static_cast<int64_t>(KvElementBytes(backend.kv_type())));
}
BENCHMARK(BM_Attention)
    ->Args({1, kContext})
    ->Args({1, kLongContext})
    ->Args({16, kLongContext})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ParallelForOverhead(benchmark::State& state) {
  ThreadPool pool(g_threads);
  std::vector<int64_t> hits(g_threads);
  for (auto _ : state) {
    pool.ParallelFor(2 * g_threads, 1, [&](int64_t begin, int64_t end, int32_t t) { hits[t] += end - begin; });
  }
  benchmark::DoNotOptimize(hits.data());
}
BENCHMARK(BM_ParallelForOverhead)->Unit(benchmark::kMicrosecond)->UseRealTime();

// `iterations` rounds of twelve independent chains of 256-bit FMAs: enough
// chains to keep both FMA pipes of a core busy (two pipes of four cycles'
// latency need eight), so a core's arithmetic, not a chain's latency, sets
// the time, and two SMT siblings sharing one core's pipes would take twice as
// long as either alone. (Four chains of scalar arithmetic, which this
// benchmark ran before, leave most of a core idle: SMT siblings halve that
// time as well as two cores do.)
__attribute__((target("avx2,fma"))) float FmaChains(float seed, int64_t iterations) {
  constexpr int kChains = 12;
  __m256 v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = _mm256_set1_ps(seed + c);
  const __m256 scale = _mm256_set1_ps(0.999999f);
  const __m256 add = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) v[c] = _mm256_fmadd_ps(v[c], scale, add);
  }
  __m256 sum = v[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, v[c]);
  return _mm256_cvtss_f32(sum);
}

void BM_ComputeScaling(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    state.SkipWithError("needs AVX2 and FMA");
    return;
  }
  ThreadPool pool(g_threads);
  constexpr int64_t kItems = 64;
  std::vector<float> out(kItems);
  for (auto _ : state) {
    pool.ParallelFor(kItems, 1, [&](int64_t begin, int64_t end, int32_t) {
      for (int64_t item = begin; item < end; ++item) out[item] = FmaChains(1.0f + item, 500000);
    });
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_ComputeScaling)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tandem::worker

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) tandem::worker::g_threads = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--prefetch-bytes=", 17) == 0) {
      char* end = nullptr;
      const long long bytes = std::strtoll(argv[i] + 17, &end, 10);
      if (end == argv[i] + 17 || *end != '\0' || bytes < 0) {
        std::fprintf(stderr, "model_bench: --prefetch-bytes takes a byte count >= 0, got '%s'\n", argv[i] + 17);
        return 2;
      }
      tandem::worker::cpu::SetQuantPrefetchBytes(bytes);
    }
    if (std::strncmp(argv[i], "--float-gemm-min-rows=", 22) == 0) {
      tandem::worker::g_float_gemm_min_rows = std::atoll(argv[i] + 22);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
