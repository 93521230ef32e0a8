#include "worker/backends/cpu/quant_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "common/check.h"
#include "common/gguf/ggml_types.h"
#include "worker/backends/cpu/cpu_gemm.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker::cpu {
namespace {

using portable::HalfToFloat;
using portable::LoadLe16;

constexpr int64_t kBlock = portable::kQuantBlockElements;
constexpr int64_t kDequantRows = 64;  // weight rows a DequantGemm task expands
// Bytes of quantized x per chunk of rows that each group of weight rows
// passes over: in L2, not L1 (16 KiB measured 10-25% slower at 64 rows: the
// packed weights then served fewer tiles).
constexpr int64_t kChunkBytes = 65536;

int64_t BlockBytes(int32_t type) {
  switch (type) {
    case portable::kGgmlQ4_0: return portable::kQ4_0BlockBytes;
    case portable::kGgmlQ4_1: return portable::kQ4_1BlockBytes;
    case portable::kGgmlQ8_0: return portable::kQ8_0BlockBytes;
    default: TANDEM_CHECK(false) << "not a quantized format: " << type; return 0;
  }
}

// The 32 integer weights of a block (Q4_1's are 0..15, the others signed).
void BlockInts(int32_t type, const uint8_t* block, int32_t* out) {
  if (type == portable::kGgmlQ8_0) {
    for (int e = 0; e < 32; ++e) out[e] = static_cast<int8_t>(block[2 + e]);
    return;
  }
  const uint8_t* nibbles = block + (type == portable::kGgmlQ4_1 ? 4 : 2);
  const int32_t offset = type == portable::kGgmlQ4_0 ? 8 : 0;
  for (int e = 0; e < 16; ++e) {
    out[e] = (nibbles[e] & 0x0f) - offset;
    out[e + 16] = (nibbles[e] >> 4) - offset;
  }
}

// ---------------------------------------------------------------- packing

// f16 fields per row and block: d, and Q4_1's m.
int HalfFields(int32_t type) { return type == portable::kGgmlQ4_1 ? 2 : 1; }

// Groups per pair.
constexpr int64_t kPairGroups = kPackRows / kGroupRows;

// Bytes from one block of a group to its next, `group_block_bytes` being a
// group's block (kGroupRows rows): past the other group of its pair.
constexpr int64_t GroupStride(int64_t group_block_bytes) { return kPairGroups * group_block_bytes; }

// Where group g (rows 8g..8g+7) of packed weights of `row_bytes` a row
// starts: pairs of groups one after the other, a pair's blocks interleaved,
// so group g's block b sits at the start + b * GroupStride.
inline int64_t GroupOffset(int64_t g, int64_t row_bytes, int64_t group_block_bytes) {
  return g / kPairGroups * kPackRows * row_bytes + g % kPairGroups * group_block_bytes;
}

// Where element e (0..31) of row j of a packed group block sits among the
// kernels' eight 32-byte weight vectors: vector q = e / 4, byte i. Lane j of
// vector q holds row j's quad 4q..4q+3, so one vpdpbusd against x's quad q
// broadcast to every lane (a plain 4-byte broadcast load) adds a quad of
// products of all eight rows, and after the eight vectors lane j holds row
// j's integer sum over the block: no shuffle, and one conversion and one fma
// per block for the eight rows.
struct Slot {
  int q;
  int i;
};
constexpr Slot SlotOf(int j, int e) { return {e / 4, 4 * j + e % 4}; }

// One block of a packed group from the GGUF blocks of its rows (nullptr:
// a padding row, all zero bytes).
void PackBlock(int32_t type, const uint8_t* const src[kGroupRows], uint8_t* out) {
  static constexpr uint8_t kZero[portable::kQ8_0BlockBytes] = {};
  auto block = [&](int j) { return src[j] != nullptr ? src[j] : kZero; };
  const int fields = HalfFields(type);
  for (int f = 0; f < fields; ++f) {
    for (int j = 0; j < kGroupRows; ++j) std::memcpy(out + 2 * (kGroupRows * f + j), block(j) + 2 * f, 2);
  }
  uint8_t* payload = out + 2 * kGroupRows * fields;
  if (type == portable::kGgmlQ8_0) {
    for (int j = 0; j < kGroupRows; ++j) {
      for (int e = 0; e < 32; ++e) payload[32 * SlotOf(j, e).q + SlotOf(j, e).i] = block(j)[2 + e];
    }
    return;
  }
  // GGUF's byte e holds elements e and e + 16 in its low and high nibbles;
  // vectors 2p and 2p + 1 share the 32 bytes at 32p, in the low and high
  // nibbles (one load and three operations unpack two vectors).
  std::memset(payload, 0, 4 * 32);
  for (int j = 0; j < kGroupRows; ++j) {
    for (int e = 0; e < 32; ++e) {
      const uint8_t byte = block(j)[2 * fields + e % 16];
      const int nibble = e < 16 ? byte & 0x0f : byte >> 4;
      const Slot s = SlotOf(j, e);
      payload[32 * (s.q / 2) + s.i] |= static_cast<uint8_t>(nibble << (4 * (s.q % 2)));
    }
  }
}

// Row j's GGUF block from one block of a packed group.
void UnpackBlock(int32_t type, const uint8_t* packed, int j, uint8_t* out) {
  const int fields = HalfFields(type);
  for (int f = 0; f < fields; ++f) std::memcpy(out + 2 * f, packed + 2 * (kGroupRows * f + j), 2);
  const uint8_t* payload = packed + 2 * kGroupRows * fields;
  if (type == portable::kGgmlQ8_0) {
    for (int e = 0; e < 32; ++e) out[2 + e] = payload[32 * SlotOf(j, e).q + SlotOf(j, e).i];
    return;
  }
  std::memset(out + 2 * fields, 0, 16);
  for (int e = 0; e < 32; ++e) {
    const Slot s = SlotOf(j, e);
    const int nibble = (payload[32 * (s.q / 2) + s.i] >> (4 * (s.q % 2))) & 0x0f;
    out[2 * fields + e % 16] |= static_cast<uint8_t>(nibble << (e < 16 ? 0 : 4));
  }
}

// ---------------------------------------------------------------- AVX2

__attribute__((target("avx2,fma,f16c"))) void QuantizeRowAvx2(const float* x, int64_t k, int8_t* q, float* d,
                                                           float* s, int32_t* neg8, int32_t* neg128) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max = _mm_cvtss_f32(m4);
    const float scale = max / 127.0f;
    const __m256 inv = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    __m256i n[4];
    for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // round to nearest even
    const __m256i sum4 = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
    sum = _mm_hadd_epi32(sum, sum);
    sum = _mm_hadd_epi32(sum, sum);
    // Packing works within 128-bit lanes; the permutation restores the order.
    const __m256i n16a = _mm256_packs_epi32(n[0], n[1]);
    const __m256i n16b = _mm256_packs_epi32(n[2], n[3]);
    const __m256i n8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(n16a, n16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kBlock), n8);
    const int32_t total = _mm_cvtsi128_si32(sum);
    d[b] = scale;
    s[b] = scale * static_cast<float>(total);
    neg8[b] = -8 * total;
    neg128[b] = -128 * total;
  }
}

