#include "common/gguf/random_llama.h"

#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_writer.h"
#include "common/status_macros.h"
#include "common/tokenizer/byte_alphabet.h"

namespace tandem::gguf {
namespace {

constexpr int32_t kByteTokens = 256;
// llama.cpp's token types.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUnused = 5;

constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// llama.cpp's general.file_type (LLAMA_FTYPE_*) for a matrix type.
uint32_t FileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kBF16: return 32;
  }
  return 0;
}

void AddTokenizer(const RandomLlamaOptions& o, int64_t vocab, GgufWriter* w) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int32_t b = 0; b < kByteTokens; ++b) {
    tokens.push_back(tokenizer_internal::EncodeByteAlphabet(std::string(1, static_cast<char>(b))));
    types.push_back(kTokenNormal);
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(special);
    types.push_back(kTokenControl);
  }
  // A vocabulary larger than the byte one pads with tokens never produced.
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < vocab; ++i) {
    tokens.push_back(absl::StrCat("<|reserved_", i, "|>"));
    types.push_back(kTokenUnused);
  }
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", "gpt2");
  w->SetStringArray("tokenizer.ggml.tokens", tokens);
  w->SetInt32Array("tokenizer.ggml.token_type", types);
  w->SetStringArray("tokenizer.ggml.merges", {});
  w->SetUint32("tokenizer.ggml.bos_token_id", kByteTokens);
  w->SetUint32("tokenizer.ggml.eos_token_id", kByteTokens);
  w->SetBool("tokenizer.ggml.add_bos_token", false);
  w->SetString("tokenizer.chat_template", kChatMlTemplate);
}

void AddMetadata(const RandomLlamaOptions& o, int64_t vocab, GgufWriter* w) {
  const std::string arch = "llama";
  w->SetString("general.architecture", arch);
  w->SetString("general.name", o.name);
  w->SetUint32("general.file_type", FileType(o.type));
  if (BlockElements(o.type) > 1) w->SetUint32("general.quantization_version", 2);
  w->SetUint32(arch + ".block_count", static_cast<uint32_t>(o.layers));
  w->SetUint32(arch + ".context_length", static_cast<uint32_t>(o.context));
  w->SetUint32(arch + ".embedding_length", static_cast<uint32_t>(o.hidden));
  w->SetUint32(arch + ".feed_forward_length", static_cast<uint32_t>(o.intermediate));
  w->SetUint32(arch + ".attention.head_count", static_cast<uint32_t>(o.heads));
  w->SetUint32(arch + ".attention.head_count_kv", static_cast<uint32_t>(o.kv_heads));
  w->SetFloat32(arch + ".rope.freq_base", static_cast<float>(o.rope_base));
  w->SetFloat32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(o.rms_eps));
  w->SetUint32(arch + ".vocab_size", static_cast<uint32_t>(vocab));
  w->SetUint32(arch + ".rope.dimension_count", static_cast<uint32_t>(o.hidden / o.heads));
  AddTokenizer(o, vocab, w);
}

// Normal(0, 1) by Box-Muller over mt19937_64, whose output the standard
// fixes, unlike std::normal_distribution's.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  float Next() {
    constexpr double kPi = 3.14159265358979323846;
    const double u1 = (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2));
  }

 private:
  std::mt19937_64 rng_;
};

