// Matmuls on weights kept quantized (Q4_0, Q4_1, Q8_0 blocks, packed at load;
// see common/gguf/ggml_types.h for the layouts): y[m x n] = x[m x k] *
// w[n x k]^T (+ y). A decode step reads the 4.5-bit weights instead of their
// float32 copies, 7x fewer bytes, which is what batch 1 is bound by.
//
// Two ways to compute it:
//  * QuantGemm quantizes each row of x per 32-element block to int8 with a
//    float scale (d = max|x| / 127, q = round(x / d)) and sums integer
//    products block by block, as llama.cpp does (its Q8_0/Q8_1 activations).
//  * DequantGemm expands 64 weight rows at a time to float32 and runs the
//    float GEMM on the unquantized x: more arithmetic per weight byte, but
//    the float GEMM's arithmetic is faster once many rows of x share a tile.
// CpuBackend uses QuantGemm for every batch by default, so that a row's result
// never depends on the other rows of its step (see CpuBackendOptions).
//
// QuantGemm's result is defined by QuantDotReference, the scalar reference:
// per block, the exact integer sum of the 32 products is accumulated with
// fma(d_w * d_x, sum, dot); the row's result is dot + Q4_1's min term, m_w *
// d_x * sum(q_x) accumulated separately with fma in block order. The AVX2
// kernels compute exactly that, so their results equal the reference bit for
// bit and do not depend on the rows of x beside a row (batch invariance).
//
// The kernels read weights packed at load (PackWeightRows) in groups of
// kGroupRows (8) rows, and the groups in pairs (kPackRows rows) whose blocks
// interleave: per 32-element block, the first group's block, then the
// second's. A group's block: its eight f16 scales (then Q4_1's eight f16
// mins) side by side, then the rows' weights as eight 32-byte vectors, vector q's 4-byte lane j holding row j's elements
// 4q..4q+3: Q8_0's eight vectors in turn, Q4's four 32-byte runs, vectors 2p
// and 2p + 1 in the low and high nibbles of run p. Against x's quad q
// broadcast (one load), one vpdpbusd adds a quad of products to every row's
// lane: after eight, each lane holds its row's block sum, and one conversion
// and one fma serve the eight rows. The same bytes as the GGUF blocks (a
// pair is sixteen rows' worth; a last partial pair is padded with zero
// rows); a decode's GEMV reads a pair, sixteen rows, as one linear stream.
//
// Thread-compatible: one caller at a time per pool and per scratch.
#ifndef TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_H_
#define TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_H_

#include <cstdint>
#include <vector>

#include "worker/backends/cpu/thread_pool.h"

namespace tandem::worker::cpu {

// Whether `ggml_type` is a block format these kernels compute on.
bool IsQuantizedFormat(int32_t ggml_type);
// Bytes of one weight row of `k` elements. REQUIRES: IsQuantizedFormat, k % 32 == 0.
int64_t QuantizedRowBytes(int32_t ggml_type, int64_t k);

// Weight rows per packed group, and per pair of groups.
inline constexpr int64_t kGroupRows = 8;
inline constexpr int64_t kPackRows = 2 * kGroupRows;
// Bytes of n rows of `k` elements packed (n rounded up to a whole pair).
int64_t PackedWeightBytes(int32_t ggml_type, int64_t n, int64_t k);
// Packs n GGUF rows of `k` elements (n * QuantizedRowBytes bytes at `rows`)
// into `out` (PackedWeightBytes). Row j's pair starts at out + (j - j % 16) *
// QuantizedRowBytes, as row j - j % 16 would unpacked, so a matrix packs as
// independent runs of whole pairs.
void PackWeightRows(int32_t ggml_type, const uint8_t* rows, int64_t n, int64_t k, uint8_t* out);
// Row `row` of packed weights back in its GGUF blocks (QuantizedRowBytes at `out`).
void UnpackWeightRow(int32_t ggml_type, const uint8_t* packed, int64_t k, int64_t row, uint8_t* out);

// Rows of x quantized per 32-element block. Row i's block b is q[i * k + 32 b
// ...], scale d[i * k / 32 + b], and s = d * sum(q) of the block; neg8 and
// neg128[i * k / 32 + b] are -8 and -128 times sum(q): where a block's
// integer sums start for weights that enter the products as w + 8 (Q4_0's
// nibbles) or w + 128 (Q8_0 with VNNI).
struct QuantizedRows {
  int64_t m = 0;
  int64_t k = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> s;
  std::vector<int32_t> neg8;
  std::vector<int32_t> neg128;
};

// Quantizes x [m, k] into `out` (resized as needed). REQUIRES: k % 32 == 0.
void QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t k, QuantizedRows* out);
// The scalar definition of a quantized row (used on CPUs without AVX2).
void QuantizeRowReference(const float* x, int64_t k, int8_t* q, float* d, float* s);

