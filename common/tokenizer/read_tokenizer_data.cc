// ReadTokenizerData (declared in tokenizer.h): the GGUF side of the
// tokenizer, in its own file so the core builds and tests without a reader.
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {
namespace {

constexpr char kModel[] = "tokenizer.ggml.model";
constexpr char kPre[] = "tokenizer.ggml.pre";
constexpr char kTokens[] = "tokenizer.ggml.tokens";
constexpr char kTokenType[] = "tokenizer.ggml.token_type";
constexpr char kMerges[] = "tokenizer.ggml.merges";
constexpr char kBos[] = "tokenizer.ggml.bos_token_id";
constexpr char kEos[] = "tokenizer.ggml.eos_token_id";
constexpr char kUnknown[] = "tokenizer.ggml.unknown_token_id";
constexpr char kPadding[] = "tokenizer.ggml.padding_token_id";
constexpr char kAddBos[] = "tokenizer.ggml.add_bos_token";
constexpr char kChatTemplate[] = "tokenizer.chat_template";

// The reader's message, with the key named whatever the reader said.
absl::Status KeyError(const char* key, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("GGUF tokenizer metadata ", key, ": ", status.message()));
}

absl::Status Missing(const char* key) {
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF file has no ", key, "; it does not describe a tokenizer"));
}

// An optional token id: -1 when absent.
absl::StatusOr<TokenId> ReadTokenId(const gguf::GgufFile& file, const char* key) {
  if (!file.Has(key)) return -1;
  absl::StatusOr<uint32_t> id = file.GetUint32(key);
  if (!id.ok()) return KeyError(key, id.status());
  if (*id > static_cast<uint32_t>(std::numeric_limits<TokenId>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(key, " ", *id, " is not a token id"));
  }
  return static_cast<TokenId>(*id);
}

template <typename T>
absl::Status ReadInto(absl::StatusOr<T> value, const char* key, T* out) {
  if (!value.ok()) return KeyError(key, value.status());
  *out = std::move(*value);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerData> ReadTokenizerData(const gguf::GgufFile& file) {
  TokenizerData data;
  if (!file.Has(kModel)) return Missing(kModel);
  TANDEM_RETURN_IF_ERROR(ReadInto(file.GetString(kModel), kModel, &data.model));
  // llama.cpp reads a missing pre-tokenizer name as "default".
  data.pre = "default";
  if (file.Has(kPre)) TANDEM_RETURN_IF_ERROR(ReadInto(file.GetString(kPre), kPre, &data.pre));
  if (!file.Has(kTokens)) return Missing(kTokens);
  TANDEM_RETURN_IF_ERROR(ReadInto(file.GetStringArray(kTokens), kTokens, &data.tokens));
  if (file.Has(kTokenType)) {
    std::vector<int64_t> types;
    TANDEM_RETURN_IF_ERROR(ReadInto(file.GetIntArray(kTokenType), kTokenType, &types));
    data.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < std::numeric_limits<int32_t>::min() ||
          types[i] > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(kTokenType, "[", i, "] = ", types[i], " is not a token type"));
      }
      data.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  // A byte vocabulary has no merges; `tandem make-model` may omit the key.
  if (file.Has(kMerges)) {
    TANDEM_RETURN_IF_ERROR(ReadInto(file.GetStringArray(kMerges), kMerges, &data.merges));
  }
  TANDEM_ASSIGN_OR_RETURN(data.bos_token_id, ReadTokenId(file, kBos));
  TANDEM_ASSIGN_OR_RETURN(data.eos_token_id, ReadTokenId(file, kEos));
  TANDEM_ASSIGN_OR_RETURN(data.unknown_token_id, ReadTokenId(file, kUnknown));
  TANDEM_ASSIGN_OR_RETURN(data.padding_token_id, ReadTokenId(file, kPadding));
  if (file.Has(kAddBos)) {
    TANDEM_RETURN_IF_ERROR(ReadInto(file.GetBool(kAddBos), kAddBos, &data.add_bos_token));
  }
  if (file.Has(kChatTemplate)) {
    TANDEM_RETURN_IF_ERROR(
        ReadInto(file.GetString(kChatTemplate), kChatTemplate, &data.chat_template));
  }
  return data;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::OpenModelFile(path));
  TANDEM_ASSIGN_OR_RETURN(TokenizerData data, ReadTokenizerData(*file));
  return Tokenizer::Create(std::move(data));
}

}  // namespace tandem