template <int32_t kType>
constexpr int64_t kBlockBytes = kType == portable::kGgmlQ8_0   ? portable::kQ8_0BlockBytes
                                : kType == portable::kGgmlQ4_0 ? portable::kQ4_0BlockBytes
                                                               : portable::kQ4_1BlockBytes;
// Bytes of one block of a packed group (kGroupRows rows) and of its header.
template <int32_t kType>
constexpr int64_t kGroupBlockBytes = kGroupRows * kBlockBytes<kType>;
template <int32_t kType>
constexpr int64_t kGroupStride = GroupStride(kGroupBlockBytes<kType>);
template <int32_t kType>
constexpr int64_t kHeaderBytes = 2 * kGroupRows * (kType == portable::kGgmlQ4_1 ? 2 : 1);

// The group block's eight scales d and (Q4_1) mins m as float32.
__attribute__((target("avx2,fma,f16c"))) inline __m256 LoadGroupScales(const uint8_t* block) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 LoadGroupMins(const uint8_t* block) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * kGroupRows)));
}

// acc + the eight int32 sums of four u8 x s8 products each: maddubs, madd
// and add (no 16-bit pair sum here can saturate: |w| <= 128 against |x| <=
// 127, or nibbles), or one vpdpbusd where the CPU has AVX-512 VNNI: the same
// integers, so the same bits downstream (kVnni; written as inline assembly,
// which this AVX2-target function may hold, and run only after Table() has
// checked the CPU).
template <bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline __m256i DotAdd(__m256i acc, __m256i u, __m256i s) {
  if constexpr (kVnni) {
    asm("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
}

// Whether Q8_0's weights enter the products as w + 128 (unsigned; with VNNI,
// whose sums cannot saturate), the sums starting at -128 * sum(x), or as |w|
// with their signs moved onto x (maddubs' 16-bit pair sums would saturate on
// w + 128): two operations a vector fewer with VNNI.
template <int32_t kType, bool kVnni>
constexpr bool kBiasedQ8 = kType == portable::kGgmlQ8_0 && kVnni;

// Vector q of a group block as the products take it: `u` unsigned (Q4's
// nibbles, Q4_0's being w + 8; Q8_0's w + 128 or |w|) and, for Q8_0 without
// VNNI, `w` the signed weights whose signs move onto x.
struct WeightVector {
  __m256i u;
  __m256i w;
};

// Vectors 2p and 2p + 1 of a group block; with kHighInPlace, Q4's high
// nibbles masked where they are (16 times their value; kUnshiftedHigh).
template <int32_t kType, bool kVnni, bool kHighInPlace = false>
__attribute__((target("avx2,fma,f16c"))) inline void LoadWeightPair(const uint8_t* block, int p, WeightVector* v) {
  const uint8_t* payload = block + kHeaderBytes<kType>;
  if constexpr (kType == portable::kGgmlQ8_0) {
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload + 32 * (2 * p + h)));
      if constexpr (kBiasedQ8<kType, kVnni>) {
        v[h].u = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
      } else {
        v[h].u = _mm256_sign_epi8(w, w);
        v[h].w = w;
      }
    }
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i run = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload + 32 * p));
    v[0].u = _mm256_and_si256(run, low4);
    if constexpr (kHighInPlace) {
      v[1].u = _mm256_andnot_si256(low4, run);
    } else {
      v[1].u = _mm256_and_si256(_mm256_srli_epi16(run, 4), low4);
    }
  }
}

