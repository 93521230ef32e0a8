#include "common/gguf/llama_config.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem::gguf {
namespace {

// Reads a positive int32 from `key`; when the key is absent, returns
// `fallback` if it is positive and NotFound otherwise.
absl::StatusOr<int32_t> ReadPositive(const GgufFile& file, const std::string& key, int32_t fallback = 0) {
  if (!file.Has(key)) {
    if (fallback > 0) return fallback;
    return absl::NotFoundError(absl::StrCat("metadata key '", key, "' is missing; a llama model needs it"));
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t value, file.GetInt64(key));
  if (value <= 0 || value > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "' = ", value, " must be in [1, ",
                                                   std::numeric_limits<int32_t>::max(), "]"));
  }
  return static_cast<int32_t>(value);
}

// Reads a positive finite float from `key`, or `fallback` when absent.
absl::StatusOr<float> ReadPositiveFloat(const GgufFile& file, const std::string& key, float fallback) {
  if (!file.Has(key)) return fallback;
  TANDEM_ASSIGN_OR_RETURN(const float value, file.GetFloat(key));
  if (!std::isfinite(value) || value <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key '", key, "' = ", value, " must be positive and finite"));
  }
  return value;
}

absl::Status ReadRopeScaling(const GgufFile& file, const std::string& prefix, LlamaConfig* c) {
  const std::string type_key = prefix + "rope.scaling.type";
  std::string type = "none";
  if (file.Has(type_key)) {
    TANDEM_ASSIGN_OR_RETURN(type, file.GetString(type_key));
  } else if (file.Has(prefix + "rope.scale_linear")) {
    type = "linear";  // the key older converters wrote for linear scaling
  }
  if (type == "none") {
    c->rope_scaling = RopeScaling::kNone;
    return absl::OkStatus();
  }
  if (type == "linear") {
    c->rope_scaling = RopeScaling::kLinear;
  } else if (type == "yarn") {
    c->rope_scaling = RopeScaling::kYarn;
  } else if (type == "llama3") {
    c->rope_scaling = RopeScaling::kLlama3;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("metadata key '", type_key, "' = '", type, "' is not supported (none, linear, yarn, llama3)"));
  }
  const std::string factor_key =
      file.Has(prefix + "rope.scaling.factor") ? prefix + "rope.scaling.factor" : prefix + "rope.scale_linear";
  TANDEM_ASSIGN_OR_RETURN(c->rope_scaling_factor, ReadPositiveFloat(file, factor_key, 1.0f));
  const std::string original_key = prefix + "rope.scaling.original_context_length";
  if (file.Has(original_key)) {
    TANDEM_ASSIGN_OR_RETURN(c->rope_original_context_length, ReadPositive(file, original_key));
  }
  return absl::OkStatus();
}

// llama.vocab_size, else the tokenizer's token count, else token_embd's rows.
absl::StatusOr<int32_t> ReadVocabSize(const GgufFile& file, const std::string& prefix) {
  if (file.Has(prefix + "vocab_size")) return ReadPositive(file, prefix + "vocab_size");
  if (const GgufValue* tokens = file.Find("tokenizer.ggml.tokens")) {
    const auto* list = std::get_if<std::vector<std::string>>(&tokens->value);
    if (list != nullptr && !list->empty() && list->size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return static_cast<int32_t>(list->size());
    }
  }
  const GgufTensor* embd = file.FindTensor("token_embd.weight");
  if (embd != nullptr && embd->shape.size() == 2 && embd->shape[1] <= std::numeric_limits<int32_t>::max()) {
    return static_cast<int32_t>(embd->shape[1]);
  }
  return absl::NotFoundError(absl::StrCat("cannot tell the vocabulary size: no ", prefix,
                                          "vocab_size, tokenizer.ggml.tokens or token_embd.weight"));
}

