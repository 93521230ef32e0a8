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

// The AVX2 reduction order: (a0+a4)+(a2+a6) + (a1+a5)+(a3+a7).
float SumLanes(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// ---------------------------------------------------------------- packing

// f16 fields per row and block: d, and Q4_1's m.
int HalfFields(int32_t type) { return type == portable::kGgmlQ4_1 ? 2 : 1; }

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
    for (int j = 0; j < kGroupRows; ++j) std::memcpy(payload + 32 * j, block(j) + 2, 32);
    return;
  }
  // GGUF's byte e holds elements e and e + 16; the pair's byte e holds
  // element e of both rows.
  auto nibble = [&](int j, int e) {
    const uint8_t byte = block(j)[2 * fields + e % 16];
    return e < 16 ? byte & 0x0f : byte >> 4;
  };
  for (int p = 0; p < 2; ++p) {
    for (int e = 0; e < 32; ++e) payload[32 * p + e] = static_cast<uint8_t>(nibble(2 * p, e) | nibble(2 * p + 1, e) << 4);
  }
}

// Row j's GGUF block from one block of a packed group.
void UnpackBlock(int32_t type, const uint8_t* packed, int j, uint8_t* out) {
  const int fields = HalfFields(type);
  for (int f = 0; f < fields; ++f) std::memcpy(out + 2 * f, packed + 2 * (kGroupRows * f + j), 2);
  const uint8_t* payload = packed + 2 * kGroupRows * fields;
  if (type == portable::kGgmlQ8_0) {
    std::memcpy(out + 2, payload + 32 * j, 32);
    return;
  }
  const uint8_t* pair = payload + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int e = 0; e < 16; ++e) {
    out[2 * fields + e] = static_cast<uint8_t>(((pair[e] >> shift) & 0x0f) | ((pair[e + 16] >> shift) & 0x0f) << 4);
  }
}

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
// Bytes of one block of a packed group (kGroupRows rows) and of its header.
template <int32_t kType>
constexpr int64_t kGroupBlockBytes = kGroupRows * kBlockBytes<kType>;
template <int32_t kType>
constexpr int64_t kHeaderBytes = kType == portable::kGgmlQ4_1 ? 16 : 8;

// Row j's 32 weights of a packed group block as bytes: Q4_1 unsigned 0..15,
// Q4_0 -8..7, Q8_0 as stored.
template <int32_t kType>
__attribute__((target("avx2,fma,f16c"))) inline __m256i LoadGroupRow(const uint8_t* block, int j) {
  const uint8_t* payload = block + kHeaderBytes<kType>;
  if constexpr (kType == portable::kGgmlQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload + 32 * j));
  } else {
    const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload + 32 * (j / 2)));
    const __m256i nibbles = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(pair, 4) : pair, _mm256_set1_epi8(0x0f));
    if constexpr (kType == portable::kGgmlQ4_0) return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    return nibbles;
  }
}

// The group block's four scales d and (Q4_1) mins m as float32.
__attribute__((target("avx2,fma,f16c"))) inline __m128 LoadGroupScales(const uint8_t* block) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block)));
}
__attribute__((target("avx2,fma,f16c"))) inline __m128 LoadGroupMins(const uint8_t* block) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 8)));
}