// Whether the GEMV takes Q4's high nibbles in place (w * 16, masked, not
// shifted) into sums of their own, shifted back once per block: exact, and
// one operation a vector fewer. With VNNI only: maddubs' 16-bit pair sums
// would saturate on 240 * 127 * 2.
template <int32_t kType, bool kVnni>
constexpr bool kUnshiftedHigh = kType != portable::kGgmlQ8_0 && kVnni;

// Where a block's integer sums start: -8 * sum(x) for Q4_0's nibbles (w +
// 8), -128 * sum(x) for Q8_0 as w + 128, else 0.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline __m256i SumsStart(const QuantizedRows& x, int64_t at) {
  if constexpr (kType == portable::kGgmlQ4_0) return _mm256_set1_epi32(x.neg8[at]);
  if constexpr (kBiasedQ8<kType, kVnni>) return _mm256_set1_epi32(x.neg128[at]);
  return _mm256_setzero_si256();
}

// x's quad broadcast as vector v's products take it: for Q8_0 without VNNI,
// with the signs of v's weights.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline __m256i SignedQuad(__m256i quad, const WeightVector& v) {
  if constexpr (kType == portable::kGgmlQ8_0 && !kVnni) return _mm256_sign_epi8(quad, v.w);
  return quad;
}

// sums + the products of weight vector q and quad q of x block `xb`.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline __m256i AddQuad(__m256i sums, const WeightVector& v,
                                                                const int8_t* xb, int q) {
  int32_t quad;
  std::memcpy(&quad, xb + 4 * q, 4);
  return DotAdd<kVnni>(sums, v.u, SignedQuad<kType, kVnni>(_mm256_set1_epi32(quad), v));
}

// y[0..7] = acc + Q4_1's min terms (zero for the others), as the reference
// adds them, (+ y).
__attribute__((target("avx2,fma,f16c"))) inline void StoreGroup(__m256 acc, __m256 min, float* y, bool accumulate) {
  __m256 v = _mm256_add_ps(acc, min);
  if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y), v);
  _mm256_storeu_ps(y, v);
}

// ---------------------------------------------------------------- AVX2, one row

// y[8 g + j] (+)= dot(x row i0, row j of group g) for j < 8 and g <
// kGroups, w the start of a pair of groups (or of one group if kGroups is
// 1), for a decode's GEMV. Per block: the header's scales (and Q4_1's mins)
// converted by one instruction each, d_w * d_x by one multiply, Q4_1's min
// term accumulated in the same pass; eight integer products against x's
// quads broadcast, one conversion and one fma for the eight rows. A pair's
// two groups share each broadcast quad and are read as one linear stream
// (their blocks interleave): the kernel is bound by its loads, and one
// group at a time reached 44 GB/s a core in L2; a pair read as two streams
// lost a fifth from DRAM. With VNNI, Q4's high nibbles go in unshifted
// (kUnshiftedHigh: 7-15% less time in L2). The same integers, fma per block
// and min term as TileAvx2, so the same bits. No software prefetch: the
// weights sit in 2 MiB pages, whose linear streams the hardware prefetcher
// follows alone; asking for the next pair as well made batch-1 decode steps
// 2-9% slower (steps alternated one by one in one process, five runs).
template <int32_t kType, bool kVnni, int kGroups>
__attribute__((target("avx2,fma,f16c"))) void GemvGroupAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                        float* y, bool accumulate) {
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  constexpr int64_t kStride = kGroupStride<kType>;
  const int64_t nb = x.k / kBlock;
  const int8_t* xq = x.q.data() + i0 * x.k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xsum = x.s.data() + i0 * nb;
  __m256 acc[kGroups], min[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = min[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kStride;  // group g's at + g * kBytes
    __m256i sums[kGroups], high[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      sums[g] = SumsStart<kType, kVnni>(x, i0 * nb + b);
      high[g] = _mm256_setzero_si256();
    }
    const int8_t* xb = xq + b * kBlock;
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      int32_t quads[2];
      std::memcpy(quads, xb + 8 * p, 8);
      const __m256i s0 = _mm256_set1_epi32(quads[0]);
      const __m256i s1 = _mm256_set1_epi32(quads[1]);
#pragma GCC unroll 2
      for (int g = 0; g < kGroups; ++g) {
        WeightVector v[2];
        LoadWeightPair<kType, kVnni, kUnshiftedHigh<kType, kVnni>>(block + g * kBytes, p, v);
        sums[g] = DotAdd<kVnni>(sums[g], v[0].u, SignedQuad<kType, kVnni>(s0, v[0]));
        __m256i& odd = kUnshiftedHigh<kType, kVnni> ? high[g] : sums[g];
        odd = DotAdd<kVnni>(odd, v[1].u, SignedQuad<kType, kVnni>(s1, v[1]));
      }
    }
    if constexpr (kUnshiftedHigh<kType, kVnni>) {
      // high holds 16 times the high nibbles' sums (every product a multiple
      // of 16), so shifting it back is exact.
      for (int g = 0; g < kGroups; ++g) sums[g] = _mm256_add_epi32(sums[g], _mm256_srai_epi32(high[g], 4));
    }
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const __m256 scale = _mm256_mul_ps(LoadGroupScales(block + g * kBytes), _mm256_set1_ps(xd[b]));
      if constexpr (kType == portable::kGgmlQ4_1) {
        min[g] = _mm256_fmadd_ps(LoadGroupMins(block + g * kBytes), _mm256_set1_ps(xsum[b]), min[g]);
      }
      acc[g] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums[g]), acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) StoreGroup(acc[g], min[g], y + kGroupRows * g, accumulate);
}

