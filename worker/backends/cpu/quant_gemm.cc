#include "worker/backends/cpu/quant_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

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

// The AVX2 reduction order: (a0+a4)+(a2+a6) + (a1+a5)+(a3+a7).
float SumLanes(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// ---------------------------------------------------------------- AVX2

__attribute__((target("avx2,fma,f16c"))) inline float SumAvx2(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma,f16c"))) void QuantizeRowAvx2(const float* x, int64_t k, int8_t* q, float* d,
                                                           float* s) {
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
    d[b] = scale;
    s[b] = scale * static_cast<float>(_mm_cvtsi128_si32(sum));
  }
}

template <int32_t kType>
constexpr int64_t kBlockBytes = kType == portable::kGgmlQ8_0   ? portable::kQ8_0BlockBytes
                                : kType == portable::kGgmlQ4_0 ? portable::kQ4_0BlockBytes
                                                               : portable::kQ4_1BlockBytes;

// The 32 weights of a block as bytes: Q4_1 unsigned 0..15, Q4_0 -8..7, Q8_0 as stored.
template <int32_t kType>
__attribute__((target("avx2,fma,f16c"))) inline __m256i LoadWeights(const uint8_t* block) {
  if constexpr (kType == portable::kGgmlQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + (kType == portable::kGgmlQ4_1 ? 4 : 2)));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    const __m256i nibbles = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
    if constexpr (kType == portable::kGgmlQ4_0) return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    return nibbles;
  }
}

// The halves at p, p + stride, ... (NR of them, NR <= 4) in the low lanes.
// Built in registers: four 2-byte stores read back as one 8-byte load would
// miss store forwarding and stall every block.
template <int NR>
__attribute__((target("avx2,fma,f16c"))) inline __m128i LoadHalves(const uint8_t* p, int64_t stride) {
  static_assert(NR >= 1 && NR <= 4);
  auto half = [&](int j) { return static_cast<int16_t>(j < NR ? LoadLe16(p + j * stride) : 0); };
  return _mm_setr_epi16(half(0), half(1), half(2), half(3), 0, 0, 0, 0);
}

// y[i][j] (+)= dot(x row i0 + i, w row j) for an MR x NR tile. Each weight
// block is unpacked once and multiplied by the MR rows of x, whose bytes are
// read from L1 as memory operands: MR * NR accumulators, the unpacked block,
// two constants and a temporary fill the 16 registers (an x row held in a
// register as well would spill accumulators). `prefetch`: fetch the weight
// rows two tiles ahead (the first pass over them streams from DRAM).
template <int32_t kType, int MR, int NR>
__attribute__((target("avx2,fma,f16c"))) void TileAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                   int64_t row_bytes, float* y, int64_t ldy, bool accumulate,
                                                   bool prefetch) {
  constexpr int64_t kBytes = kBlockBytes<kType>;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  // The NR rows are contiguous; their blocks are read interleaved, four short
  // streams the hardware prefetcher does not pick up, so fetch the rows two
  // tiles ahead a few lines per block (a decode's matmul streams from DRAM).
  const uint8_t* ahead = w + 2 * NR * row_bytes;
  const int64_t ahead_step = (NR * row_bytes + nb - 1) / nb;
  // The pairs' scales d_w * d_x of a run of blocks are computed first and
  // read back as broadcasts from memory: built in registers, they cost two
  // shuffles a pair and spill accumulators.
  constexpr int64_t kRun = 32;
  alignas(16) float scales[kRun][MR][4];
  for (int64_t run = 0; run < nb; run += kRun) {
    const int64_t run_end = std::min(nb, run + kRun);
    for (int64_t b = run; b < run_end; ++b) {
      const __m128 wd = _mm_cvtph_ps(LoadHalves<NR>(w + b * kBytes, row_bytes));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) _mm_store_ps(scales[b - run][i], _mm_mul_ps(wd, _mm_set1_ps(xd[i * nb + b])));
    }
    for (int64_t b = run; b < run_end; ++b) {
      if (prefetch) {
        for (int64_t off = b * ahead_step; off < (b + 1) * ahead_step; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
        }
      }
      const float* scale = scales[b - run][0];
      const int8_t* xb = xq + b * kBlock;
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m256i wv = LoadWeights<kType>(w + j * row_bytes + b * kBytes);
        const __m256i wabs = kType == portable::kGgmlQ4_1 ? wv : _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + i * k));
          // u8 x s8 pairs: the signed weights' signs move onto x.
          const __m256i xsigned = kType == portable::kGgmlQ4_1 ? xv : _mm256_sign_epi8(xv, wv);
          const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xsigned), ones);
          acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 4 * i + j), _mm256_cvtepi32_ps(p32), acc[i][j]);
        }
      }
    }
  }
  // Q4_1's min term: lane j of min[i] accumulates row j's, an fma per block
  // in block order as in the reference.
  __m128 min[MR];
  for (int i = 0; i < MR; ++i) min[i] = _mm_setzero_ps();
  if constexpr (kType == portable::kGgmlQ4_1) {
    const float* xsum = x.s.data() + i0 * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const __m128 m = _mm_cvtph_ps(LoadHalves<NR>(w + b * kBytes + 2, row_bytes));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) min[i] = _mm_fmadd_ps(m, _mm_set1_ps(xsum[i * nb + b]), min[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    alignas(16) float min_term[4];
    _mm_store_ps(min_term, min[i]);
    for (int j = 0; j < NR; ++j) {
      const float v = SumAvx2(acc[i][j]) + min_term[j];
      float& out = y[i * ldy + j];
      out = accumulate ? out + v : v;
    }
  }
}

