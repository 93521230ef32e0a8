#include "common/gguf/gguf_test_util.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace tandem::gguf::testing {

ByteBuilder& ByteBuilder::TensorInfo(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                                     uint64_t offset) {
  Str(name).U32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) U64(d);
  return U32(type).U64(offset);
}

ByteBuilder& ByteBuilder::PadTo(size_t alignment) {
  bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, '\0');
  return *this;
}

std::vector<float> RandomValues(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::vector<float> values(static_cast<size_t>(n));
  // Raw engine output, not std::uniform_real_distribution, whose values
  // differ between standard libraries.
  for (float& v : values) v = scale * (static_cast<float>(rng() >> 8) / 8388608.0f - 1.0f);
  return values;
}

void AddTinyLlama(const TinyLlama& o, GgufWriter* w) {
  auto keep = [&o](const std::string& key) {
    return std::find(o.omit_keys.begin(), o.omit_keys.end(), key) == o.omit_keys.end();
  };
  auto set_u32 = [&](const std::string& key, int64_t value) {
    if (keep(key)) w->SetUint32(key, static_cast<uint32_t>(value));
  };
  auto set_f32 = [&](const std::string& key, float value) {
    if (keep(key)) w->SetFloat32(key, value);
  };
  if (keep("general.architecture")) w->SetString("general.architecture", "llama");
  if (keep("general.name")) w->SetString("general.name", "tiny test llama");
  set_u32("llama.block_count", o.layers);
  set_u32("llama.context_length", o.context);
  set_u32("llama.embedding_length", o.hidden);
  set_u32("llama.feed_forward_length", o.intermediate);
  set_u32("llama.attention.head_count", o.heads);
  set_u32("llama.attention.head_count_kv", o.kv_heads);
  set_f32("llama.rope.freq_base", 10000.0f);
  set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  set_u32("llama.vocab_size", o.vocab);
  if (o.with_tokenizer) {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int64_t i = 0; i < o.vocab; ++i) {
      tokens.push_back(absl::StrCat("t", i));
      types.push_back(1);
    }
    w->SetString("tokenizer.ggml.model", "gpt2");
    w->SetStringArray("tokenizer.ggml.tokens", tokens);
    w->SetInt32Array("tokenizer.ggml.token_type", types);
    w->SetUint32("tokenizer.ggml.bos_token_id", 0);
    w->SetBool("tokenizer.ggml.add_bos_token", false);
  }
  const int64_t head_dim = o.hidden / o.heads;
  uint32_t seed = o.seed;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, GgmlType type) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values =
        type == GgmlType::kF32 && shape.size() == 1 ? std::vector<float>(n, 1.0f) : RandomValues(n, seed++, 0.05f);
    TANDEM_CHECK_OK(w->AddTensor(name, shape, type, values));
  };
  add("token_embd.weight", {o.hidden, o.vocab}, o.type);
  for (int64_t i = 0; i < o.layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    add(p + "attn_norm.weight", {o.hidden}, GgmlType::kF32);
    add(p + "attn_q.weight", {o.hidden, o.heads * head_dim}, o.type);
    add(p + "attn_k.weight", {o.hidden, o.kv_heads * head_dim}, o.type);
    add(p + "attn_v.weight", {o.hidden, o.kv_heads * head_dim}, o.type);
    add(p + "attn_output.weight", {o.heads * head_dim, o.hidden}, o.type);
    add(p + "ffn_norm.weight", {o.hidden}, GgmlType::kF32);
    add(p + "ffn_gate.weight", {o.hidden, o.intermediate}, o.type);
    add(p + "ffn_up.weight", {o.hidden, o.intermediate}, o.type);
    add(p + "ffn_down.weight", {o.intermediate, o.hidden}, o.type);
  }
  add("output_norm.weight", {o.hidden}, GgmlType::kF32);
  if (!o.tied) add("output.weight", {o.hidden, o.vocab}, o.type);
}

std::string TinyLlamaImage(const TinyLlama& options) {
  GgufWriter writer;
  AddTinyLlama(options, &writer);
  return writer.Serialize();
}

}  // namespace tandem::gguf::testing