// ---------------------------------------------------------------- AVX2, many rows

// A group of weight rows unpacked once for every tile of a chunk of x rows
// (a tile unpacking its own copy spent a third of a batch's time outside the
// integer products): block b's vector q at u[(8 b + q) * 32] (and the signed
// weights at w[...] for Q8_0 without VNNI), its scales and Q4_1's mins as
// float32 at d[8 b + j] and m[8 b + j].
struct PackedGroup {
  std::vector<uint8_t> u, w;
  std::vector<float> d, m;
};

constexpr int64_t kVectorBytes = 8 * 32;  // a block's eight weight vectors

template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void PackGroupAvx2(const uint8_t* w, int64_t nb, PackedGroup* g) {
  if (g->u.size() < static_cast<size_t>(nb * kVectorBytes)) {
    g->u.resize(nb * kVectorBytes);
    g->w.resize(nb * kVectorBytes);
    g->d.resize(nb * kGroupRows);
    g->m.resize(nb * kGroupRows);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kGroupStride<kType>;
    _mm256_storeu_ps(g->d.data() + b * kGroupRows, LoadGroupScales(block));
    if (kType == portable::kGgmlQ4_1) _mm256_storeu_ps(g->m.data() + b * kGroupRows, LoadGroupMins(block));
    for (int p = 0; p < 4; ++p) {
      WeightVector v[2];
      LoadWeightPair<kType, kVnni>(block, p, v);
      for (int h = 0; h < 2; ++h) {
        const int64_t at = b * kVectorBytes + 32 * (2 * p + h);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->u.data() + at), v[h].u);
        if constexpr (kType == portable::kGgmlQ8_0 && !kVnni) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->w.data() + at), v[h].w);
        }
      }
    }
  }
}

// y[i][j] (+)= dot(x row i0 + i, weight row j of a group) for an MR x 8 tile:
// each weight vector is taken once per block (from a PackedGroup if kPacked,
// else unpacked from the group's packed bytes w) for the MR rows of x; each
// row's integer sums converted once and added with one fma per block, Q4_1's
// min term in the same pass. The same bits as GemvGroupAvx2.
template <int32_t kType, int MR, bool kVnni, bool kPacked>
__attribute__((target("avx2,fma,f16c"))) void TileAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                   const PackedGroup* g, float* y, int64_t ldy, bool accumulate) {
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xsum = x.s.data() + i0 * nb;
  __m256 acc[MR], min[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i] = min[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = nullptr;  // unpacked from w unless kPacked
    if constexpr (!kPacked) block = w + b * kGroupStride<kType>;
    __m256i sums[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) sums[i] = SumsStart<kType, kVnni>(x, (i0 + i) * nb + b);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      WeightVector v[2];
      if constexpr (kPacked) {
        for (int h = 0; h < 2; ++h) {
          const int64_t at = b * kVectorBytes + 32 * (2 * p + h);
          v[h].u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g->u.data() + at));
          if constexpr (kType == portable::kGgmlQ8_0 && !kVnni) {
            v[h].w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g->w.data() + at));
          }
        }
      } else {
        LoadWeightPair<kType, kVnni>(block, p, v);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        sums[i] = AddQuad<kType, kVnni>(sums[i], v[0], xq + i * k + b * kBlock, 2 * p);
        sums[i] = AddQuad<kType, kVnni>(sums[i], v[1], xq + i * k + b * kBlock, 2 * p + 1);
      }
    }
    const __m256 wd = kPacked ? _mm256_loadu_ps(g->d.data() + b * kGroupRows) : LoadGroupScales(block);
    __m256 m = _mm256_setzero_ps();
    if constexpr (kType == portable::kGgmlQ4_1) {
      m = kPacked ? _mm256_loadu_ps(g->m.data() + b * kGroupRows) : LoadGroupMins(block);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const int64_t at = i * nb + b;
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(wd, _mm256_set1_ps(xd[at])), _mm256_cvtepi32_ps(sums[i]), acc[i]);
      if constexpr (kType == portable::kGgmlQ4_1) min[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[at]), min[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) StoreGroup(acc[i], min[i], y + i * ldy, accumulate);
}

