// The device's RoPE math (rope.h), run on the host, gives CpuBackend::Rope's
// results bit for bit: random heads and positions, rope_dim below and equal
// to head_dim, with and without linear scaling, GQA shapes.
#include "worker/backends/portable/rope.h"

#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"

namespace tandem::worker::portable {
namespace {

struct Shape {
  int32_t num_tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t rope_dim;
  float freq_base;
  float freq_scale;
  int32_t max_position;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.num_tokens << " tokens, heads " << s.num_heads << "/" << s.num_kv_heads << ", head_dim " << s.head_dim
      << ", rope_dim " << s.rope_dim << ", base " << s.freq_base << ", scale " << s.freq_scale;
}

const Shape kShapes[] = {Shape{17, 4, 2, 64, 64, 10000.0f, 1.0f, 4095}, Shape{9, 9, 3, 64, 32, 10000.0f, 1.0f, 8191},
                         Shape{12, 8, 8, 128, 128, 500000.0f, 0.25f, 32767},
                         Shape{5, 6, 2, 80, 48, 10000.0f, 0.5f, 2047}, Shape{3, 2, 1, 16, 0, 10000.0f, 1.0f, 100}};

// Rotates random heads at random positions with `cpu` and with RopeHead.
void ExpectHostModelMatches(const Shape& s, uint32_t seed, CpuBackend& cpu) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> position(0, s.max_position);
  std::vector<float> q(static_cast<size_t>(s.num_tokens) * s.num_heads * s.head_dim);
  std::vector<float> k(static_cast<size_t>(s.num_tokens) * s.num_kv_heads * s.head_dim);
  std::vector<int32_t> positions(s.num_tokens);
  for (float& v : q) v = normal(rng);
  for (float& v : k) v = normal(rng);
  for (int32_t& p : positions) p = position(rng);
  positions[0] = 0;
  positions[s.num_tokens - 1] = s.max_position;

  std::vector<float> cpu_q = q, cpu_k = k;
  ASSERT_TRUE(cpu.Rope({cpu_q.data(), cpu_k.data(), positions.data(), s.num_tokens, s.num_heads, s.num_kv_heads,
                        s.head_dim, s.rope_dim, s.freq_base, s.freq_scale})
                  .ok());
  for (int32_t t = 0; t < s.num_tokens; ++t) {
    for (int32_t h = 0; h < s.num_heads; ++h) {
      RopeHead(q.data() + (static_cast<size_t>(t) * s.num_heads + h) * s.head_dim, s.rope_dim, positions[t],
               s.freq_base, s.freq_scale);
    }
    for (int32_t h = 0; h < s.num_kv_heads; ++h) {
      RopeHead(k.data() + (static_cast<size_t>(t) * s.num_kv_heads + h) * s.head_dim, s.rope_dim, positions[t],
               s.freq_base, s.freq_scale);
    }
  }
  // Bit-exact: the same float operations in the same order with the same
  // libm. The dims past rope_dim are untouched by both.
  ASSERT_EQ(std::memcmp(q.data(), cpu_q.data(), q.size() * sizeof(float)), 0);
  ASSERT_EQ(std::memcmp(k.data(), cpu_k.data(), k.size() * sizeof(float)), 0);
}

class RopeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(RopeTest, HostModelMatchesCpuBackendBitForBit) {
  const Shape s = GetParam();
  CpuBackend cpu(2);
  ExpectHostModelMatches(s, static_cast<uint32_t>(s.head_dim * 131 + s.rope_dim), cpu);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest, ::testing::ValuesIn(kShapes));

// CpuBackend keeps its cos/sin and inverse frequencies across calls (once a
// step for all layers): one backend through every shape, each twice at new
// positions and then at the same ones, must match as a fresh one does.
TEST(RopeTablesTest, OneBackendAcrossShapesAndPositionsMatchesTheHostModel) {
  CpuBackend cpu(2);
  for (int round = 0; round < 2; ++round) {
    for (const Shape& s : kShapes) {
      for (uint32_t seed : {1u, 2u, 2u}) ExpectHostModelMatches(s, seed + 17u * static_cast<uint32_t>(s.head_dim), cpu);
    }
  }
}

TEST(RopeMathTest, PositionZeroIsTheIdentity) {
  float head[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  RopeHead(head, 8, 0, 10000.0f, 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(head[i], static_cast<float>(i + 1));
}

TEST(RopeMathTest, FirstPairTurnsByThePositionInRadians) {
  EXPECT_EQ(RopeInvFreq(10000.0f, 0, 64), 1.0f);
  EXPECT_FLOAT_EQ(RopeInvFreq(10000.0f, 16, 64), 0.01f);
  float c, s;
  RopeCosSin(3, 1.0f, RopeInvFreq(10000.0f, 0, 64), &c, &s);
  EXPECT_FLOAT_EQ(c, std::cos(3.0f));
  EXPECT_FLOAT_EQ(s, std::sin(3.0f));
  RopeCosSin(6, 0.5f, 1.0f, &c, &s);  // linear scaling halves the position
  EXPECT_FLOAT_EQ(c, std::cos(3.0f));
}

}  // namespace
}  // namespace tandem::worker::portable
