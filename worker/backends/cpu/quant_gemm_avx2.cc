// The AVX2 kernels of quant_gemm.h: activation quantization, the decode
// GEMV, the 3 x 8 tiles and (with VNNI) the two-group tiles, on weights
// packed as quant_gemm.h describes. Each is bit-identical to the scalar
// reference in quant_gemm.cc.
#include "worker/backends/cpu/quant_gemm_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "worker/backends/cpu/prefetch.h"

namespace tandem::worker::cpu {
namespace {

// Bytes of quantized x per chunk of rows that each group of weight rows
// passes over: in L2, not L1 (16 KiB measured 10-25% slower at 64 rows: the
// packed weights then served fewer tiles).
constexpr int64_t kChunkBytes = 65536;

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

// How far ahead the kernels that read packed weights straight from memory
// prefetch them; see quant_gemm.h, QuantPrefetchBytes.
int64_t DefaultPrefetchBytes() {
  __builtin_cpu_init();  // may run before main
  return __builtin_cpu_is("intel") ? 2560 : 0;
}
std::atomic<int64_t> g_prefetch_bytes{DefaultPrefetchBytes()};

// Asks for the kBytes at `ahead` bytes past p (the same stretch of the
// weights a step later), unless ahead is 0.
template <int64_t kBytes>
inline void PrefetchAhead(const uint8_t* p, int64_t ahead) {
  if (ahead == 0) return;
  for (int64_t line = 0; line < kBytes; line += 64) {
    PrefetchT1(p + ahead + line);
  }
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
// (their blocks interleave), each group's header and then its runs, so that
// the loads go through memory in address order (group by group rather than
// run by run, the GEMV from beyond the caches read 0.75-0.78 of the bare
// reader's bandwidth instead of 0.67-0.69, BM_GemvFar, no prefetches): the
// kernel is bound by its loads, and one
// group at a time reached 44 GB/s a core in L2; a pair read as two streams
// lost a fifth from DRAM. With VNNI, Q4's high nibbles go in unshifted
// (kUnshiftedHigh: 7-15% less time in L2). The same integers, fma per block
// and min term as TileAvx2, so the same bits. Software prefetches run
// QuantPrefetchBytes ahead of the stream (quant_gemm.h). Not kept: the
// pair of groups in one 512-bit vector (a load and an insert per run, each
// mask, vpdpbusd and fma for sixteen rows), the same bits but no faster on
// the Xeon VM: 2,048 Q4_1 rows in L2 9.5-10.0 us against 9.3-9.5, Q8_0
// 11.0 against 9.8, batch-1 steps alternated 0.995-1.000 of the time.
template <int32_t kType, bool kVnni, int kGroups>
__attribute__((target("avx2,fma,f16c"))) void GemvGroupAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                        float* y, bool accumulate) {
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  constexpr int64_t kStride = kGroupStride<kType>;
  const int64_t nb = x.k / kBlock;
  const int8_t* xq = x.q.data() + i0 * x.k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xsum = x.s.data() + i0 * nb;
  const int64_t ahead = g_prefetch_bytes.load(std::memory_order_relaxed);
  __m256 acc[kGroups], min[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = min[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kStride;  // group g's at + g * kBytes
    PrefetchAhead<kStride * kGroups / kPairGroups>(block, ahead);
    const int8_t* xb = xq + b * kBlock;
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const uint8_t* group = block + g * kBytes;
      const __m256 scale = _mm256_mul_ps(LoadGroupScales(group), _mm256_set1_ps(xd[b]));
      if constexpr (kType == portable::kGgmlQ4_1) {
        min[g] = _mm256_fmadd_ps(LoadGroupMins(group), _mm256_set1_ps(xsum[b]), min[g]);
      }
      __m256i sums = SumsStart<kType, kVnni>(x, i0 * nb + b);
      __m256i high = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        int32_t quads[2];
        std::memcpy(quads, xb + 8 * p, 8);
        WeightVector v[2];
        LoadWeightPair<kType, kVnni, kUnshiftedHigh<kType, kVnni>>(group, p, v);
        sums = DotAdd<kVnni>(sums, v[0].u, SignedQuad<kType, kVnni>(_mm256_set1_epi32(quads[0]), v[0]));
        __m256i& odd = kUnshiftedHigh<kType, kVnni> ? high : sums;
        odd = DotAdd<kVnni>(odd, v[1].u, SignedQuad<kType, kVnni>(_mm256_set1_epi32(quads[1]), v[1]));
      }
      // high holds 16 times the high nibbles' sums (every product a multiple
      // of 16), so shifting it back is exact.
      if constexpr (kUnshiftedHigh<kType, kVnni>) sums = _mm256_add_epi32(sums, _mm256_srai_epi32(high, 4));
      acc[g] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[g]);
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
  const int64_t ahead = g_prefetch_bytes.load(std::memory_order_relaxed);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kGroupStride<kType>;
    PrefetchAhead<kGroupBlockBytes<kType>>(block, ahead);
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
  const int64_t ahead = kPacked ? 0 : g_prefetch_bytes.load(std::memory_order_relaxed);
  __m256 acc[MR][2], min[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) acc[i][h] = min[i][h] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = nullptr;  // the pair's block b unless kPacked
    if constexpr (!kPacked) {
      block = w + b * kGroupStride<kType>;
      PrefetchAhead<kGroupStride<kType>>(block, ahead);
    }
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

}  // namespace

int64_t QuantPrefetchBytes() { return g_prefetch_bytes.load(std::memory_order_relaxed); }

void SetQuantPrefetchBytes(int64_t bytes) { g_prefetch_bytes.store(bytes, std::memory_order_relaxed); }

const Avx2Kernels& QuantKernelsAvx2(bool vnni) {
  static constexpr Avx2Kernels kPlain{QuantizeRowAvx2, RowsAvx2<portable::kGgmlQ4_0, false>,
                                      RowsAvx2<portable::kGgmlQ4_1, false>, RowsAvx2<portable::kGgmlQ8_0, false>};
  static constexpr Avx2Kernels kVnni{QuantizeRowAvx2, RowsAvx2<portable::kGgmlQ4_0, true>,
                                     RowsAvx2<portable::kGgmlQ4_1, true>, RowsAvx2<portable::kGgmlQ8_0, true>};
  return vnni ? kVnni : kPlain;
}

}  // namespace tandem::worker::cpu