// TileAvx2 for two groups of weight rows at once, with VNNI: each broadcast
// quad of x feeds two products and each weight vector MR, and the MR x 2
// integer sums are independent chains (vpdpbusd takes 4 cycles and issues
// two a cycle on Zen 4: TileAvx2's MR chains of eight per block ran about
// one every two cycles). The groups come from PackedGroups g[0] and g[1]
// (kPacked) or from the packed pair at w. Compiled for AVX-512VL, which the
// VNNI path has, for its 32 vector registers (the sums, float accumulators
// and Q4_1 min terms do not fit in 16). Each (row, group) takes the same
// operations in the same order as TileAvx2: the same bits.
template <int32_t kType, int MR, bool kPacked>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"))) void TilePairVnni(
    const QuantizedRows& x, int64_t i0, const uint8_t* w, const PackedGroup* const g[2], float* y, int64_t ldy,
    bool accumulate) {
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xsum = x.s.data() + i0 * nb;
  __m256 acc[MR][2], min[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) acc[i][h] = min[i][h] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = nullptr;  // the pair's block b unless kPacked
    if constexpr (!kPacked) block = w + b * kGroupStride<kType>;
    __m256i sums[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) sums[i][0] = sums[i][1] = SumsStart<kType, true>(x, (i0 + i) * nb + b);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      WeightVector v[2][2];  // group h's vectors 2p and 2p + 1
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        if constexpr (kPacked) {
#pragma GCC unroll 2
          for (int e = 0; e < 2; ++e) {
            v[h][e].u = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(g[h]->u.data() + b * kVectorBytes + 32 * (2 * p + e)));
          }
        } else {
          LoadWeightPair<kType, true>(block + h * kBytes, p, v[h]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        int32_t quads[2];
        std::memcpy(quads, xq + i * k + b * kBlock + 8 * p, 8);
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const __m256i s = _mm256_set1_epi32(quads[e]);
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) sums[i][h] = _mm256_dpbusd_epi32(sums[i][h], v[h][e].u, s);
        }
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 wd = kPacked ? _mm256_loadu_ps(g[h]->d.data() + b * kGroupRows) : LoadGroupScales(block + h * kBytes);
      __m256 m = _mm256_setzero_ps();
      if constexpr (kType == portable::kGgmlQ4_1) {
        m = kPacked ? _mm256_loadu_ps(g[h]->m.data() + b * kGroupRows) : LoadGroupMins(block + h * kBytes);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const int64_t at = i * nb + b;
        acc[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(wd, _mm256_set1_ps(xd[at])), _mm256_cvtepi32_ps(sums[i][h]),
                                    acc[i][h]);
        if constexpr (kType == portable::kGgmlQ4_1) {
          min[i][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[at]), min[i][h]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) StoreGroup(acc[i][h], min[i][h], y + i * ldy + kGroupRows * h, accumulate);
  }
}

// The last group of a matrix whose rows are not a multiple of kGroupRows
// (padded with zero rows): one row of x at a time into a full-width buffer,
// of which the real rows' results are copied out.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void RaggedGroupAvx2(const QuantizedRows& x, int64_t i_begin,
                                                           int64_t i_end, const uint8_t* w, int64_t rows, float* y,
                                                           int64_t ldy, bool accumulate) {
  for (int64_t i = i_begin; i < i_end; ++i) {
    float out[kGroupRows] = {};
    if (accumulate) std::copy(y + i * ldy, y + i * ldy + rows, out);
    GemvGroupAvx2<kType, kVnni, 1>(x, i, w, out, accumulate);
    std::copy(out, out + rows, y + i * ldy);
  }
}

// Rows [c, c_end) of x, 2 to 5 of them, against the first `full` (a
// multiple of kGroupRows) packed weight rows at w, with VNNI: every row in
// TilePairVnni tiles straight from the packed pairs, so each pair is read
// once for all of them (3 x 8 tiles and a GEMV for the rows left over read
// it twice, at three times fewer products a weight load); an odd last group
// a row at a time.
template <int32_t kType>
void FewRowsVnni(const QuantizedRows& x, int64_t c, int64_t c_end, const uint8_t* w, int64_t full,
                 int64_t row_bytes, float* y, int64_t ldy, bool accumulate) {
  auto group_at = [&](int64_t j) { return w + GroupOffset(j / kGroupRows, row_bytes, kGroupBlockBytes<kType>); };
  int64_t j = 0;
  for (; j + kPackRows <= full; j += kPackRows) {
    int64_t i = c;
    if (c_end - i >= 4) {
      TilePairVnni<kType, 4, false>(x, i, group_at(j), nullptr, y + i * ldy + j, ldy, accumulate);
      i += 4;
    } else if (c_end - i == 3) {
      TilePairVnni<kType, 3, false>(x, i, group_at(j), nullptr, y + i * ldy + j, ldy, accumulate);
      i += 3;
    }
    if (c_end - i >= 2) {
      TilePairVnni<kType, 2, false>(x, i, group_at(j), nullptr, y + i * ldy + j, ldy, accumulate);
      i += 2;
    }
    if (i < c_end) TilePairVnni<kType, 1, false>(x, i, group_at(j), nullptr, y + i * ldy + j, ldy, accumulate);
  }
  if (j == full) return;
  for (int64_t i = c; i < c_end; ++i) GemvGroupAvx2<kType, true, 1>(x, i, group_at(j), y + i * ldy + j, accumulate);
}

