#include "worker/model/llama_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::worker {

namespace {

// Process-wide, not per model: a model made where a destroyed one was (the
// same address, as many allocations) must not match its recordings, whose
// graphs point at the old model's freed weights and cache.
int64_t NextBuffersGeneration() {
  static std::atomic<int64_t> next{0};
  return ++next;
}

absl::StatusOr<const gguf::GgufTensor*> Tensor(const gguf::GgufFile& file, const std::string& name) {
  const gguf::GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("the model has no tensor ", name));
  return t;
}

}  // namespace

LlamaModelStage PipelineStage(int32_t num_layers, int32_t num_stages, int32_t stage) {
  const int32_t base = num_layers / num_stages;
  const int32_t extra = num_layers % num_stages;
  const int32_t first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

LlamaModel::LlamaModel(const gguf::LlamaConfig& config, Backend* backend, Stage stage)
    : config_(config),
      backend_(backend),
      first_layer_(stage.first_layer),
      end_layer_(stage.end_layer < 0 ? config.num_layers : stage.end_layer) {}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file,
                                                             const gguf::LlamaConfig& config, Backend* backend,
                                                             Stage stage) {
  const int32_t end = stage.end_layer < 0 ? config.num_layers : stage.end_layer;
  if (stage.first_layer < 0 || end > config.num_layers || stage.first_layer >= end) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", stage.first_layer, ", ", end,
                                                   ") is not within the model's ", config.num_layers, " layers"));
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, backend, stage));
  TANDEM_RETURN_IF_ERROR(model->LoadWeights(file));
  return model;
}

absl::Status LlamaModel::LoadWeights(const gguf::GgufFile& file) {
  auto load_matrix = [&](const std::string& name, Weight* w) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(const gguf::GgufTensor* t, Tensor(file, name));
    TANDEM_ASSIGN_OR_RETURN(*w, backend_->LoadWeight(*t));
    weight_bytes_ += static_cast<int64_t>(w->buffer->size());
    return absl::OkStatus();
  };
  auto load_vector = [&](const std::string& name, std::unique_ptr<DeviceBuffer>* v) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(const gguf::GgufTensor* t, Tensor(file, name));
    TANDEM_ASSIGN_OR_RETURN(*v, backend_->LoadVector(*t));
    weight_bytes_ += static_cast<int64_t>((*v)->size());
    return absl::OkStatus();
  };
  if (is_first_stage() || (is_last_stage() && config_.tied_embeddings)) {
    TANDEM_RETURN_IF_ERROR(load_matrix("token_embd.weight", &embedding_));
  }
  if (is_last_stage()) {
    TANDEM_RETURN_IF_ERROR(load_vector("output_norm.weight", &output_norm_));
    if (!config_.tied_embeddings) TANDEM_RETURN_IF_ERROR(load_matrix("output.weight", &output_));
  }
  layers_.resize(end_layer_ - first_layer_);
  for (int32_t i = first_layer_; i < end_layer_; ++i) {
    Layer& layer = layers_[i - first_layer_];
    const std::string prefix = absl::StrCat("blk.", i, ".");
    TANDEM_RETURN_IF_ERROR(load_vector(prefix + "attn_norm.weight", &layer.attn_norm));
    TANDEM_RETURN_IF_ERROR(load_vector(prefix + "ffn_norm.weight", &layer.ffn_norm));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "attn_q.weight", &layer.wq));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "attn_k.weight", &layer.wk));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "attn_v.weight", &layer.wv));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "attn_output.weight", &layer.wo));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "ffn_gate.weight", &layer.gate));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "ffn_up.weight", &layer.up));
    TANDEM_RETURN_IF_ERROR(load_matrix(prefix + "ffn_down.weight", &layer.down));
  }
  return absl::OkStatus();
}

int64_t LlamaModel::KvBytesPerLayerBlock(int32_t block_size) const {
  // K or V of one layer, in the backend's element type.
  return int64_t{block_size} * config_.num_kv_heads * config_.head_dim *
         static_cast<int64_t>(KvElementBytes(backend_->kv_type()));
}

int64_t LlamaModel::KvBytesPerBlock(int32_t block_size) const {
  // K and V of every layer of this stage.
  return 2 * KvBytesPerLayerBlock(block_size) * num_stage_layers();
}

