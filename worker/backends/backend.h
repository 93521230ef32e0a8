// Backend: what the model needs from a device. A backend owns device memory
// and one stream; every operation is enqueued on that stream and runs in
// enqueue order ("ordered execution"). Host code never dereferences a device
// pointer: it uploads inputs, enqueues kernels, and downloads results with an
// asynchronous copy that signals an Event.
//
// Each kernel is a launcher that takes a params struct of device pointers and
// sizes (TensorRT-LLM style) and returns a Status for bad parameters. The CPU
// backend runs kernels on a thread pool as they are enqueued (its events are
// complete when returned); a CUDA backend implements the same launchers with
// kernels and cuBLAS on a cudaStream, and its events are cudaEvents. The model
// (model/llama_model.h) and the runner are written once against this.
//
// Thread-compatible: one thread (the worker's compute thread) drives a backend.
#ifndef TANDEM_WORKER_BACKENDS_BACKEND_H_
#define TANDEM_WORKER_BACKENDS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/types.h"

namespace tandem::worker {

// Device memory. data() is a device address.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
};

// Completion of an asynchronous copy.
class Event {
 public:
  virtual ~Event() = default;
  virtual absl::Status Wait() = 0;
  virtual bool Done() = 0;
};

// A weight matrix in the backend's preferred layout: `rows` output features of
// `cols` inputs each (ggml shape [cols, rows]). How it is stored (float32
// dequantized at load, or quantized blocks) is the backend's choice.
struct Weight {
  int64_t rows = 0;
  int64_t cols = 0;
  std::unique_ptr<DeviceBuffer> buffer;
  int32_t format = 0;  // backend-specific storage format
};

// --- kernel parameters (device pointers unless noted) ---

struct EmbeddingParams {
  const Weight* table;         // [vocab rows, hidden cols]
  const TokenId* ids;          // [num_tokens]
  int32_t num_tokens;
  float* out;                  // [num_tokens, hidden]
};

struct MatmulParams {
  const float* x;              // [m, w->cols]
  const Weight* w;
  int64_t m;
  float* y;                    // [m, w->rows]
  bool accumulate = false;     // y += x W^T instead of y = x W^T
};

// Matmuls of one x by several weights of the same width (a layer's Q, K and
// V projections; gate and up): y[i] = x w[i]^T for i < count, each exactly
// as Matmul computes it, so that a backend may run them as one launch and
// prepare x once.
struct MatmulGroupParams {
  static constexpr int32_t kMaxWeights = 3;
  const float* x;              // [m, cols], cols the same for every weight
  int64_t m;
  int32_t count;               // 1..kMaxWeights
  const Weight* w[kMaxWeights];
  float* y[kMaxWeights];       // [m, w[i]->rows]
};

struct RmsNormParams {
  const float* x;              // [rows, dim]
  const float* weight;         // [dim]
  float* out;                  // may equal x
  int64_t rows;
  int64_t dim;
  float eps;
};

struct RopeParams {
  float* q;                    // [num_tokens, num_heads * head_dim]
  float* k;                    // [num_tokens, num_kv_heads * head_dim]
  const int32_t* positions;    // [num_tokens]
  int32_t num_tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t rope_dim;            // leading dims of each head that rotate
  float freq_base;
  float freq_scale;            // linear scaling: position * freq_scale
};

// How a KV cache holds keys and values. A backend chooses (Backend::kv_type):
// the CPU backend keeps IEEE half floats, which halves the bytes attention
// reads and doubles the tokens a cache holds; the arithmetic stays float32.
enum class KvType : uint8_t { kF32, kF16 };
inline size_t KvElementBytes(KvType type) { return type == KvType::kF16 ? 2 : 4; }

// The paged KV cache of one layer: [num_blocks, block_size, num_kv_heads, head_dim]
// elements of `type` each.
struct KvCacheLayer {
  void* k;
  void* v;
  KvType type = KvType::kF32;
};

struct WriteKvParams {
  KvCacheLayer cache;
  const float* k;              // [num_tokens, num_kv_heads * head_dim]
  const float* v;
  const int64_t* slots;        // [num_tokens]: block * block_size + offset;
                               // a negative slot writes nothing (a padded row)
  int32_t num_tokens;
  int32_t kv_width;            // num_kv_heads * head_dim
};