// Rows [i_begin, i_end) of x against `rows` packed weight rows (from a pair
// boundary), in chunks of x rows that stay in L2 while each group of weight
// rows passes over them.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void RowsAvx2(const QuantizedRows& x, int64_t i_begin, int64_t i_end,
                                                        const uint8_t* w, int64_t rows, int64_t row_bytes, float* y,
                                                        int64_t ldy, bool accumulate) {
  constexpr int kMR = 3;
  // From this many rows of x in a chunk, each group of weight rows is
  // unpacked once for the chunk (PackedGroup) rather than once per tile.
  constexpr int64_t kPackedMinRows = 6;
  const int64_t full = rows / kGroupRows * kGroupRows;
  auto group_at = [&](int64_t j) { return w + GroupOffset(j / kGroupRows, row_bytes, kGroupBlockBytes<kType>); };
  const int64_t chunk = std::max<int64_t>(kMR, kChunkBytes / x.k / kMR * kMR);
  for (int64_t c = i_begin; c < i_end; c += chunk) {
    const int64_t c_end = std::min(i_end, c + chunk);
    if (c_end - c >= kPackedMinRows) {
      thread_local PackedGroup group;
      int64_t j0 = 0;
      if constexpr (kVnni) {
        // Two groups at a time (TilePairVnni), the odd one last on its own.
        thread_local PackedGroup second;
        const PackedGroup* const pair[2] = {&group, &second};
        for (; j0 + 2 * kGroupRows <= full; j0 += 2 * kGroupRows) {
          PackGroupAvx2<kType, kVnni>(group_at(j0), x.k / kBlock, &group);
          PackGroupAvx2<kType, kVnni>(group_at(j0 + kGroupRows), x.k / kBlock, &second);
          int64_t i = c;
          for (; i + kMR <= c_end; i += kMR) {
            TilePairVnni<kType, kMR, true>(x, i, nullptr, pair, y + i * ldy + j0, ldy, accumulate);
          }
          for (; i < c_end; ++i) TilePairVnni<kType, 1, true>(x, i, nullptr, pair, y + i * ldy + j0, ldy, accumulate);
        }
      }
      for (int64_t j = j0; j < full; j += kGroupRows) {
        PackGroupAvx2<kType, kVnni>(group_at(j), x.k / kBlock, &group);
        int64_t i = c;
        for (; i + kMR <= c_end; i += kMR) {
          TileAvx2<kType, kMR, kVnni, true>(x, i, nullptr, &group, y + i * ldy + j, ldy, accumulate);
        }
        for (; i < c_end; ++i) TileAvx2<kType, 1, kVnni, true>(x, i, nullptr, &group, y + i * ldy + j, ldy, accumulate);
      }
    } else if (kVnni && c_end - c >= 2) {
      if constexpr (kVnni) FewRowsVnni<kType>(x, c, c_end, w, full, row_bytes, y, ldy, accumulate);
    } else {
      const int64_t tiled = c + (c_end - c) / kMR * kMR;
      for (int64_t j = 0; j < full; j += kGroupRows) {
        for (int64_t i = c; i < tiled; i += kMR) {
          TileAvx2<kType, kMR, kVnni, false>(x, i, group_at(j), nullptr, y + i * ldy + j, ldy, accumulate);
        }
      }
      // The rows left over from tiles, a pair of groups at a time.
      for (int64_t i = tiled; i < c_end; ++i) {
        int64_t j = 0;
        for (; j + kPackRows <= full; j += kPackRows) {
          GemvGroupAvx2<kType, kVnni, 2>(x, i, group_at(j), y + i * ldy + j, accumulate);
        }
        if (j < full) GemvGroupAvx2<kType, kVnni, 1>(x, i, group_at(j), y + i * ldy + j, accumulate);
      }
    }
    if (full < rows) RaggedGroupAvx2<kType, kVnni>(x, c, c_end, group_at(full), rows - full, y + full, ldy, accumulate);
  }
}

// ---------------------------------------------------------------- scalar

void RowsReference(const QuantizedRows& x, int64_t i_begin, int64_t i_end, const uint8_t* w, int32_t type,
                   int64_t rows, int64_t row_bytes, float* y, int64_t ldy, bool accumulate) {
  std::vector<uint8_t> row(row_bytes);
  for (int64_t j = 0; j < rows; ++j) {
    UnpackWeightRow(type, w, x.k, j, row.data());
    for (int64_t i = i_begin; i < i_end; ++i) {
      const float v = QuantDotReference(x, i, row.data(), type);
      float& out = y[i * ldy + j];
      out = accumulate ? out + v : v;
    }
  }
}

// QuantizeRowReference and the bias starts (QuantizedRows::neg8, neg128).
void QuantizeRowBiasReference(const float* x, int64_t k, int8_t* q, float* d, float* s, int32_t* neg8,
                              int32_t* neg128) {
  QuantizeRowReference(x, k, q, d, s);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) sum += q[b * kBlock + e];
    neg8[b] = -8 * sum;
    neg128[b] = -128 * sum;
  }
}

// ---------------------------------------------------------------- dispatch

using RowsFn = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t,
                        bool);

struct Dispatch {
  bool avx2 = false;
  bool vnni = false;
  void (*quantize)(const float*, int64_t, int8_t*, float*, float*, int32_t*, int32_t*) = QuantizeRowBiasReference;
  RowsFn q4_0 = nullptr;
  RowsFn q4_1 = nullptr;
  RowsFn q8_0 = nullptr;
};

// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c").
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

template <bool kVnni>
constexpr Dispatch kAvx2Table{true,
                              kVnni,
                              QuantizeRowAvx2,
                              RowsAvx2<portable::kGgmlQ4_0, kVnni>,
                              RowsAvx2<portable::kGgmlQ4_1, kVnni>,
                              RowsAvx2<portable::kGgmlQ8_0, kVnni>};
constexpr Dispatch kReferenceTable{};

// The best kernels this CPU runs, decided once.
const Dispatch* Best() {
  static const Dispatch* const best = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !HasF16c()) return &kReferenceTable;
    // vpdpbusd on 256-bit registers: AVX512_VNNI with AVX512VL (the EVEX
    // form the assembler emits).
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) return &kAvx2Table<true>;
    return &kAvx2Table<false>;
  }();
  return best;
}

// A test's choice in place of Best(), if any.
std::atomic<const Dispatch*> g_test_table{nullptr};

