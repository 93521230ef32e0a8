// CudaBackend::Sample (sampling.cu) against the CPU sampler on the same rows,
// and its batch invariance. The rule (portable/sampling_rule.h) makes the two
// compute the same integers and the same float values except where exp or log
// enter (the relative probabilities e[t] behind min-p and top-p, the Gumbel
// noise), whose device and glibc implementations may differ by a few ulps.
// So greedy rows must agree exactly, top-n ids exactly, logprobs within 1e-4,
// and seeded draws exactly except at a near-tie, which the test finds on the
// host and excludes:
//   * the two best Gumbel scores of the allowed set closer than 1e-9, or
//   * the CPU's token changes when top_p or min_p moves by 1e-5 relative
//     (a few ulps of e[t] or of a mass sum decide the cut).
// The host-side checks of the launcher run everywhere; the rest skips
// without a device.
#include "worker/backends/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/cpu/sampler.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_test_util.h"
#include "worker/backends/portable/sampling_rule.h"

namespace tandem::worker {
namespace {

namespace sr = sampling;
using cuda_test::Get;
using cuda_test::Put;

// A batch of rows in host memory: everything SampleParams points to.
struct HostBatch {
  int32_t vocab = 0;
  int32_t max_top = 0;
  std::vector<float> logits;
  std::vector<SampleRow> rows;
  std::vector<TokenId> history;
  std::vector<uint32_t> masks;
  std::vector<TokenId> bias_ids;  // each row's run ascending
  std::vector<float> bias_values;
  int32_t words_per_row = 0;
  int32_t num_penalty_rows = 0;
  int32_t num_mask_rows = 0;