// ---------------------------------------------------------------- AVX2, one row

// y[0][j] (+)= dot(x row i0, w row j) for j < 4: TileAvx2<kType, 1, 4> in one
// pass over the blocks, for a decode's GEMV. With one row of x there are
// registers to spare: the x block is loaded once, the four d_w * d_x are one
// vector whose lanes are broadcast in registers (TileAvx2 stores them and
// reads them back), and Q4_1's min term is accumulated in the same pass
// instead of a second walk over the blocks. The same fma per lane and block,
// the same min term and lane sums as TileAvx2, so the same bits.
template <int32_t kType>
__attribute__((target("avx2,fma,f16c"))) void GemvTileAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                       int64_t row_bytes, float* y, bool accumulate) {
  constexpr int NR = 4;
  constexpr int64_t kBytes = kBlockBytes<kType>;
  constexpr bool kSigned = kType != portable::kGgmlQ4_1;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xs = x.s.data() + i0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) acc[j] = _mm256_setzero_ps();
  __m128 min = _mm_setzero_ps();
  // Prefetch as TileAvx2 does: the rows two groups ahead, spread over the blocks.
  const uint8_t* ahead = w + 2 * NR * row_bytes;
  const int64_t ahead_step = (NR * row_bytes + nb - 1) / nb;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t off = b * ahead_step; off < (b + 1) * ahead_step; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
    }
    const uint8_t* block = w + b * kBytes;
    const __m256 scales =
        _mm256_castps128_ps256(_mm_mul_ps(_mm_cvtph_ps(LoadHalves<NR>(block, row_bytes)), _mm_set1_ps(xd[b])));
    if constexpr (kType == portable::kGgmlQ4_1) {
      min = _mm_fmadd_ps(_mm_cvtph_ps(LoadHalves<NR>(block + 2, row_bytes)), _mm_set1_ps(xs[b]), min);
    }
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m256i wv = LoadWeights<kType>(block + j * row_bytes);
      const __m256i wabs = kSigned ? _mm256_sign_epi8(wv, wv) : wv;
      const __m256i xsigned = kSigned ? _mm256_sign_epi8(xv, wv) : xv;
      const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xsigned), ones);
      const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(j));
      acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p32), acc[j]);
    }
  }
  // The four lane sums at once in SumLanes' order, as PackedTileAvx2.
  __m128 h[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) h[j] = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
  _MM_TRANSPOSE4_PS(h[0], h[1], h[2], h[3]);
  __m128 v = _mm_add_ps(_mm_add_ps(_mm_add_ps(h[0], h[2]), _mm_add_ps(h[1], h[3])), min);
  if (accumulate) v = _mm_add_ps(_mm_loadu_ps(y), v);
  _mm_storeu_ps(y, v);
}

// ---------------------------------------------------------------- AVX2, many rows