struct AttentionParams {
  KvCacheLayer cache;
  const float* q;              // [num_tokens, num_heads * head_dim]
  float* out;                  // [num_tokens, num_heads * head_dim]
  const int32_t* query_start;  // [num_seqs + 1]: token range of each sequence
  const int32_t* seq_lens;     // [num_seqs]: context length including this step's tokens
  const int32_t* block_table_start;  // [num_seqs + 1] into block_tables
  const BlockId* block_tables;
  int32_t num_seqs;
  // Host values, for choosing a launch shape: the longest context and the
  // most query tokens of one sequence in this step.
  int32_t max_seq_len;
  int32_t max_query_len;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  float scale;
};

struct SiluMulParams {
  const float* gate;           // [rows, dim]
  const float* up;
  float* out;                  // may equal gate
  int64_t rows;
  int64_t dim;
};

struct GatherRowsParams {
  const float* x;              // [*, dim]
  const int32_t* rows;         // [num_rows]
  int32_t num_rows;
  int64_t dim;
  float* out;                  // [num_rows, dim]
};

// dst[dst_index[i]] = src[src_index[i]] for i < count; a null index means i.
// Placeholder substitution is input_ids[target] = last_sampled[slot]; storing
// a step's samples is last_sampled[slot] = sampled[i].
struct CopyTokensParams {
  TokenId* dst;
  const int32_t* dst_index;
  const TokenId* src;
  const int32_t* src_index;
  int32_t count;
};

// How one request samples (the wire's SamplingParams, resolved).
struct SamplingOptions {
  float temperature = 1.0f;    // <= 1e-5: greedy
  float top_p = 1.0f;          // outside (0, 1): off
  int32_t top_k = 0;           // 0: off
  float min_p = 0.0f;          // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t logprobs = -1;       // -1: none; n >= 0: the sampled token's plus top-n
};

// One row to sample, as the device reads it (plain data: an array of these
// is uploaded to device memory). The rule is worker/backends/portable/
// sampling_rule.h.
struct SampleRow {
  SamplingOptions options;
  // Keys this row's random draw: the same (key, position) gives the same
  // draw whatever else is in the batch.
  uint64_t rng_key = 0;
  int32_t position = 0;        // index of the token being sampled
  // Rows with penalties: the request's history in SampleParams::history
  // (prompt_len prompt tokens, then output_len tokens sampled so far, never
  // placeholders) and a row of SampleParams::penalty_counts, each row its
  // own; -1 otherwise (then the options' penalties are not applied).
  int32_t penalty_row = -1;
  int32_t prompt_len = 0;
  int32_t output_len = 0;
  int64_t history_start = 0;
  // Row of SampleParams::allowed (the grammar bitmask), or -1: no mask.
  int32_t mask_row = -1;
  // This row's logit biases: entries [bias_start, bias_start + bias_len) of
  // SampleParams::bias_ids/bias_values, ids ascending and unique (-inf bans).
  int32_t bias_len = 0;
  int64_t bias_start = 0;
};
static_assert(std::is_trivially_copyable_v<SampleRow>, "SampleRow is uploaded as bytes");

// Device pointers unless noted. Row r's outputs: tokens[r]; when logprobs is
// set, logprobs[r * (1 + max_top)] is the sampled token's logprob and the
// max_top entries after it (and top_ids[r * max_top ...]) the top-n, most
// likely first, padded with id -1 and logprob 0 (rows that asked for none
// get 0 and padding).
struct SampleParams {
  const float* logits = nullptr;         // [num_rows, vocab]
  int32_t num_rows = 0;
  int32_t vocab = 0;
  const SampleRow* rows = nullptr;       // [num_rows]
  const TokenId* history = nullptr;      // flattened histories of rows with penalty_row >= 0
  int64_t history_len = 0;
  // Scratch the backend may overwrite: [num_penalty_rows, vocab]; null when
  // no row has penalties.
  uint32_t* penalty_counts = nullptr;
  int32_t num_penalty_rows = 0;
  const uint32_t* allowed = nullptr;     // [num_mask_rows, words_per_row], or null
  int32_t num_mask_rows = 0;
  int32_t words_per_row = 0;             // >= ceil(vocab / 32) when allowed is set
  const TokenId* bias_ids = nullptr;     // [num_bias] (SampleRow::bias_start), or null
  const float* bias_values = nullptr;    // [num_bias]
  int64_t num_bias = 0;
  TokenId* tokens = nullptr;             // [num_rows]
  float* logprobs = nullptr;             // [num_rows * (1 + max_top)] or null
  TokenId* top_ids = nullptr;            // [num_rows * max_top] or null
  int32_t max_top = 0;                   // top-n slots per row in logprobs/top_ids
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int32_t num_threads() const = 0;
  // The element type of the KV caches the model allocates for this backend
  // and passes to WriteKv and PagedAttention.
  virtual KvType kv_type() const { return KvType::kF32; }

