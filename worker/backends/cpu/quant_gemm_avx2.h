// The AVX2 kernels behind quant_gemm.h (quant_gemm_avx2.cc), and the packed
// weight layout they share with the packing code (quant_gemm.cc); internal
// to the CPU backend.
#ifndef TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_AVX2_H_
#define TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_AVX2_H_

#include <cstdint>

#include "worker/backends/cpu/quant_gemm.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker::cpu {

inline constexpr int64_t kBlock = portable::kQuantBlockElements;

// Groups per pair.
inline constexpr int64_t kPairGroups = kPackRows / kGroupRows;

// Bytes from one block of a group to its next, `group_block_bytes` being a
// group's block (kGroupRows rows): past the other group of its pair.
constexpr int64_t GroupStride(int64_t group_block_bytes) { return kPairGroups * group_block_bytes; }

// Where group g (rows 8g..8g+7) of packed weights of `row_bytes` a row
// starts: pairs of groups one after the other, a pair's blocks interleaved,
// so group g's block b sits at the start + b * GroupStride.
inline int64_t GroupOffset(int64_t g, int64_t row_bytes, int64_t group_block_bytes) {
  return g / kPairGroups * kPackRows * row_bytes + g % kPairGroups * group_block_bytes;
}

// One row of x quantized per block (QuantizedRows' q, d, s, neg8 and neg128).
using QuantizeRowFn = void (*)(const float* x, int64_t k, int8_t* q, float* d, float* s, int32_t* neg8,
                               int32_t* neg128);
// Rows [i_begin, i_end) of x against `rows` packed weight rows at w (from a
// pair boundary, `row_bytes` a row): y[i * ldy + j] (+)= dot.
using RowsFn = void (*)(const QuantizedRows& x, int64_t i_begin, int64_t i_end, const uint8_t* w, int64_t rows,
                        int64_t row_bytes, float* y, int64_t ldy, bool accumulate);

struct Avx2Kernels {
  QuantizeRowFn quantize;
  RowsFn q4_0, q4_1, q8_0;
};
// The AVX2 kernels, with AVX-512 VNNI's vpdpbusd if `vnni` (the same bits
// either way). REQUIRES: the CPU has AVX2, FMA and F16C, and for `vnni`
// AVX512_VNNI and AVX512VL.
const Avx2Kernels& QuantKernelsAvx2(bool vnni);

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_AVX2_H_