// NR weight rows unpacked once for every tile of a chunk of x rows (a tile
// unpacking its own copy spent a third of a batch's time outside the integer
// products): block b of row j at u[(b * NR + j) * 32], the bytes maddubs
// takes unsigned (Q4_1's nibbles, the others' magnitudes); the signed types'
// weights themselves at s[...] (their signs move onto x); the scales and
// Q4_1's mins as float32 at d[b * NR + j] and m[b * NR + j].
// `scales`: a tile's d_w * d_x per block, row and column, computed before its
// block loop (a loop over runs of them kept gcc from holding the
// accumulators in registers).
struct PackedGroup {
  std::vector<uint8_t> u, s;
  std::vector<float> d, m, scales;
};

constexpr int kPackedMaxMR = 4;

template <int32_t kType, int NR>
__attribute__((target("avx2,fma,f16c"))) void PackGroupAvx2(const uint8_t* w, int64_t row_bytes, int64_t nb,
                                                         PackedGroup* g) {
  constexpr int64_t kBytes = kBlockBytes<kType>;
  constexpr bool kSigned = kType != portable::kGgmlQ4_1;
  if (g->u.size() < static_cast<size_t>(nb * NR * 32)) {
    g->u.resize(nb * NR * 32);
    if (kSigned) g->s.resize(nb * NR * 32);
    g->d.resize(nb * NR);
    g->m.resize(nb * NR);
    g->scales.resize(nb * NR * kPackedMaxMR);
  }
  // Row by row: the group's rows are contiguous, one stream to prefetch.
  for (int j = 0; j < NR; ++j) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = w + j * row_bytes + b * kBytes;
      const __m256i wv = LoadWeights<kType>(block);
      const int64_t at = (b * NR + j) * 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->u.data() + at), kSigned ? _mm256_sign_epi8(wv, wv) : wv);
      if (kSigned) _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->s.data() + at), wv);
      g->d[b * NR + j] = HalfToFloat(LoadLe16(block));
      if (kType == portable::kGgmlQ4_1) g->m[b * NR + j] = HalfToFloat(LoadLe16(block + 2));
    }
  }
}

// y[i][j] (+)= dot(x row i0 + i, weight row j of the packed group) for an
// MR x 4 tile; the same fma per lane and block, the same lane sums and min
// term as TileAvx2, so the same bits.
template <int32_t kType, int MR>
__attribute__((target("avx2,fma,f16c"))) void PackedTileAvx2(const QuantizedRows& x, int64_t i0,
                                                           PackedGroup& g, float* y, int64_t ldy,
                                                           bool accumulate) {
  constexpr int NR = 4;
  constexpr bool kSigned = kType != portable::kGgmlQ4_1;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  static_assert(MR <= kPackedMaxMR);
  float* const scales = g.scales.data();
  for (int64_t b = 0; b < nb; ++b) {
    const __m128 wd = _mm_loadu_ps(g.d.data() + b * NR);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) _mm_storeu_ps(scales + (b * MR + i) * NR, _mm_mul_ps(wd, _mm_set1_ps(xd[i * nb + b])));
  }
  {
    for (int64_t b = 0; b < nb; ++b) {
      const float* scale = scales + b * MR * NR;
      const int8_t* xb = xq + b * kBlock;
      const uint8_t* ub = g.u.data() + b * NR * 32;
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m256i wabs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ub + j * 32));
        __m256i wv = wabs;
        if constexpr (kSigned) wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.s.data() + (b * NR + j) * 32));
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + i * k));
          const __m256i xsigned = kSigned ? _mm256_sign_epi8(xv, wv) : xv;
          const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xsigned), ones);
          acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + NR * i + j), _mm256_cvtepi32_ps(p32), acc[i][j]);
        }
      }
    }
  }
  __m128 min[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) min[i] = _mm_setzero_ps();
  if constexpr (kType == portable::kGgmlQ4_1) {
    const float* xsum = x.s.data() + i0 * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const __m128 m = _mm_load_ps(g.m.data() + b * NR);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) min[i] = _mm_fmadd_ps(m, _mm_set1_ps(xsum[i * nb + b]), min[i]);
    }
  }
  // The four rows' lane sums at once, in SumLanes' order: halves added
  // (a0+a4, a1+a5, a2+a6, a3+a7), transposed, then (p0+p2) + (p1+p3).
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    __m128 h[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      h[j] = _mm_add_ps(_mm256_castps256_ps128(acc[i][j]), _mm256_extractf128_ps(acc[i][j], 1));
    }
    _MM_TRANSPOSE4_PS(h[0], h[1], h[2], h[3]);
    __m128 v = _mm_add_ps(_mm_add_ps(_mm_add_ps(h[0], h[2]), _mm_add_ps(h[1], h[3])), min[i]);
    float* out = y + i * ldy;
    if (accumulate) v = _mm_add_ps(_mm_loadu_ps(out), v);
    _mm_storeu_ps(out, v);
  }
}