const Dispatch& Table() {
  const Dispatch* t = g_test_table.load(std::memory_order_acquire);
  return t != nullptr ? *t : *Best();
}

// Weight rows per task, whole pairs of groups: few rows for few rows of x,
// so that a decode's small matrices still split over every thread.
int64_t RowsPerTask(int64_t m, int64_t n, int32_t threads) {
  const int64_t rows = m <= 4 ? kPackRows : 64;
  const int64_t balanced = (n + 4 * threads - 1) / (4 * threads);
  return std::max<int64_t>(kPackRows, std::min(rows, (balanced + kPackRows - 1) / kPackRows * kPackRows));
}

}  // namespace

bool IsQuantizedFormat(int32_t type) {
  return type == portable::kGgmlQ4_0 || type == portable::kGgmlQ4_1 || type == portable::kGgmlQ8_0;
}

int64_t QuantizedRowBytes(int32_t type, int64_t k) { return k / kBlock * BlockBytes(type); }

int64_t PackedWeightBytes(int32_t type, int64_t n, int64_t k) {
  return (n + kPackRows - 1) / kPackRows * kPackRows * QuantizedRowBytes(type, k);
}

void PackWeightRows(int32_t type, const uint8_t* rows, int64_t n, int64_t k, uint8_t* out) {
  const int64_t bytes = BlockBytes(type);
  const int64_t row_bytes = QuantizedRowBytes(type, k);
  // Every group of the last pair, padding included.
  const int64_t groups = (n + kPackRows - 1) / kPackRows * kPairGroups;
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* group = out + GroupOffset(g, row_bytes, kGroupRows * bytes);
    for (int64_t b = 0; b < k / kBlock; ++b) {
      const uint8_t* src[kGroupRows];
      for (int j = 0; j < kGroupRows; ++j) {
        const int64_t r = kGroupRows * g + j;
        src[j] = r < n ? rows + r * row_bytes + b * bytes : nullptr;
      }
      PackBlock(type, src, group + b * GroupStride(kGroupRows * bytes));
    }
  }
}

void UnpackWeightRow(int32_t type, const uint8_t* packed, int64_t k, int64_t row, uint8_t* out) {
  const int64_t bytes = BlockBytes(type);
  const uint8_t* group = packed + GroupOffset(row / kGroupRows, QuantizedRowBytes(type, k), kGroupRows * bytes);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    UnpackBlock(type, group + b * GroupStride(kGroupRows * bytes), static_cast<int>(row % kGroupRows), out + b * bytes);
  }
}

void QuantizeRowReference(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float max = 0.0f;
    for (int e = 0; e < kBlock; ++e) max = std::max(max, std::fabs(xb[e]));
    const float scale = max / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[e] * inv));
      q[b * kBlock + e] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = scale;
    s[b] = scale * static_cast<float>(sum);
  }
}

namespace {

// `out` shaped for m rows of k (its vectors grown as needed).
void ShapeRows(int64_t m, int64_t k, QuantizedRows* out) {
  TANDEM_CHECK(k % kBlock == 0) << k;
  const int64_t nb = k / kBlock;
  out->m = m;
  out->k = k;
  if (out->q.size() < static_cast<size_t>(m * k)) {
    out->q.resize(m * k);
    out->d.resize(m * nb);
    out->s.resize(m * nb);
    out->neg8.resize(m * nb);
    out->neg128.resize(m * nb);
  }
}

// Rows [begin, end) of x into `out` (shaped).
void QuantizeRange(const float* x, int64_t begin, int64_t end, QuantizedRows* out) {
  const auto quantize = Table().quantize;
  const int64_t k = out->k;
  const int64_t nb = k / kBlock;
  for (int64_t i = begin; i < end; ++i) {
    quantize(x + i * k, k, out->q.data() + i * k, out->d.data() + i * nb, out->s.data() + i * nb,
             out->neg8.data() + i * nb, out->neg128.data() + i * nb);
  }
}

}  // namespace

void QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t k, QuantizedRows* out) {
  ShapeRows(m, k, out);
  pool.ParallelFor(m, std::max<int64_t>(1, 16384 / k),
                   [&](int64_t begin, int64_t end, int32_t) { QuantizeRange(x, begin, end, out); });
}

float QuantDotReference(const QuantizedRows& x, int64_t i, const uint8_t* w_row, int32_t type) {
  const int64_t nb = x.k / kBlock;
  const int64_t bytes = BlockBytes(type);
  const int8_t* xq = x.q.data() + i * x.k;
  float dot = 0.0f;
  float min_term = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w_row + b * bytes;
    int32_t wq[kBlock];
    BlockInts(type, block, wq);
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) sum += wq[e] * xq[b * kBlock + e];
    dot = std::fma(HalfToFloat(LoadLe16(block)) * x.d[i * nb + b], static_cast<float>(sum), dot);
  }
  if (type == portable::kGgmlQ4_1) {
    for (int64_t b = 0; b < nb; ++b) {
      min_term = std::fma(HalfToFloat(LoadLe16(w_row + b * bytes + 2)), x.s[i * nb + b], min_term);
    }
  }
  return dot + min_term;
}

void QuantGemm(ThreadPool& pool, const QuantizedRows& x, const uint8_t* w, int32_t type, int64_t n, float* y,
               bool accumulate) {
  const QuantGemmOutput output{w, type, n, y, accumulate};
  QuantGemmGroup(pool, x, &output, 1);
}