absl::Status LlamaModel::AllocateKvCache(int32_t num_blocks, int32_t block_size) {
  const size_t bytes_per_layer = static_cast<size_t>(num_blocks) * KvBytesPerLayerBlock(block_size);
  for (Layer& layer : layers_) {
    TANDEM_ASSIGN_OR_RETURN(layer.k_cache, backend_->Allocate(bytes_per_layer));
    TANDEM_ASSIGN_OR_RETURN(layer.v_cache, backend_->Allocate(bytes_per_layer));
  }
  num_kv_blocks_ = num_blocks;
  block_size_ = block_size;
  buffers_generation_ = NextBuffersGeneration();
  return absl::OkStatus();
}

absl::Status LlamaModel::EnsureScratch(int32_t num_tokens) {
  if (num_tokens <= scratch_tokens_) return absl::OkStatus();
  const size_t t = static_cast<size_t>(std::max(num_tokens, 2 * scratch_tokens_));
  const size_t f = sizeof(float);
  const int32_t q_width = config_.num_heads * config_.head_dim;
  const int32_t kv_width = config_.num_kv_heads * config_.head_dim;
  TANDEM_ASSIGN_OR_RETURN(x_, backend_->Allocate(t * config_.hidden_size * f));
  TANDEM_ASSIGN_OR_RETURN(h_, backend_->Allocate(t * config_.hidden_size * f));
  TANDEM_ASSIGN_OR_RETURN(q_, backend_->Allocate(t * q_width * f));
  TANDEM_ASSIGN_OR_RETURN(k_, backend_->Allocate(t * kv_width * f));
  TANDEM_ASSIGN_OR_RETURN(v_, backend_->Allocate(t * kv_width * f));
  TANDEM_ASSIGN_OR_RETURN(attn_, backend_->Allocate(t * q_width * f));
  TANDEM_ASSIGN_OR_RETURN(gate_, backend_->Allocate(t * config_.intermediate_size * f));
  TANDEM_ASSIGN_OR_RETURN(up_, backend_->Allocate(t * config_.intermediate_size * f));
  TANDEM_ASSIGN_OR_RETURN(rows_, backend_->Allocate(t * config_.hidden_size * f));
  scratch_tokens_ = static_cast<int32_t>(t);
  buffers_generation_ = NextBuffersGeneration();
  return absl::OkStatus();
}

absl::Status LlamaModel::RunLayer(Layer& layer, const ForwardInputs& in) {
  const gguf::LlamaConfig& c = config_;
  const int32_t n = in.num_tokens;
  float* x = x_->as<float>();
  float* h = h_->as<float>();
  TANDEM_RETURN_IF_ERROR(backend_->RmsNorm({x, layer.attn_norm->as<float>(), h, n, c.hidden_size, c.rms_norm_eps}));
  TANDEM_RETURN_IF_ERROR(backend_->MatmulGroup(
      {h, n, 3, {&layer.wq, &layer.wk, &layer.wv}, {q_->as<float>(), k_->as<float>(), v_->as<float>()}}));
  const float freq_scale = c.rope_scaling == gguf::RopeScaling::kLinear ? 1.0f / c.rope_scaling_factor : 1.0f;
  const KvCacheLayer cache{layer.k_cache->data(), layer.v_cache->data(), backend_->kv_type()};
  TANDEM_RETURN_IF_ERROR(backend_->RopeWriteKv(
      {q_->as<float>(), k_->as<float>(), in.positions, n, c.num_heads, c.num_kv_heads, c.head_dim, c.rope_dim,
       c.rope_freq_base, freq_scale},
      {cache, k_->as<float>(), v_->as<float>(), in.kv_slots, n, c.num_kv_heads * c.head_dim}));
  AttentionParams attention;
  attention.cache = cache;
  attention.q = q_->as<float>();
  attention.out = attn_->as<float>();
  attention.query_start = in.query_start;
  attention.seq_lens = in.seq_lens;
  attention.block_table_start = in.block_table_start;
  attention.block_tables = in.block_tables;
  attention.num_seqs = in.num_seqs;
  attention.max_seq_len = in.max_seq_len;
  attention.max_query_len = in.max_query_len;
  attention.num_heads = c.num_heads;
  attention.num_kv_heads = c.num_kv_heads;
  attention.head_dim = c.head_dim;
  attention.block_size = block_size_;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  TANDEM_RETURN_IF_ERROR(backend_->PagedAttention(attention));
  TANDEM_RETURN_IF_ERROR(backend_->Matmul({attn_->as<float>(), &layer.wo, n, x, /*accumulate=*/true}));

  TANDEM_RETURN_IF_ERROR(backend_->RmsNorm({x, layer.ffn_norm->as<float>(), h, n, c.hidden_size, c.rms_norm_eps}));
  TANDEM_RETURN_IF_ERROR(
      backend_->MatmulGroup({h, n, 2, {&layer.gate, &layer.up}, {gate_->as<float>(), up_->as<float>()}}));
  TANDEM_RETURN_IF_ERROR(
      backend_->SiluMul({gate_->as<float>(), up_->as<float>(), gate_->as<float>(), n, c.intermediate_size}));
  return backend_->Matmul({gate_->as<float>(), &layer.down, n, x, /*accumulate=*/true});
}

