#include "worker/backends/cpu/quant_gemm.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "common/check.h"
#include "common/gguf/ggml_types.h"
#include "worker/backends/cpu/cpu_gemm.h"
#include "worker/backends/cpu/quant_gemm_avx2.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker::cpu {
namespace {

using portable::HalfToFloat;
using portable::LoadLe16;

constexpr int64_t kDequantRows = 64;  // weight rows a DequantGemm task expands

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

struct Dispatch {
  bool avx2 = false;
  bool vnni = false;
  QuantizeRowFn quantize = QuantizeRowBiasReference;
  RowsFn q4_0 = nullptr;
  RowsFn q4_1 = nullptr;
  RowsFn q8_0 = nullptr;
};

// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c").
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

// The AVX2 kernels, with or without VNNI.
const Dispatch* Avx2Table(bool vnni) {
  static const auto table = [](bool with_vnni) {
    const Avx2Kernels& k = QuantKernelsAvx2(with_vnni);
    return Dispatch{true, with_vnni, k.quantize, k.q4_0, k.q4_1, k.q8_0};
  };
  static const Dispatch plain = table(false);
  static const Dispatch vnni_table = table(true);
  return vnni ? &vnni_table : &plain;
}
constexpr Dispatch kReferenceTable{};

// The best kernels this CPU runs, decided once.
const Dispatch* Best() {
  static const Dispatch* const best = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !HasF16c()) return &kReferenceTable;
    // vpdpbusd on 256-bit registers: AVX512_VNNI with AVX512VL (the EVEX
    // form the assembler emits).
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) return Avx2Table(true);
    return Avx2Table(false);
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
  g_test_table.store(!allowed && Best()->vnni ? Avx2Table(false) : nullptr, std::memory_order_release);
}

}  // namespace tandem::worker::cpu