// y = x w^T (+ y) on quantized x. w is n rows packed by PackWeightRows.
void QuantGemm(ThreadPool& pool, const QuantizedRows& x, const uint8_t* w, int32_t ggml_type, int64_t n,
               float* y, bool accumulate);
// One weight of QuantGemmGroup and where its product goes.
struct QuantGemmOutput {
  const uint8_t* w;  // n rows packed by PackWeightRows
  int32_t ggml_type;
  int64_t n;
  float* y;          // [x.m, n]
  bool accumulate;
};
// QuantGemm for each of `count` weights in one loop over all their rows (a
// decode step's small matrices give each thread work in one wake-up instead
// of one per matrix); each output the same bits as QuantGemm's.
void QuantGemmGroup(ThreadPool& pool, const QuantizedRows& x, const QuantGemmOutput* outputs, int32_t count);
// What QuantGemmFloat keeps across calls.
struct QuantGemmScratch {
  struct alignas(64) Thread {
    QuantizedRows x;    // x as this pool thread quantized it for itself
    uint64_t call = 0;  // the call whose x that is
  };
  std::vector<Thread> threads;
  uint64_t calls = 0;
  QuantizedRows shared;  // x quantized once, for every thread
};
// Up to this many rows of x, QuantGemmFloat has each thread quantize x for
// itself (see there).
inline constexpr int64_t kOwnQuantizeMaxRows = 256;
// QuantGemmGroup on float x [m, k] (the same bits as QuantizeRows, then
// QuantGemmGroup). Up to kOwnQuantizeMaxRows rows, each pool thread that
// runs a task first quantizes all of x into its own buffer. Quantized once
// into a shared buffer, x's lines were written by one core right after the
// other core had read them for the previous matmul, and each such write
// waited for the other core to give its copy up: in a batch-1 decode step
// the submitting thread spent 7% of its samples stalled there (1.6% now),
// and steps take 1-3% less time at batch 1, 16 and 64 (up to 15% in runs
// where the VM's steps were slow). Quantizing x twice costs less than that
// up to a few hundred rows (a 256-token prefill even); past them x is
// quantized once, in parallel, into `shared`.
void QuantGemmFloat(ThreadPool& pool, const float* x, int64_t m, int64_t k, const QuantGemmOutput* outputs,
                    int32_t count, QuantGemmScratch* scratch);
// The scalar definition of one output: dot(row `i` of x, weight row `w_row`
// in its GGUF blocks).
float QuantDotReference(const QuantizedRows& x, int64_t i, const uint8_t* w_row, int32_t ggml_type);

// y = x w^T (+ y) on float x, expanding `w` (packed) to float32 a tile at a time in
// `scratch` (one vector per pool thread, resized as needed).
void DequantGemm(ThreadPool& pool, const float* x, int64_t m, const uint8_t* w, int32_t ggml_type, int64_t n,
                 int64_t k, float* y, bool accumulate, std::vector<std::vector<float>>* scratch);

// How far ahead, in bytes, the AVX2 kernels that read packed weights
// straight from memory (the GEMV, the tiles for two to five rows of x, the
// unpacking of a group for more) ask for the weights they will read next:
// one software prefetch (into L2, prefetcht1) per 64 bytes read, that far
// ahead in the same stream (0: none, the hardware prefetcher alone). On
// Intel 2,560, measured on a 2-core Xeon VM (2 MiB L2 a core, 480 MiB L3
// shared with the host's other guests) with BM_GemvFar (the GEMV from a
// 2 GiB span against the bare reader, alternated): Q4_1 at 0.72-0.75 of the
// reader without, 0.85-0.89 with (0.81-0.86 with prefetcht0 at 2-3 KiB;
// 4 KiB 0.67, 8 KiB 0.59-0.62: worse than none), Q8_0 0.84 and 0.93; batch-1
// steps (BM_Decode/1/128, separate runs alternated) 3.0-3.3 ms against
// 4.65-4.77, batch 16 4% and batch 64 2% less time. (Until 2026-12-05 the
// compiler had deleted these prefetches; see prefetch.h: the figures
// claimed for them before were the VM's drift.) Elsewhere 0: not measured
// on Zen 4 since.
int64_t QuantPrefetchBytes();
// For benchmarks: sets QuantPrefetchBytes (results are the same bits).
void SetQuantPrefetchBytes(int64_t bytes);

// Whether the AVX2 kernels are in use.
bool UsingQuantAvx2();
// Whether they use AVX-512 VNNI's vpdpbusd for the integer products (where
// the CPU has it; the same bits as without).
bool UsingQuantVnni();
// For tests: AllowQuantVnniForTest(false) runs the AVX2 kernels without VNNI
// on a CPU that has it; true restores the default.
void AllowQuantVnniForTest(bool allowed);

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_QUANT_GEMM_H_