std::vector<int64_t> LlamaModel::RecordingKey(const ForwardInputs& in, const float* hidden_in,
                                              const float* hidden_out, const float* logits) const {
  auto address = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  return {address(this),
          buffers_generation_,
          in.num_tokens,
          in.num_seqs,
          in.max_seq_len,
          in.max_query_len,
          in.num_logits_rows,
          address(in.input_ids),
          address(in.positions),
          address(in.kv_slots),
          address(in.query_start),
          address(in.seq_lens),
          address(in.block_table_start),
          address(in.block_tables),
          address(in.logits_rows),
          address(hidden_in),
          address(hidden_out),
          address(logits)};
}

absl::Status LlamaModel::Forward(const ForwardInputs& raw, const float* hidden_in, float* hidden_out, float* logits) {
  if (num_kv_blocks_ == 0) return absl::FailedPreconditionError("the KV cache is not allocated");
  if (raw.num_tokens <= 0) return absl::InvalidArgumentError("a forward pass needs at least one token");
  // Allocation happens here, outside what a backend records.
  TANDEM_RETURN_IF_ERROR(EnsureScratch(raw.num_tokens));
  ForwardInputs in = raw;
  in.max_seq_len = (raw.max_seq_len + kSeqLenBucket - 1) / kSeqLenBucket * kSeqLenBucket;
  return backend_->RunRecorded(RecordingKey(in, hidden_in, hidden_out, logits),
                               [&] { return ForwardPass(in, hidden_in, hidden_out, logits); });
}

absl::Status LlamaModel::ForwardPass(const ForwardInputs& in, const float* hidden_in, float* hidden_out,
                                     float* logits) {
  const int64_t width = config_.hidden_size;
  float* x = x_->as<float>();
  if (is_first_stage()) {
    TANDEM_RETURN_IF_ERROR(backend_->Embedding({&embedding_, in.input_ids, in.num_tokens, x}));
  } else {
    TANDEM_RETURN_IF_ERROR(backend_->CopyOnDevice(x, hidden_in, static_cast<size_t>(in.num_tokens) * width * sizeof(float)));
  }
  for (Layer& layer : layers_) TANDEM_RETURN_IF_ERROR(RunLayer(layer, in));
  if (!is_last_stage()) {
    return backend_->CopyOnDevice(hidden_out, x, static_cast<size_t>(in.num_tokens) * width * sizeof(float));
  }
  if (in.num_logits_rows == 0) return absl::OkStatus();
  float* rows = rows_->as<float>();
  TANDEM_RETURN_IF_ERROR(backend_->GatherRows({x, in.logits_rows, in.num_logits_rows, width, rows}));
  TANDEM_RETURN_IF_ERROR(
      backend_->RmsNorm({rows, output_norm_->as<float>(), rows, in.num_logits_rows, width, config_.rms_norm_eps}));
  const Weight& head = config_.tied_embeddings ? embedding_ : output_;
  return backend_->Matmul({rows, &head, in.num_logits_rows, logits});
}

}  // namespace tandem::worker