// The eight int32 sums of four u8 x s8 products each: maddubs then madd
// (no 16-bit pair sum here can saturate: |w| <= 128 against |x| <= 127, or
// nibbles), or one vpdpbusd where the CPU has AVX-512 VNNI: the same
// integers, so the same bits downstream, in one instruction instead of two
// (kVnni; written as inline assembly, which this AVX2-target function may
// hold, and run only after Table() has checked the CPU).
template <bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline __m256i Dot4(__m256i u, __m256i s) {
  if constexpr (kVnni) {
    __m256i sums = _mm256_setzero_si256();
    asm("vpdpbusd %2, %1, %0" : "+x"(sums) : "x"(u), "x"(s));
    return sums;
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
}

// y[i][j] (+)= dot(x row i0 + i, row j of the packed group w) for an MR x 4
// tile. Each weight block is unpacked once and multiplied by the MR rows of
// x, whose bytes are read from L1 as memory operands: MR * 4 accumulators,
// the unpacked block, two constants and a temporary fill the 16 registers
// (an x row held in a register as well would spill accumulators).
template <int32_t kType, int MR, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void TileAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                   float* y, int64_t ldy, bool accumulate) {
  constexpr int NR = kGroupRows;
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  // The pairs' scales d_w * d_x of a run of blocks are computed first and
  // read back as broadcasts from memory: built in registers, they cost two
  // shuffles a pair and spill accumulators.
  constexpr int64_t kRun = 32;
  alignas(16) float scales[kRun][MR][4];
  for (int64_t run = 0; run < nb; run += kRun) {
    const int64_t run_end = std::min(nb, run + kRun);
    for (int64_t b = run; b < run_end; ++b) {
      const __m128 wd = LoadGroupScales(w + b * kBytes);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) _mm_store_ps(scales[b - run][i], _mm_mul_ps(wd, _mm_set1_ps(xd[i * nb + b])));
    }
    for (int64_t b = run; b < run_end; ++b) {
      const float* scale = scales[b - run][0];
      const int8_t* xb = xq + b * kBlock;
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m256i wv = LoadGroupRow<kType>(w + b * kBytes, j);
        const __m256i wabs = kType == portable::kGgmlQ4_1 ? wv : _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + i * k));
          // u8 x s8 pairs: the signed weights' signs move onto x.
          const __m256i xsigned = kType == portable::kGgmlQ4_1 ? xv : _mm256_sign_epi8(xv, wv);
          const __m256i p32 = Dot4<kVnni>(wabs, xsigned);
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
      const __m128 m = LoadGroupMins(w + b * kBytes);
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

// GemvGroupAvx2's block of row j: its integer partials (Q4_0: from the
// nibbles, less x8 = 8 * the x quad sums) times d_w * d_x, lane j of
// `scales`' 128-bit halves, into acc.
template <int32_t kType, int j, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) inline void GemvRowAvx2(__m256i wq, __m256i xv, __m256i x8, __m256 scales,
                                                             __m256& acc) {
  __m256i p32;
  if constexpr (kType == portable::kGgmlQ8_0) {
    p32 = Dot4<kVnni>(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
  } else if constexpr (kType == portable::kGgmlQ4_0) {
    p32 = _mm256_sub_epi32(Dot4<kVnni>(wq, xv), x8);
  } else {
    p32 = Dot4<kVnni>(wq, xv);
  }
  acc = _mm256_fmadd_ps(_mm256_permute_ps(scales, j * 0x55), _mm256_cvtepi32_ps(p32), acc);
}

// y[j] (+)= dot(x row i0, row j of the packed group w) for j < 4: TileAvx2<kType,
// 1> in one pass over the blocks, for a decode's GEMV. Per block: one x load,
// the header's scales (and Q4_1's mins) converted by one instruction, the
// four d_w * d_x broadcast within 128-bit lanes from a register, Q4_1's min
// term accumulated in the same pass; Q4_0's weights enter Dot4 as their
// nibbles 0..15 and 8 * (x quad sum) is subtracted from each lane (exact
// integers), which saves the two sign operations per row that the signed
// types otherwise need. The same integer
// partials, the same fma per lane and block, the same min term and lane sums
// as TileAvx2, so the same bits.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void GemvGroupAvx2(const QuantizedRows& x, int64_t i0, const uint8_t* w,
                                                        float* y, bool accumulate) {
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  // The groups two ahead, a block's lines per block: from DRAM the hardware
  // prefetcher alone left one thread at 8-10 GB/s on a linear stream (this
  // VM's 4 KiB pages); with this 12-14 (the lead's gemv_bench, Q4_1 and Q8_0).
  const uint8_t* ahead = w + 2 * kGroupRows * QuantizedRowBytes(kType, x.k);
  constexpr int64_t kHeader = kHeaderBytes<kType>;
  const int64_t nb = x.k / kBlock;
  const int8_t* xq = x.q.data() + i0 * x.k;
  const float* xd = x.d.data() + i0 * nb;
  const float* xs = x.s.data() + i0 * nb;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 min = _mm256_setzero_ps();  // Q4_1: lanes 4-7 are the rows' min terms
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kBytes;
    // Points 64 bytes apart or less over the whole stream touch every line.
#pragma GCC unroll 4
    for (int64_t line = 0; line < (kBytes + 63) / 64; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + b * kBytes + 64 * line), _MM_HINT_T0);
    }
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
    __m128 scale4;
    if constexpr (kType == portable::kGgmlQ4_1) {
      const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
      scale4 = _mm_mul_ps(_mm256_castps256_ps128(dm), _mm_set1_ps(xd[b]));
      min = _mm256_fmadd_ps(dm, _mm256_set1_ps(xs[b]), min);
    } else {
      scale4 = _mm_mul_ps(LoadGroupScales(block), _mm_set1_ps(xd[b]));
    }
    const __m256 scales = _mm256_set_m128(scale4, scale4);
    __m256i wq[4];
    if constexpr (kType == portable::kGgmlQ8_0) {
      for (int j = 0; j < 4; ++j) wq[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kHeader + 32 * j));
    } else {
      for (int p = 0; p < 2; ++p) {
        const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kHeader + 32 * p));
        wq[2 * p] = _mm256_and_si256(pair, low4);
        wq[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(pair, 4), low4);
      }
    }
    __m256i x8 = _mm256_setzero_si256();
    if constexpr (kType == portable::kGgmlQ4_0) x8 = Dot4<kVnni>(_mm256_set1_epi8(8), xv);
    GemvRowAvx2<kType, 0, kVnni>(wq[0], xv, x8, scales, acc[0]);
    GemvRowAvx2<kType, 1, kVnni>(wq[1], xv, x8, scales, acc[1]);
    GemvRowAvx2<kType, 2, kVnni>(wq[2], xv, x8, scales, acc[2]);
    GemvRowAvx2<kType, 3, kVnni>(wq[3], xv, x8, scales, acc[3]);
  }
  // The four lane sums at once in SumLanes' order, as PackedTileAvx2.
  __m128 h[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) h[j] = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
  _MM_TRANSPOSE4_PS(h[0], h[1], h[2], h[3]);
  __m128 v = _mm_add_ps(_mm_add_ps(h[0], h[2]), _mm_add_ps(h[1], h[3]));
  v = _mm_add_ps(v, _mm256_extractf128_ps(min, 1));  // + 0 for the others, as the reference adds
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