namespace {

// The tasks of one QuantGemmGroup loop: each a run of per_task weight rows
// of one output, tasks [first_task[o], first_task[o + 1]) covering output o.
struct GemmTasks {
  GemmTasks(int64_t m, const QuantGemmOutput* outputs, int32_t count, int32_t threads)
      : outputs(outputs), first_task(count + 1, 0) {
    int64_t total_rows = 0;
    for (int32_t o = 0; o < count; ++o) total_rows += outputs[o].n;
    per_task = RowsPerTask(m, total_rows, threads);
    for (int32_t o = 0; o < count; ++o) first_task[o + 1] = first_task[o] + (outputs[o].n + per_task - 1) / per_task;
  }
  int64_t count() const { return first_task.back(); }

  // Runs tasks [begin, end) on x.
  void Run(const QuantizedRows& x, int64_t begin, int64_t end) const {
    const Dispatch& t = Table();
    int32_t o = 0;
    for (int64_t task = begin; task < end; ++task) {
      while (task >= first_task[o + 1]) ++o;
      const QuantGemmOutput& out = outputs[o];
      const int64_t row_bytes = QuantizedRowBytes(out.ggml_type, x.k);
      const RowsFn rows_fn = out.ggml_type == portable::kGgmlQ4_0   ? t.q4_0
                             : out.ggml_type == portable::kGgmlQ4_1 ? t.q4_1
                                                                    : t.q8_0;
      const int64_t j = (task - first_task[o]) * per_task;
      const int64_t rows = std::min(per_task, out.n - j);
      if (rows_fn != nullptr) {
        rows_fn(x, 0, x.m, out.w + j * row_bytes, rows, row_bytes, out.y + j, out.n, out.accumulate);
      } else {
        RowsReference(x, 0, x.m, out.w + j * row_bytes, out.ggml_type, rows, row_bytes, out.y + j, out.n,
                      out.accumulate);
      }
    }
  }

  const QuantGemmOutput* outputs;
  int64_t per_task = 0;
  absl::InlinedVector<int64_t, 4> first_task;
};

}  // namespace

void QuantGemmGroup(ThreadPool& pool, const QuantizedRows& x, const QuantGemmOutput* outputs, int32_t count) {
  const GemmTasks tasks(x.m, outputs, count, pool.num_threads());
  pool.ParallelFor(tasks.count(), 1, [&](int64_t begin, int64_t end, int32_t) { tasks.Run(x, begin, end); });
}

void QuantGemmFloat(ThreadPool& pool, const float* x, int64_t m, int64_t k, const QuantGemmOutput* outputs,
                    int32_t count, QuantGemmScratch* scratch) {
  if (m > kOwnQuantizeMaxRows) {
    QuantizeRows(pool, x, m, k, &scratch->shared);
    QuantGemmGroup(pool, scratch->shared, outputs, count);
    return;
  }
  if (scratch->threads.size() != static_cast<size_t>(pool.num_threads())) {
    scratch->threads = std::vector<QuantGemmScratch::Thread>(pool.num_threads());
  }
  // A thread knows whether its x is this call's by the call's number, which
  // only this (the submitting) thread writes, before the loop starts.
  const uint64_t call = ++scratch->calls;
  const GemmTasks tasks(m, outputs, count, pool.num_threads());
  pool.ParallelFor(tasks.count(), 1, [&](int64_t begin, int64_t end, int32_t thread) {
    QuantGemmScratch::Thread& own = scratch->threads[thread];
    if (own.call != call) {
      ShapeRows(m, k, &own.x);
      QuantizeRange(x, 0, m, &own.x);
      own.call = call;
    }
    tasks.Run(own.x, begin, end);
  });
}

void DequantGemm(ThreadPool& pool, const float* x, int64_t m, const uint8_t* w, int32_t type, int64_t n, int64_t k,
                 float* y, bool accumulate, std::vector<std::vector<float>>* scratch) {
  const int64_t row_bytes = QuantizedRowBytes(type, k);
  scratch->resize(pool.num_threads());
  const int64_t tasks = (n + kDequantRows - 1) / kDequantRows;
  pool.ParallelFor(tasks, 1, [&](int64_t begin, int64_t end, int32_t thread) {
    std::vector<float>& tile = (*scratch)[thread];
    tile.resize(kDequantRows * k);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t j = task * kDequantRows;
      const int64_t rows = std::min(kDequantRows, n - j);
      thread_local std::vector<uint8_t> row;  // a weight row back in its GGUF blocks
      row.resize(row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        // The float path of old: the same values as a weight expanded at load.
        UnpackWeightRow(type, w, k, j + r, row.data());
        const absl::Status s = gguf::DequantizeRow(static_cast<gguf::GgmlType>(type), row.data(),
                                                   tile.data() + r * k, k);
        TANDEM_CHECK(s.ok()) << s;
      }
      GemmRows(x, m, tile.data(), rows, k, y + j, n, accumulate);
    }
  });
}

bool UsingQuantAvx2() { return Table().avx2; }

bool UsingQuantVnni() { return Table().vnni; }

void AllowQuantVnniForTest(bool allowed) {
  g_test_table.store(!allowed && Best()->vnni ? &kAvx2Table<false> : nullptr, std::memory_order_release);
}

}  // namespace tandem::worker::cpu