  // --- memory and copies (stream-ordered) ---
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) = 0;
  virtual absl::Status Upload(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  // Copies device memory to `dst` (host) once the stream reaches this point;
  // the returned event completes when `dst` holds the data.
  virtual absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;

  // Converts a GGUF tensor of `rows` x `cols` into the backend's weight layout.
  virtual absl::StatusOr<Weight> LoadWeight(const gguf::GgufTensor& tensor) = 0;
  // Uploads a float32 vector (norm weights).
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> LoadVector(const gguf::GgufTensor& tensor) = 0;

  // --- kernels (stream-ordered) ---
  virtual absl::Status Embedding(const EmbeddingParams& p) = 0;
  virtual absl::Status Matmul(const MatmulParams& p) = 0;
  // The default runs Matmul once per weight.
  virtual absl::Status MatmulGroup(const MatmulGroupParams& p) {
    if (p.count < 1 || p.count > MatmulGroupParams::kMaxWeights) {
      return absl::InvalidArgumentError("matmul group: 1 to 3 weights");
    }
    for (int32_t i = 0; i < p.count; ++i) {
      absl::Status s = Matmul({p.x, p.w[i], p.m, p.y[i]});
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  virtual absl::Status RmsNorm(const RmsNormParams& p) = 0;
  virtual absl::Status Rope(const RopeParams& p) = 0;
  virtual absl::Status WriteKv(const WriteKvParams& p) = 0;
  // Rope(rope), then WriteKv(kv) of the rotated keys, which a device backend
  // runs as one kernel (a launch fewer per layer). REQUIRES: kv.k == rope.k
  // and the same tokens. The default makes the two calls.
  virtual absl::Status RopeWriteKv(const RopeParams& rope, const WriteKvParams& kv) {
    if (absl::Status s = Rope(rope); !s.ok()) return s;
    return WriteKv(kv);
  }
  virtual absl::Status PagedAttention(const AttentionParams& p) = 0;
  virtual absl::Status SiluMul(const SiluMulParams& p) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status GatherRows(const GatherRowsParams& p) = 0;
  virtual absl::Status CopyTokens(const CopyTokensParams& p) = 0;
  // The rule is worker/backends/portable/sampling_rule.h. InvalidArgument
  // for bad sizes (vocab above 2^23, words_per_row too small). A row whose
  // history, counts or mask row lies outside the arrays is a caller's bug:
  // the CPU backend returns InvalidArgument; a device backend, which cannot
  // read the rows before its kernel does, ignores that penalty or mask.
  virtual absl::Status Sample(const SampleParams& p) = 0;

  // --- recorded work ---
  // Runs `body`, which only enqueues device work through this backend (no
  // host waits, no uploads or downloads). A device backend may record it
  // (a CUDA graph) and replay the recording instead of calling `body` when
  // the same `key` comes again: `key` must hold every host value and device
  // address the enqueued work depends on, and the memory behind those
  // addresses must outlive the steps that use them (the caller's buffers are
  // grow-only; a reallocation changes the key). A backend's own scratch
  // growing makes its recordings stale (it records again). The device
  // values read (token ids, positions, block tables) are read at replay, so
  // one recording serves every step of the same shape. Default: runs body.
  virtual absl::Status RunRecorded(const std::vector<int64_t>& key, absl::FunctionRef<absl::Status()> body) {
    (void)key;
    return body();
  }
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_BACKEND_H_