// Rows [i_begin, i_end) of x against `rows` weight rows, in chunks of x
// rows that stay in L1 while each group of NR weight rows passes over them.
template <int32_t kType>
__attribute__((target("avx2,fma,f16c"))) void RowsAvx2(const QuantizedRows& x, int64_t i_begin, int64_t i_end,
                                                        const uint8_t* w, int64_t rows, int64_t row_bytes, float* y,
                                                        int64_t ldy, bool accumulate) {
  constexpr int kMR = 3;
  constexpr int kNR = 4;
  // From this many rows of x in a chunk, each group of kNR weight rows is
  // unpacked once for the chunk (PackedGroup) rather than once per tile.
  constexpr int64_t kPackedMinRows = 6;
  const int64_t chunk = std::max<int64_t>(kMR, kChunkBytes / x.k / kMR * kMR);
  for (int64_t c = i_begin; c < i_end; c += chunk) {
    const int64_t c_end = std::min(i_end, c + chunk);
    int64_t j = 0;
    if (c_end - c >= kPackedMinRows) {
      thread_local PackedGroup group;
      for (; j + kNR <= rows; j += kNR) {
        PackGroupAvx2<kType, kNR>(w + j * row_bytes, row_bytes, x.k / kBlock, &group);
        int64_t i = c;
        for (; i + kMR <= c_end; i += kMR) PackedTileAvx2<kType, kMR>(x, i, group, y + i * ldy + j, ldy, accumulate);
        for (; i < c_end; ++i) PackedTileAvx2<kType, 1>(x, i, group, y + i * ldy + j, ldy, accumulate);
      }
    }
    for (; j + kNR <= rows; j += kNR) {
      const uint8_t* wj = w + j * row_bytes;
      int64_t i = c;
      for (; i + kMR <= c_end; i += kMR) {
        TileAvx2<kType, kMR, kNR>(x, i, wj, row_bytes, y + i * ldy + j, ldy, accumulate, i == c);
      }
      for (; i < c_end; ++i) GemvTileAvx2<kType>(x, i, wj, row_bytes, y + i * ldy + j, accumulate);
    }
    for (; j < rows; ++j) {
      const uint8_t* wj = w + j * row_bytes;
      int64_t i = c;
      for (; i + kMR <= c_end; i += kMR) {
        TileAvx2<kType, kMR, 1>(x, i, wj, row_bytes, y + i * ldy + j, ldy, accumulate, i == c);
      }
      for (; i < c_end; ++i) TileAvx2<kType, 1, 1>(x, i, wj, row_bytes, y + i * ldy + j, ldy, accumulate, i == c);
    }
  }
}

// ---------------------------------------------------------------- scalar

void RowsReference(const QuantizedRows& x, int64_t i_begin, int64_t i_end, const uint8_t* w, int32_t type,
                   int64_t rows, int64_t row_bytes, float* y, int64_t ldy, bool accumulate) {
  for (int64_t i = i_begin; i < i_end; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      const float v = QuantDotReference(x, i, w + j * row_bytes, type);
      float& out = y[i * ldy + j];
      out = accumulate ? out + v : v;
    }
  }
}

// ---------------------------------------------------------------- dispatch

using RowsFn = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t,
                        bool);

struct Dispatch {
  bool avx2 = false;
  void (*quantize)(const float*, int64_t, int8_t*, float*, float*) = QuantizeRowReference;
  RowsFn q4_0 = nullptr;
  RowsFn q4_1 = nullptr;
  RowsFn q8_0 = nullptr;
};

// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c").
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

const Dispatch& Table() {
  static const Dispatch table = [] {
    __builtin_cpu_init();
    Dispatch t;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c()) {
      t = {true, QuantizeRowAvx2, RowsAvx2<portable::kGgmlQ4_0>, RowsAvx2<portable::kGgmlQ4_1>,
           RowsAvx2<portable::kGgmlQ8_0>};
    }
    return t;
  }();
  return table;
}