template <int32_t kType>
__attribute__((target("avx2,fma,f16c"))) void PackGroupAvx2(const uint8_t* w, int64_t nb, PackedGroup* g) {
  constexpr int NR = kGroupRows;
  constexpr int64_t kBytes = kGroupBlockBytes<kType>;
  constexpr bool kSigned = kType != portable::kGgmlQ4_1;
  if (g->u.size() < static_cast<size_t>(nb * NR * 32)) {
    g->u.resize(nb * NR * 32);
    if (kSigned) g->s.resize(nb * NR * 32);
    g->d.resize(nb * NR);
    g->m.resize(nb * NR);
    g->scales.resize(nb * NR * kPackedMaxMR);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = w + b * kBytes;
    _mm_storeu_ps(g->d.data() + b * NR, LoadGroupScales(block));
    if (kType == portable::kGgmlQ4_1) _mm_storeu_ps(g->m.data() + b * NR, LoadGroupMins(block));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m256i wv = LoadGroupRow<kType>(block, j);
      const int64_t at = (b * NR + j) * 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->u.data() + at), kSigned ? _mm256_sign_epi8(wv, wv) : wv);
      if (kSigned) _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->s.data() + at), wv);
    }
  }
}

// y[i][j] (+)= dot(x row i0 + i, weight row j of the packed group) for an
// MR x 4 tile; the same fma per lane and block, the same lane sums and min
// term as TileAvx2, so the same bits.
template <int32_t kType, int MR, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void PackedTileAvx2(const QuantizedRows& x, int64_t i0,
                                                           PackedGroup& g, float* y, int64_t ldy,
                                                           bool accumulate) {
  constexpr int NR = 4;
  constexpr bool kSigned = kType != portable::kGgmlQ4_1;
  const int64_t k = x.k;
  const int64_t nb = k / kBlock;
  const int8_t* xq = x.q.data() + i0 * k;
  const float* xd = x.d.data() + i0 * nb;
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
          const __m256i p32 = Dot4<kVnni>(wabs, xsigned);
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
// The last group of a matrix whose rows are not a multiple of kGroupRows
// (padded with zero rows): one row of x at a time into a 4-wide buffer, of
// which the real rows' results are copied out.
template <int32_t kType, bool kVnni>
__attribute__((target("avx2,fma,f16c"))) void RaggedGroupAvx2(const QuantizedRows& x, int64_t i_begin,
                                                           int64_t i_end, const uint8_t* w, int64_t rows, float* y,
                                                           int64_t ldy, bool accumulate) {
  for (int64_t i = i_begin; i < i_end; ++i) {
    float out[kGroupRows] = {};
    if (accumulate) std::copy(y + i * ldy, y + i * ldy + rows, out);
    GemvGroupAvx2<kType, kVnni>(x, i, w, out, accumulate);
    std::copy(out, out + rows, y + i * ldy);
  }
}

// Rows [i_begin, i_end) of x against `rows` packed weight rows (from a group
// boundary), in chunks of x rows that stay in L1 while each group of weight
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
  const int64_t chunk = std::max<int64_t>(kMR, kChunkBytes / x.k / kMR * kMR);
  for (int64_t c = i_begin; c < i_end; c += chunk) {
    const int64_t c_end = std::min(i_end, c + chunk);
    if (c_end - c >= kPackedMinRows) {
      thread_local PackedGroup group;
      for (int64_t j = 0; j < full; j += kGroupRows) {
        PackGroupAvx2<kType>(w + j * row_bytes, x.k / kBlock, &group);
        int64_t i = c;
        for (; i + kMR <= c_end; i += kMR) PackedTileAvx2<kType, kMR, kVnni>(x, i, group, y + i * ldy + j, ldy, accumulate);
        for (; i < c_end; ++i) PackedTileAvx2<kType, 1, kVnni>(x, i, group, y + i * ldy + j, ldy, accumulate);
      }
    } else {
      for (int64_t j = 0; j < full; j += kGroupRows) {
        const uint8_t* wj = w + j * row_bytes;
        int64_t i = c;
        for (; i + kMR <= c_end; i += kMR) TileAvx2<kType, kMR, kVnni>(x, i, wj, y + i * ldy + j, ldy, accumulate);
        for (; i < c_end; ++i) GemvGroupAvx2<kType, kVnni>(x, i, wj, y + i * ldy + j, accumulate);
      }
    }
    if (full < rows) RaggedGroupAvx2<kType, kVnni>(x, c, c_end, w + full * row_bytes, rows - full, y + full, ldy, accumulate);
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

// ---------------------------------------------------------------- dispatch

using RowsFn = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t,
                        bool);

struct Dispatch {
  bool avx2 = false;
  bool vnni = false;
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

int64_t PackedWeightBytes(int32_t type, int64_t n, int64_t k) {
  return (n + kGroupRows - 1) / kGroupRows * kGroupRows * QuantizedRowBytes(type, k);
}

void PackWeightRows(int32_t type, const uint8_t* rows, int64_t n, int64_t k, uint8_t* out) {
  const int64_t bytes = BlockBytes(type);
  const int64_t row_bytes = QuantizedRowBytes(type, k);
  for (int64_t g = 0; g < n; g += kGroupRows) {
    for (int64_t b = 0; b < k / kBlock; ++b) {
      const uint8_t* src[kGroupRows];
      for (int j = 0; j < kGroupRows; ++j) src[j] = g + j < n ? rows + (g + j) * row_bytes + b * bytes : nullptr;
      PackBlock(type, src, out + g * row_bytes + b * kGroupRows * bytes);
    }
  }
}

void UnpackWeightRow(int32_t type, const uint8_t* packed, int64_t k, int64_t row, uint8_t* out) {
  const int64_t bytes = BlockBytes(type);
  const uint8_t* group = packed + (row - row % kGroupRows) * QuantizedRowBytes(type, k);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    UnpackBlock(type, group + b * kGroupRows * bytes, static_cast<int>(row % kGroupRows), out + b * bytes);
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
