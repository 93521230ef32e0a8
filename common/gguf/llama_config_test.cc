#include "common/gguf/llama_config.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gguf/gguf_test_util.h"
#include "common/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::gguf {
namespace {

using ::testing::HasSubstr;
using testing::TinyLlama;

// Parses the tiny model after `edit` has changed its writer.
absl::StatusOr<LlamaConfig> ConfigOf(const TinyLlama& options, void (*edit)(GgufWriter*) = nullptr) {
  GgufWriter w;
  testing::AddTinyLlama(options, &w);
  if (edit != nullptr) edit(&w);
  auto file = GgufFile::FromBytes(w.Serialize());
  if (!file.ok()) return file.status();
  return ReadLlamaConfig(**file);
}

TEST(LlamaConfigTest, ReadsTheTinyModel) {
  TinyLlama tiny;
  auto c = ConfigOf(tiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->name, "tiny test llama");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 96);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_dim, 16);
  EXPECT_EQ(c->vocab_size, 40);
  EXPECT_EQ(c->context_length, 128);
  EXPECT_EQ(c->rope_freq_base, 10000.0f);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_TRUE(c->tied_embeddings);
}

TEST(LlamaConfigTest, UntiedHasOutputWeight) {
  TinyLlama tiny;
  tiny.tied = false;
  tiny.type = GgmlType::kQ4_1;
  auto c = ConfigOf(tiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tied_embeddings);
}

TEST(LlamaConfigTest, DefaultsForOptionalKeys) {
  TinyLlama tiny;
  tiny.kv_heads = tiny.heads;
  tiny.omit_keys = {"llama.attention.head_count_kv", "llama.vocab_size", "llama.rope.freq_base",
                    "llama.attention.layer_norm_rms_epsilon", "general.name"};
  auto c = ConfigOf(tiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->vocab_size, 40);  // from the tokenizer
  EXPECT_EQ(c->rope_freq_base, 10000.0f);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->name, "");

  tiny.with_tokenizer = false;  // then from token_embd.weight
  c = ConfigOf(tiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 40);
}

void ExpectError(const absl::StatusOr<LlamaConfig>& c, absl::StatusCode code, const std::string& part) {
  ASSERT_FALSE(c.ok()) << "accepted; expected " << part;
  EXPECT_EQ(c.status().code(), code) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(part));
}

TEST(LlamaConfigTest, MissingAndBadKeys) {
  TinyLlama tiny;
  tiny.omit_keys = {"llama.block_count"};
  ExpectError(ConfigOf(tiny), absl::StatusCode::kNotFound, "'llama.block_count' is missing");
  tiny.omit_keys = {"general.architecture"};
  ExpectError(ConfigOf(tiny), absl::StatusCode::kNotFound, "'general.architecture'");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("general.architecture", "gemma"); }),
              absl::StatusCode::kUnimplemented, "general.architecture is 'gemma'");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetInt32("llama.embedding_length", -64); }),
              absl::StatusCode::kInvalidArgument, "'llama.embedding_length' = -64");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("llama.context_length", "long"); }),
              absl::StatusCode::kInvalidArgument, "'llama.context_length' has type string");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetFloat32("llama.rope.freq_base", -1.0f); }),
              absl::StatusCode::kInvalidArgument, "'llama.rope.freq_base' = -1");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.rope.dimension_count", 17); }),
              absl::StatusCode::kInvalidArgument, "rope.dimension_count 17");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.attention.value_length", 8); }),
              absl::StatusCode::kUnimplemented, "value_length");
}

TEST(LlamaConfigTest, HeadArithmetic) {
  TinyLlama tiny;
  tiny.kv_heads = 3;  // 4 % 3 != 0
  ExpectError(ConfigOf(tiny), absl::StatusCode::kInvalidArgument,
              "head_count 4 is not a multiple of llama.attention.head_count_kv 3");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.attention.head_count", 5); }),
              absl::StatusCode::kInvalidArgument,
              "embedding_length 64 is not a multiple of llama.attention.head_count 5");
  // An explicit key_length sets head_dim, and the tensors must then agree.
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.attention.key_length", 8); }),
              absl::StatusCode::kInvalidArgument,
              "tensor blk.0.attn_q.weight has shape [64, 64], expected [64, 32] (hidden_size, num_heads * head_dim)");
}