// Weight rows per task: few rows for few rows of x, so that a decode's
// small matrices still split over every thread.
int64_t RowsPerTask(int64_t m, int64_t n, int32_t threads) {
  const int64_t rows = m <= 4 ? 16 : 64;
  const int64_t balanced = (n + 4 * threads - 1) / (4 * threads);
  return std::max<int64_t>(4, std::min(rows, (balanced + 3) / 4 * 4));
}

}  // namespace

bool IsQuantizedFormat(int32_t type) {
  return type == portable::kGgmlQ4_0 || type == portable::kGgmlQ4_1 || type == portable::kGgmlQ8_0;
}

int64_t QuantizedRowBytes(int32_t type, int64_t k) { return k / kBlock * BlockBytes(type); }

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

void QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t k, QuantizedRows* out) {
  TANDEM_CHECK(k % kBlock == 0) << k;
  const int64_t nb = k / kBlock;
  out->m = m;
  out->k = k;
  if (out->q.size() < static_cast<size_t>(m * k)) {
    out->q.resize(m * k);
    out->d.resize(m * nb);
    out->s.resize(m * nb);
  }
  const auto quantize = Table().quantize;
  pool.ParallelFor(m, std::max<int64_t>(1, 16384 / k), [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) {
      quantize(x + i * k, k, out->q.data() + i * k, out->d.data() + i * nb, out->s.data() + i * nb);
    }
  });
}

float QuantDotReference(const QuantizedRows& x, int64_t i, const uint8_t* w_row, int32_t type) {
  const int64_t nb = x.k / kBlock;
  const int64_t bytes = BlockBytes(type);
  const int8_t* xq = x.q.data() + i * x.k;
  float lanes[8] = {};
  float min_term = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w_row + b * bytes;
    int32_t wq[kBlock];
    BlockInts(type, block, wq);
    const float scale = HalfToFloat(LoadLe16(block)) * x.d[i * nb + b];
    for (int l = 0; l < 8; ++l) {
      int32_t partial = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) partial += wq[e] * xq[b * kBlock + e];
      lanes[l] = std::fma(scale, static_cast<float>(partial), lanes[l]);
    }
  }
  if (type == portable::kGgmlQ4_1) {
    for (int64_t b = 0; b < nb; ++b) {
      min_term = std::fma(HalfToFloat(LoadLe16(w_row + b * bytes + 2)), x.s[i * nb + b], min_term);
    }
  }
  return SumLanes(lanes) + min_term;
}

void QuantGemm(ThreadPool& pool, const QuantizedRows& x, const uint8_t* w, int32_t type, int64_t n, float* y,
               bool accumulate) {
  const QuantGemmOutput output{w, type, n, y, accumulate};
  QuantGemmGroup(pool, x, &output, 1);
}

void QuantGemmGroup(ThreadPool& pool, const QuantizedRows& x, const QuantGemmOutput* outputs, int32_t count) {
  int64_t total_rows = 0;
  for (int32_t o = 0; o < count; ++o) total_rows += outputs[o].n;
  const int64_t per_task = RowsPerTask(x.m, total_rows, pool.num_threads());
  // Tasks [first_task[o], first_task[o + 1]) cover output o's rows.
  absl::InlinedVector<int64_t, 4> first_task(count + 1, 0);
  for (int32_t o = 0; o < count; ++o) first_task[o + 1] = first_task[o] + (outputs[o].n + per_task - 1) / per_task;
  const Dispatch& t = Table();
  pool.ParallelFor(first_task[count], 1, [&](int64_t begin, int64_t end, int32_t) {
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
      for (int64_t r = 0; r < rows; ++r) {
        // The float path of old: the same values as a weight expanded at load.
        const absl::Status s = gguf::DequantizeRow(static_cast<gguf::GgmlType>(type), w + (j + r) * row_bytes,
                                                   tile.data() + r * k, k);
        TANDEM_CHECK(s.ok()) << s;
      }
      GemmRows(x, m, tile.data(), rows, k, y + j, n, accumulate);
    }
  });
}

bool UsingQuantAvx2() { return Table().avx2; }

}  // namespace tandem::worker::cpu
