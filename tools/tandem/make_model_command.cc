// `tandem make-model`: writes a small random-weight Llama model as GGUF v3
// (common/gguf/random_llama.h: llama.cpp's SmolLM2 layout, a byte-level
// GPT-2 tokenizer, a ChatML template), so tests and demos can run the whole
// stack without downloading weights. This file only maps flags to options.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/gguf/ggml_types.h"
#include "common/gguf/random_llama.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {
namespace {

using gguf::GgmlType;

struct TypeFlag {
  const char* name;
  GgmlType type;
};
constexpr TypeFlag kTypes[] = {
    {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},   {"bf16", GgmlType::kBF16},
    {"q8_0", GgmlType::kQ8_0}, {"q4_0", GgmlType::kQ4_0}, {"q4_1", GgmlType::kQ4_1},
};

}  // namespace

int RunMakeModel(const std::vector<std::string>& args) {
  gguf::RandomLlamaOptions o;
  std::string output;
  std::string type = "f32";
  int64_t seed = static_cast<int64_t>(o.seed);
  FlagParser flags("tandem make-model",
                   "Writes a random-weight Llama model (GGUF v3, llama.cpp's layout) with a byte-level\n"
                   "GPT-2 tokenizer and a ChatML template, for tests and demos.");
  flags.AddString("output", &output, "path of the .gguf file to write (required)");
  flags.AddString("name", &o.name, "general.name");
  flags.AddInt("layers", &o.layers, "decoder layers", 1, 1024);
  flags.AddInt("hidden", &o.hidden, "hidden size (embedding length)", 1, 1 << 16);
  flags.AddInt("heads", &o.heads, "attention heads", 1, 1024);
  flags.AddInt("kv-heads", &o.kv_heads, "key/value heads (grouped-query attention)", 1, 1024);
  flags.AddInt("intermediate", &o.intermediate, "feed-forward size", 1, 1 << 18);
  flags.AddInt("context", &o.context, "context length", 1, 1 << 24);
  flags.AddInt("vocab", &o.vocab, "vocabulary size; 0 = the byte tokenizer's 259", 0, 1 << 22);
  flags.AddString("type", &type, "matrix type: f32, f16, bf16, q8_0, q4_0 or q4_1 (norms are always f32)");
  flags.AddInt("seed", &seed, "random seed for the weights", 0);
  flags.AddBool("tied-embeddings", &o.tied_embeddings, "reuse token_embd.weight as the output projection");
  flags.AddDouble("rope-base", &o.rope_base, "RoPE frequency base");
  flags.AddDouble("rms-eps", &o.rms_eps, "RMSNorm epsilon");
  flags.AddDouble("weight-scale", &o.weight_scale, "standard deviation of the random matrix weights (0.2 gives outputs that depend on the context)");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  if (output.empty()) {
    std::fprintf(stderr, "tandem make-model: flag --output is required\n");
    return 2;
  }
  const TypeFlag* type_flag = nullptr;
  for (const TypeFlag& t : kTypes) {
    if (type == t.name) type_flag = &t;
  }
  if (type_flag == nullptr) {
    std::fprintf(stderr, "tandem make-model: flag --type must be one of f32, f16, bf16, q8_0, q4_0, q4_1, got '%s'\n",
                 type.c_str());
    return 2;
  }
  o.type = type_flag->type;
  o.seed = static_cast<uint64_t>(seed);
  // Relations between flags ("--hidden must be a multiple of --heads").
  if (absl::Status s = gguf::ValidateRandomLlama(o); !s.ok()) {
    std::fprintf(stderr, "tandem make-model: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  int64_t parameters = 0;
  absl::StatusOr<std::string> image = gguf::MakeRandomLlama(o, &parameters);
  absl::Status s = image.ok() ? WriteFileAtomically(output, *image) : image.status();
  if (!s.ok()) {
    std::fprintf(stderr, "tandem make-model: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const int64_t vocab = o.vocab == 0 ? gguf::kByteVocabSize : o.vocab;
  std::printf("wrote %s: llama, %lld layers, hidden %lld, vocab %lld, %s, %lld parameters\n", output.c_str(),
              static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(vocab),
              type.c_str(), static_cast<long long>(parameters));
  return 0;
}

}  // namespace tandem::tools