TEST(LlamaConfigTest, TensorsMustMatchTheConfig) {
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.block_count", 3); }),
              absl::StatusCode::kNotFound, "tensor blk.2.attn_norm.weight is missing; layer 2 of 3");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.feed_forward_length", 64); }),
              absl::StatusCode::kInvalidArgument, "tensor blk.0.ffn_gate.weight has shape [64, 96], expected [64, 64]");
  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetUint32("llama.vocab_size", 41); }),
              absl::StatusCode::kInvalidArgument, "tensor token_embd.weight has shape [64, 40], expected [64, 41]");
  ExpectError(ConfigOf(TinyLlama(),
                       [](GgufWriter* w) {
                         std::vector<float> v(64 * 32, 0.0f);
                         (void)w->AddTensor("output.weight", {64, 32}, GgmlType::kF32, v);
                       }),
              absl::StatusCode::kInvalidArgument, "tensor output.weight has shape [64, 32], expected [64, 40]");
  TinyLlama zero_layers;
  zero_layers.layers = 0;
  ExpectError(ConfigOf(zero_layers), absl::StatusCode::kInvalidArgument, "'llama.block_count' = 0");
}

TEST(LlamaConfigTest, RopeScaling) {
  auto c = ConfigOf(TinyLlama(), [](GgufWriter* w) {
    w->SetString("llama.rope.scaling.type", "linear");
    w->SetFloat32("llama.rope.scaling.factor", 4.0f);
    w->SetUint32("llama.rope.scaling.original_context_length", 32);
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kLinear);
  EXPECT_EQ(c->rope_scaling_factor, 4.0f);
  EXPECT_EQ(c->rope_original_context_length, 32);

  c = ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("llama.rope.scaling.type", "yarn"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(c->rope_scaling_factor, 1.0f);
  c = ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("llama.rope.scaling.type", "llama3"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kLlama3);
  c = ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("llama.rope.scaling.type", "none"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  c = ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetFloat32("llama.rope.scale_linear", 2.0f); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kLinear);
  EXPECT_EQ(c->rope_scaling_factor, 2.0f);

  ExpectError(ConfigOf(TinyLlama(), [](GgufWriter* w) { w->SetString("llama.rope.scaling.type", "ntk"); }),
              absl::StatusCode::kUnimplemented, "'llama.rope.scaling.type' = 'ntk' is not supported");
  ExpectError(ConfigOf(TinyLlama(),
                       [](GgufWriter* w) {
                         w->SetString("llama.rope.scaling.type", "linear");
                         w->SetFloat32("llama.rope.scaling.factor", 0.0f);
                       }),
              absl::StatusCode::kInvalidArgument, "'llama.rope.scaling.factor' = 0");
}

// The default model tandem serves. tools/setup.sh fetches it into models/.
constexpr char kSmolLm2[] = TANDEM_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(SmolLm2Test, OpensWithTheExpectedConfigAndDequantizesQuickly) {
  if (std::FILE* f = std::fopen(kSmolLm2, "rb")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << kSmolLm2 << " is absent (tools/setup.sh fetches it)";
  }
  const auto start = std::chrono::steady_clock::now();
  auto file = GgufFile::Open(kSmolLm2);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  auto c = ReadLlamaConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rope_dim, 64);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->context_length, 8192);
  EXPECT_EQ(c->rope_freq_base, 100000.0f);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c->tied_embeddings);
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_EQ(embd->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(f.FindTensor("blk.0.attn_q.weight")->type, GgmlType::kQ4_1);
  EXPECT_EQ(f.FindTensor("blk.29.ffn_down.weight")->shape, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.tokens").value().size(), 49152u);
  const auto opened = std::chrono::steady_clock::now();

  // Dequantize every tensor, as loading the model into float32 would.
  int64_t elements = 0;
  std::vector<float> buffer;
  double checksum = 0;
  for (const GgufTensor& t : f.tensors()) {
    buffer.resize(static_cast<size_t>(t.num_elements));
    ASSERT_TRUE(DequantizeRow(t.type, t.data, buffer.data(), t.num_elements).ok()) << t.name;
    checksum += buffer[buffer.size() / 2];
    elements += t.num_elements;
  }
  const auto done = std::chrono::steady_clock::now();
  EXPECT_TRUE(std::isfinite(checksum));
  EXPECT_GT(elements, 130'000'000);
  using Ms = std::chrono::duration<double, std::milli>;
  std::printf("SmolLM2: open + config %.1f ms, dequantize %lld elements %.1f ms\n", Ms(opened - start).count(),
              static_cast<long long>(elements), Ms(done - opened).count());
}

}  // namespace
}  // namespace tandem::gguf