  int32_t num_rows() const { return static_cast<int32_t>(rows.size()); }
};

// Outputs of one Sample call.
struct Outputs {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  std::vector<TokenId> top_ids;
};

// `num_rows` rows of every kind: greedy, temperature with each cut, penalties
// with histories, grammar masks, logit biases and bans, logprobs; logits with exact ties.
HostBatch RandomBatch(int32_t num_rows, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  HostBatch b;
  b.vocab = vocab;
  b.max_top = 8;
  b.words_per_row = (vocab + 31) / 32;
  b.logits.resize(static_cast<size_t>(num_rows) * vocab);
  for (int32_t r = 0; r < num_rows; ++r) {
    std::normal_distribution<float> normal(0.0f, 0.5f + 4.0f * unit(rng));
    const bool quantize = r % 5 == 0;
    for (int32_t t = 0; t < vocab; ++t) {
      const float x = normal(rng);
      b.logits[static_cast<size_t>(r) * vocab + t] = quantize ? std::round(x * 4.0f) / 4.0f : x;
    }
    SampleRow row;
    SamplingOptions& o = row.options;
    o.temperature = r % 6 == 0 ? 0.0f : 0.2f + 1.8f * unit(rng);
    o.top_k = rng() % 2 == 0 ? 0 : 1 + static_cast<int32_t>(rng() % 200);
    o.top_p = rng() % 2 == 0 ? 1.0f : 0.1f + 0.9f * unit(rng);
    o.min_p = rng() % 3 == 0 ? 0.2f * unit(rng) : 0.0f;
    o.logprobs = rng() % 3 == 0 ? static_cast<int32_t>(rng() % (b.max_top + 1)) : -1;
    row.rng_key = rng() % 4 == 0 ? 77 : rng();  // some rows share a seed
    row.position = static_cast<int32_t>(rng() % 4096);
    if (rng() % 4 == 0) {
      o.repetition_penalty = 1.0f + unit(rng);
      o.frequency_penalty = rng() % 2 == 0 ? 0.0f : unit(rng);
      o.presence_penalty = rng() % 2 == 0 ? 0.0f : unit(rng);
      row.penalty_row = b.num_penalty_rows++;
      row.history_start = static_cast<int64_t>(b.history.size());
      row.prompt_len = static_cast<int32_t>(rng() % 300);
      row.output_len = static_cast<int32_t>(rng() % 300);
      for (int32_t i = 0; i < row.prompt_len + row.output_len; ++i) {
        b.history.push_back(static_cast<TokenId>(rng() % std::min(vocab, 400)));  // many repeats
      }
    }
    if (rng() % 5 == 0) {
      row.mask_row = b.num_mask_rows++;
      const float keep = 0.05f + 0.9f * unit(rng);
      for (int32_t w = 0; w < b.words_per_row; ++w) {
        uint32_t word = 0;
        for (int bit = 0; bit < 32; ++bit) word |= (unit(rng) < keep ? 1u : 0u) << bit;
        b.masks.push_back(word);
      }
    }
    if (rng() % 4 == 0) {  // logit_bias, some of it bans (bad_words)
      row.bias_start = static_cast<int64_t>(b.bias_ids.size());
      for (int32_t t = static_cast<int32_t>(rng() % 8); t < vocab; t += 1 + static_cast<int32_t>(rng() % 64)) {
        b.bias_ids.push_back(t);
        b.bias_values.push_back(rng() % 5 == 0 ? -INFINITY : 10.0f * unit(rng) - 5.0f);
      }
      row.bias_len = static_cast<int32_t>(b.bias_ids.size() - row.bias_start);
    }
    b.rows.push_back(row);
  }
  return b;
}

// The host batch as SampleParams over host memory, outputs in `out`.
SampleParams HostParams(HostBatch& b, Outputs* out, std::vector<uint32_t>* counts) {
  out->tokens.assign(b.num_rows(), -2);
  out->logprobs.assign(static_cast<size_t>(b.num_rows()) * (1 + b.max_top), -7.0f);
  out->top_ids.assign(static_cast<size_t>(b.num_rows()) * b.max_top, -2);
  counts->assign(static_cast<size_t>(std::max(1, b.num_penalty_rows)) * b.vocab, 12345u);  // garbage: scratch
  SampleParams p;
  p.logits = b.logits.data();
  p.num_rows = b.num_rows();
  p.vocab = b.vocab;
  p.rows = b.rows.data();
  p.history = b.history.data();
  p.history_len = static_cast<int64_t>(b.history.size());
  p.penalty_counts = counts->data();
  p.num_penalty_rows = b.num_penalty_rows;
  p.allowed = b.masks.empty() ? nullptr : b.masks.data();
  p.num_mask_rows = b.num_mask_rows;
  p.words_per_row = b.words_per_row;
  p.bias_ids = b.bias_ids.data();
  p.bias_values = b.bias_values.data();
  p.num_bias = static_cast<int64_t>(b.bias_ids.size());
  p.tokens = out->tokens.data();
  p.logprobs = out->logprobs.data();
  p.top_ids = out->top_ids.data();
  p.max_top = b.max_top;
  return p;
}

Outputs SampleOnCpu(HostBatch& b) {
  Outputs out;
  std::vector<uint32_t> counts;
  const SampleParams p = HostParams(b, &out, &counts);
  CpuBackend cpu(2);
  EXPECT_TRUE(cpu.Sample(p).ok());
  return out;
}

// Samples the batch with `backend` (device memory in, device memory out).
Outputs SampleOnDevice(Backend& backend, HostBatch& b) {
  Outputs host;
  std::vector<uint32_t> counts;
  const SampleParams shape = HostParams(b, &host, &counts);
  auto logits = Put(backend, b.logits);
  auto rows = Put(backend, b.rows);
  auto history = Put(backend, b.history);
  auto masks = Put(backend, b.masks);
  auto bias_ids = Put(backend, b.bias_ids);
  auto bias_values = Put(backend, b.bias_values);
  auto scratch = Put(backend, counts);
  auto tokens = Put(backend, host.tokens);
  auto logprobs = Put(backend, host.logprobs);
  auto top_ids = Put(backend, host.top_ids);
  SampleParams p = shape;
  p.logits = logits->as<float>();
  p.rows = rows->as<SampleRow>();
  p.history = history->as<TokenId>();
  p.penalty_counts = scratch->as<uint32_t>();
  p.allowed = b.masks.empty() ? nullptr : masks->as<uint32_t>();
  p.bias_ids = bias_ids->as<TokenId>();
  p.bias_values = bias_values->as<float>();
  p.tokens = tokens->as<TokenId>();
  p.logprobs = logprobs->as<float>();
  p.top_ids = top_ids->as<TokenId>();
  const absl::Status status = backend.Sample(p);
  EXPECT_TRUE(status.ok()) << status;
  Outputs out;
  out.tokens = Get<TokenId>(backend, tokens->data(), host.tokens.size());
  out.logprobs = Get<float>(backend, logprobs->data(), host.logprobs.size());
  out.top_ids = Get<TokenId>(backend, top_ids->data(), host.top_ids.size());
  return out;
}

// Whether row `r`'s draw is a near-tie (see the file comment).
bool NearTie(HostBatch& b, int32_t r) {
  const SamplingOptions o = b.rows[r].options;
  if (sr::IsGreedy(o.temperature)) return false;  // exact on both
  Outputs out;
  std::vector<uint32_t> counts;
  const SampleParams p = HostParams(b, &out, &counts);
  SamplerScratch scratch;
  const TokenId token = SampleLogits(p, r, &scratch).token;
  for (double factor : {1.0 - 1e-5, 1.0 + 1e-5}) {
    HostBatch moved = b;
    SamplingOptions& m = moved.rows[r].options;
    m.top_p = sr::TopPActive(o.top_p) ? std::min(0.999999f, static_cast<float>(o.top_p * factor)) : o.top_p;
    m.min_p = static_cast<float>(o.min_p * factor);
    Outputs moved_out;
    std::vector<uint32_t> moved_counts;
    const SampleParams q = HostParams(moved, &moved_out, &moved_counts);
    if (SampleLogits(q, r, &scratch).token != token) return true;
  }
  RowValues(p, r, &scratch);
  std::vector<float> values(scratch.values.begin(), scratch.values.begin() + b.vocab);
  const SamplingSupport support = FindSupport(values.data(), b.vocab, o, &scratch);
  const uint64_t row_key = sr::NoiseRowKey(b.rows[r].rng_key, b.rows[r].position);
  std::vector<double> scores;
  for (int32_t t = 0; t < b.vocab; ++t) {
    if (!support.Allows(values[t])) continue;
    scores.push_back(sr::GumbelScore(sr::ScaledLogit(values[t], support.vmax, support.inv_t), row_key, t));
  }
  if (scores.size() < 2) return false;
  std::partial_sort(scores.begin(), scores.begin() + 2, scores.end(), std::greater<double>());
  return scores[0] - scores[1] < 1e-9;
}

std::unique_ptr<CudaBackend> DeviceOrNull(std::string* why) {
  const absl::Status usable = CudaDeviceUsable(0);
  if (!usable.ok()) {
    *why = std::string(usable.message());
    return nullptr;
  }
  auto backend = CudaBackend::Create({});
  if (!backend.ok()) {
    *why = std::string(backend.status().message());
    return nullptr;
  }
  return std::move(backend).value();
}

void CompareWithCpu(int32_t num_rows, int32_t vocab, uint32_t seed) {
  std::string why;
  std::unique_ptr<CudaBackend> gpu = DeviceOrNull(&why);
  if (gpu == nullptr) GTEST_SKIP() << "no usable CUDA device: " << why;
  HostBatch b = RandomBatch(num_rows, vocab, seed);
  const Outputs cpu = SampleOnCpu(b);
  const Outputs dev = SampleOnDevice(*gpu, b);
  int32_t near_ties = 0, compared = 0, greedy = 0;
  for (int32_t r = 0; r < num_rows; ++r) {
    const SamplingOptions& o = b.rows[r].options;
    if (dev.tokens[r] != cpu.tokens[r]) {
      EXPECT_TRUE(NearTie(b, r)) << "row " << r << ": gpu " << dev.tokens[r] << ", cpu " << cpu.tokens[r];
      ++near_ties;
      continue;
    }
    ++compared;
    greedy += sr::IsGreedy(o.temperature) ? 1 : 0;
    const int32_t stride = 1 + b.max_top;
    EXPECT_NEAR(dev.logprobs[r * stride], cpu.logprobs[r * stride], 1e-4) << "row " << r;
    for (int32_t i = 0; i < b.max_top; ++i) {
      EXPECT_EQ(dev.top_ids[r * b.max_top + i], cpu.top_ids[r * b.max_top + i]) << "row " << r << " top " << i;
      EXPECT_NEAR(dev.logprobs[r * stride + 1 + i], cpu.logprobs[r * stride + 1 + i], 1e-4) << "row " << r;
    }
  }
  EXPECT_LE(near_ties, num_rows / 20);
  ::testing::Test::RecordProperty("rows_compared", compared);
  ::testing::Test::RecordProperty("greedy_rows", greedy);
  ::testing::Test::RecordProperty("near_ties", near_ties);
}

TEST(CudaSamplingTest, HostChecksRejectBadSizesWithoutADevice) {
  SampleParams p;
  EXPECT_TRUE(LaunchSampling(p, nullptr).ok());  // no rows: nothing to launch
  float logits = 0.0f;
  SampleRow row;
  TokenId token;
  p.num_rows = 1;
  p.logits = &logits;
  p.rows = &row;
  p.tokens = &token;
  p.vocab = sr::kMaxVocab + 1;
  EXPECT_EQ(LaunchSampling(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.vocab = 64;
  p.max_top = kCudaMaxTopLogprobs + 1;
  EXPECT_EQ(LaunchSampling(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.max_top = 0;
  p.num_penalty_rows = 1;
  EXPECT_EQ(LaunchSampling(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  p.num_penalty_rows = 0;
  uint32_t word = 1;
  p.allowed = &word;
  p.words_per_row = 1;
  EXPECT_EQ(LaunchSampling(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The harness itself, with CpuBackend as the "device" (runs everywhere): the
// uploaded batch samples as the host batch does, and few rows are near-ties.
TEST(CudaSamplingTest, HarnessIsConsistentOnTheCpu) {
  HostBatch b = RandomBatch(128, 1024, 5);
  CpuBackend cpu(2);
  const Outputs host = SampleOnCpu(b);
  const Outputs dev = SampleOnDevice(cpu, b);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_EQ(dev.top_ids, host.top_ids);
  EXPECT_EQ(dev.logprobs, host.logprobs);
  int32_t near_ties = 0, with_penalties = 0, with_masks = 0;
  for (int32_t r = 0; r < b.num_rows(); ++r) {
    near_ties += NearTie(b, r) ? 1 : 0;
    with_penalties += b.rows[r].penalty_row >= 0 ? 1 : 0;
    with_masks += b.rows[r].mask_row >= 0 ? 1 : 0;
  }
  EXPECT_LE(near_ties, 3);
  EXPECT_GT(with_penalties, 10);
  EXPECT_GT(with_masks, 10);
}

TEST(CudaSamplingTest, EqualsTheCpuSamplerOnRandomRows) { CompareWithCpu(512, 4096, 1); }

TEST(CudaSamplingTest, EqualsTheCpuSamplerWithSmolLm2sVocabulary) { CompareWithCpu(64, 49152, 2); }

// A row's outputs are bitwise the same in the whole batch, in a shuffled
// batch and alone, and from run to run.
TEST(CudaSamplingTest, SeededSamplingIsTheSameWhateverTheBatch) {
  std::string why;
  std::unique_ptr<CudaBackend> gpu = DeviceOrNull(&why);
  if (gpu == nullptr) GTEST_SKIP() << "no usable CUDA device: " << why;
  HostBatch b = RandomBatch(128, 4096, 3);
  const Outputs whole = SampleOnDevice(*gpu, b);
  EXPECT_EQ(SampleOnDevice(*gpu, b).tokens, whole.tokens);  // run to run
  std::vector<int32_t> order(b.num_rows());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(4));
  // Rows reference the history and masks by index, which stay valid in any
  // order; logits move with their rows.
  auto subset = [&](const std::vector<int32_t>& which) {
    HostBatch s = b;
    s.rows.clear();
    s.logits.clear();
    for (int32_t r : which) {
      s.rows.push_back(b.rows[r]);
      s.logits.insert(s.logits.end(), b.logits.begin() + static_cast<size_t>(r) * b.vocab,
                      b.logits.begin() + static_cast<size_t>(r + 1) * b.vocab);
    }
    return s;
  };
  HostBatch shuffled = subset(order);
  const Outputs moved = SampleOnDevice(*gpu, shuffled);
  const int32_t stride = 1 + b.max_top;
  for (int32_t i = 0; i < b.num_rows(); ++i) {
    const int32_t r = order[i];
    EXPECT_EQ(moved.tokens[i], whole.tokens[r]) << "row " << r;
    for (int32_t j = 0; j < stride; ++j) EXPECT_EQ(moved.logprobs[i * stride + j], whole.logprobs[r * stride + j]);
  }
  for (int32_t r = 0; r < 16; ++r) {
    HostBatch alone = subset({r});
    EXPECT_EQ(SampleOnDevice(*gpu, alone).tokens[0], whole.tokens[r]) << "row " << r;
  }
}

}  // namespace
}  // namespace tandem::worker