absl::Status ReadSizes(const GgufFile& file, const std::string& prefix, LlamaConfig* c) {
  TANDEM_ASSIGN_OR_RETURN(c->num_layers, ReadPositive(file, prefix + "block_count"));
  TANDEM_ASSIGN_OR_RETURN(c->hidden_size, ReadPositive(file, prefix + "embedding_length"));
  TANDEM_ASSIGN_OR_RETURN(c->intermediate_size, ReadPositive(file, prefix + "feed_forward_length"));
  TANDEM_ASSIGN_OR_RETURN(c->num_heads, ReadPositive(file, prefix + "attention.head_count"));
  TANDEM_ASSIGN_OR_RETURN(c->num_kv_heads, ReadPositive(file, prefix + "attention.head_count_kv", c->num_heads));
  TANDEM_ASSIGN_OR_RETURN(c->context_length, ReadPositive(file, prefix + "context_length"));
  const std::string key_length = prefix + "attention.key_length";
  if (file.Has(key_length)) {
    TANDEM_ASSIGN_OR_RETURN(c->head_dim, ReadPositive(file, key_length));
  } else if (c->hidden_size % c->num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "embedding_length ", c->hidden_size,
                                                   " is not a multiple of ", prefix, "attention.head_count ",
                                                   c->num_heads, " (and no ", key_length, " is given)"));
  } else {
    c->head_dim = c->hidden_size / c->num_heads;
  }
  const std::string value_length = prefix + "attention.value_length";
  if (file.Has(value_length)) {
    TANDEM_ASSIGN_OR_RETURN(const int32_t v, ReadPositive(file, value_length));
    if (v != c->head_dim) {
      return absl::UnimplementedError(absl::StrCat(value_length, " ", v, " differs from the key length ", c->head_dim,
                                                   "; tandem needs them equal"));
    }
  }
  if (c->num_heads % c->num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "attention.head_count ", c->num_heads,
                                                   " is not a multiple of ", prefix, "attention.head_count_kv ",
                                                   c->num_kv_heads));
  }
  TANDEM_ASSIGN_OR_RETURN(c->rope_dim, ReadPositive(file, prefix + "rope.dimension_count", c->head_dim));
  if (c->rope_dim > c->head_dim || c->rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "rope.dimension_count ", c->rope_dim,
                                                   " must be even and at most the head size ", c->head_dim));
  }
  TANDEM_ASSIGN_OR_RETURN(c->vocab_size, ReadVocabSize(file, prefix));
  TANDEM_ASSIGN_OR_RETURN(c->rope_freq_base, ReadPositiveFloat(file, prefix + "rope.freq_base", 10000.0f));
  TANDEM_ASSIGN_OR_RETURN(c->rms_norm_eps, ReadPositiveFloat(file, prefix + "attention.layer_norm_rms_epsilon", 1e-5f));
  return ReadRopeScaling(file, prefix, c);
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

// Checks that tensor `name` exists (unless optional) with shape `shape`.
// `meaning` explains the expected shape in config terms, for the message.
absl::Status ExpectTensor(const GgufFile& file, const std::string& name, const std::vector<int64_t>& shape,
                          absl::string_view meaning) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor ", name, " is missing"));
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ", ShapeText(t->shape), ", expected ",
                                                   ShapeText(shape), " (", meaning, ")"));
  }
  if (!IsSupportedType(static_cast<uint32_t>(t->type))) {
    return absl::UnimplementedError(
        absl::StrCat("tensor ", name, " has unsupported type ", static_cast<uint32_t>(t->type)));
  }
  return absl::OkStatus();
}

absl::Status CheckTensors(const GgufFile& file, LlamaConfig* c) {
  const int64_t hidden = c->hidden_size;
  const int64_t q_dim = int64_t{c->num_heads} * c->head_dim;
  const int64_t kv_dim = int64_t{c->num_kv_heads} * c->head_dim;
  const int64_t inter = c->intermediate_size;
  TANDEM_RETURN_IF_ERROR(ExpectTensor(file, "token_embd.weight", {hidden, c->vocab_size}, "hidden_size, vocab_size"));
  TANDEM_RETURN_IF_ERROR(ExpectTensor(file, "output_norm.weight", {hidden}, "hidden_size"));
  c->tied_embeddings = file.FindTensor("output.weight") == nullptr;
  if (!c->tied_embeddings) {
    TANDEM_RETURN_IF_ERROR(ExpectTensor(file, "output.weight", {hidden, c->vocab_size}, "hidden_size, vocab_size"));
  }
  struct Expected {
    const char* suffix;
    std::vector<int64_t> shape;
    const char* meaning;
  };
  const Expected layer[] = {
      {"attn_norm.weight", {hidden}, "hidden_size"},
      {"attn_q.weight", {hidden, q_dim}, "hidden_size, num_heads * head_dim"},
      {"attn_k.weight", {hidden, kv_dim}, "hidden_size, num_kv_heads * head_dim"},
      {"attn_v.weight", {hidden, kv_dim}, "hidden_size, num_kv_heads * head_dim"},
      {"attn_output.weight", {q_dim, hidden}, "num_heads * head_dim, hidden_size"},
      {"ffn_norm.weight", {hidden}, "hidden_size"},
      {"ffn_gate.weight", {hidden, inter}, "hidden_size, intermediate_size"},
      {"ffn_up.weight", {hidden, inter}, "hidden_size, intermediate_size"},
      {"ffn_down.weight", {inter, hidden}, "intermediate_size, hidden_size"},
  };
  for (int32_t i = 0; i < c->num_layers; ++i) {
    for (const Expected& e : layer) {
      absl::Status s = ExpectTensor(file, absl::StrCat("blk.", i, ".", e.suffix), e.shape, e.meaning);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(s.message(), "; layer ", i, " of ", c->num_layers));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> ReadLlamaConfig(const GgufFile& file) {
  LlamaConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.architecture, file.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return absl::UnimplementedError(
        absl::StrCat("general.architecture is '", c.architecture, "'; tandem runs 'llama' models only"));
  }
  if (file.Has("general.name")) {
    TANDEM_ASSIGN_OR_RETURN(c.name, file.GetString("general.name"));
  }
  const std::string prefix = c.architecture + ".";
  TANDEM_RETURN_IF_ERROR(ReadSizes(file, prefix, &c));
  TANDEM_RETURN_IF_ERROR(CheckTensors(file, &c));
  return c;
}

}  // namespace tandem::gguf