absl::Status AddTensors(const RandomLlamaOptions& o, int64_t vocab, GgufWriter* w, int64_t* parameters) {
  Gaussian gaussian(o.seed);
  const int64_t head_dim = o.hidden / o.heads;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) -> absl::Status {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool norm = shape.size() == 1;
    std::vector<float> values(static_cast<size_t>(n), 1.0f);  // norms: the identity scale
    if (!norm) {
      for (float& v : values) v = static_cast<float>(o.weight_scale) * gaussian.Next();
    }
    *parameters += n;
    return w->AddTensor(name, shape, norm ? GgmlType::kF32 : o.type, values);
  };
  TANDEM_RETURN_IF_ERROR(add("token_embd.weight", {o.hidden, vocab}));
  for (int64_t i = 0; i < o.layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    TANDEM_RETURN_IF_ERROR(add(p + "attn_norm.weight", {o.hidden}));
    TANDEM_RETURN_IF_ERROR(add(p + "attn_q.weight", {o.hidden, o.heads * head_dim}));
    TANDEM_RETURN_IF_ERROR(add(p + "attn_k.weight", {o.hidden, o.kv_heads * head_dim}));
    TANDEM_RETURN_IF_ERROR(add(p + "attn_v.weight", {o.hidden, o.kv_heads * head_dim}));
    TANDEM_RETURN_IF_ERROR(add(p + "attn_output.weight", {o.heads * head_dim, o.hidden}));
    TANDEM_RETURN_IF_ERROR(add(p + "ffn_norm.weight", {o.hidden}));
    TANDEM_RETURN_IF_ERROR(add(p + "ffn_gate.weight", {o.hidden, o.intermediate}));
    TANDEM_RETURN_IF_ERROR(add(p + "ffn_up.weight", {o.hidden, o.intermediate}));
    TANDEM_RETURN_IF_ERROR(add(p + "ffn_down.weight", {o.intermediate, o.hidden}));
  }
  TANDEM_RETURN_IF_ERROR(add("output_norm.weight", {o.hidden}));
  if (!o.tied_embeddings) TANDEM_RETURN_IF_ERROR(add("output.weight", {o.hidden, vocab}));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRandomLlama(const RandomLlamaOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.layers < 1 || o.hidden < 1 || o.heads < 1 || o.kv_heads < 1 || o.intermediate < 1 || o.context < 1) {
    return bad("--layers, --hidden, --heads, --kv-heads, --intermediate and --context must be positive");
  }
  if (o.vocab != 0 && o.vocab < kByteVocabSize) {
    return bad(absl::StrCat("--vocab must be at least ", kByteVocabSize, " (the byte tokenizer's size), got ", o.vocab));
  }
  if (o.hidden % o.heads != 0 || (o.hidden / o.heads) % 2 != 0) {
    return bad(absl::StrCat("--hidden (", o.hidden, ") must be --heads (", o.heads, ") times an even head size"));
  }
  if (o.heads % o.kv_heads != 0) {
    return bad(absl::StrCat("--heads (", o.heads, ") must be a multiple of --kv-heads (", o.kv_heads, ")"));
  }
  const int64_t block = BlockElements(o.type);
  for (auto [flag, value] : {std::pair<const char*, int64_t>{"hidden", o.hidden}, {"intermediate", o.intermediate}}) {
    if (value % block != 0) {
      return bad(absl::StrCat("--", flag, " (", value, ") must be a multiple of ", block, " for type ",
                              std::string(GgmlTypeName(static_cast<uint32_t>(o.type)))));
    }
  }
  if (!(o.rope_base > 0) || !std::isfinite(o.rope_base)) {
    return bad(absl::StrCat("--rope-base must be positive, got ", o.rope_base));
  }
  if (!(o.weight_scale > 0) || !std::isfinite(o.weight_scale)) {
    return bad(absl::StrCat("--weight-scale must be positive, got ", o.weight_scale));
  }
  if (!(o.rms_eps > 0) || !std::isfinite(o.rms_eps)) {
    return bad(absl::StrCat("--rms-eps must be positive, got ", o.rms_eps));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeRandomLlama(const RandomLlamaOptions& options, int64_t* parameters) {
  TANDEM_RETURN_IF_ERROR(ValidateRandomLlama(options));
  const int64_t vocab = options.vocab == 0 ? kByteVocabSize : options.vocab;
  GgufWriter writer;
  AddMetadata(options, vocab, &writer);
  int64_t count = 0;
  TANDEM_RETURN_IF_ERROR(AddTensors(options, vocab, &writer, &count));
  if (parameters != nullptr) *parameters = count;
  return writer.Serialize();
}

absl::StatusOr<std::unique_ptr<GgufFile>> MakeRandomLlamaFile(const RandomLlamaOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::string image, MakeRandomLlama(options));
  return GgufFile::FromBytes(std::move(image));
}

}  // namespace tandem::gguf
