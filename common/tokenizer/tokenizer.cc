#include "common/tokenizer/tokenizer.h"

#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_alphabet.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/special_token_matcher.h"

namespace tandem {
namespace {

using tokenizer_internal::BpeModel;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::SpecialTokenMatcher;

// How each token type behaves. Control and unknown tokens are the
// "special" ones that only a trusted caller may produce from text
// (parse_special) and that Decode(skip_special) drops. User-defined tokens
// are added vocabulary (HF added tokens with special=false): Hugging Face
// and llama.cpp match them in any text and always decode them, and so do
// we. Both kinds are stored as raw text, not in the byte alphabet.
bool IsControlType(int32_t type) {
  return type == static_cast<int32_t>(TokenType::kControl) ||
         type == static_cast<int32_t>(TokenType::kUnknown);
}
bool IsUserDefinedType(int32_t type) {
  return type == static_cast<int32_t>(TokenType::kUserDefined);
}

// What a model name in tokenizer.ggml.model means, for the refusal message.
const char* ModelKind(const std::string& model) {
  if (model == "llama") return " (SentencePiece)";
  if (model == "t5") return " (Unigram)";
  if (model == "bert") return " (WordPiece)";
  if (model == "rwkv") return " (RWKV)";
  return "";
}

absl::Status CheckSpecialId(std::string_view key, TokenId id, size_t num_tokens) {
  if (id == -1 || (id >= 0 && static_cast<size_t>(id) < num_tokens)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.", std::string(key), " ", id,
                                                 " is out of range for ", num_tokens, " tokens"));
}

absl::Status Validate(const TokenizerData& data) {
  if (data.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.model \"", data.model, "\"", ModelKind(data.model),
                     " is not supported: tandem's tokenizer is byte-level BPE (\"gpt2\") only"));
  }
  const size_t n = data.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.tokens has ", n, " tokens"));
  }
  if (!data.token_types.empty() && data.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.token_type has ", data.token_types.size(), " entries for ", n, " tokens"));
  }
  for (size_t i = 0; i < data.token_types.size(); ++i) {
    const int32_t type = data.token_types[i];
    if (type < 0 || type > static_cast<int32_t>(TokenType::kByte)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type[", i, "] = ", type,
                                                     " is not a GGUF token type (0..6)"));
    }
  }
  TANDEM_RETURN_IF_ERROR(CheckSpecialId("bos_token_id", data.bos_token_id, n));
  TANDEM_RETURN_IF_ERROR(CheckSpecialId("eos_token_id", data.eos_token_id, n));
  TANDEM_RETURN_IF_ERROR(CheckSpecialId("unknown_token_id", data.unknown_token_id, n));
  TANDEM_RETURN_IF_ERROR(CheckSpecialId("padding_token_id", data.padding_token_id, n));
  return absl::OkStatus();
}

// Per-Encode cache of word -> ids: text repeats its words, and merging is
// the expensive part. Local to one call, so Encode stays lock-free.
class WordCache {
 public:
  // Appends the ids of `word`, merging it on first sight.
  void Append(const BpeModel& bpe, std::string_view word, std::vector<TokenId>* ids) {
    auto [it, inserted] = spans_.try_emplace(word);
    if (inserted) {
      it->second.first = static_cast<uint32_t>(arena_.size());
      bpe.EncodeWord(word, &arena_);
      it->second.second = static_cast<uint32_t>(arena_.size());
    }
    ids->insert(ids->end(), arena_.begin() + it->second.first, arena_.begin() + it->second.second);
  }

 private:
  absl::flat_hash_map<std::string_view, std::pair<uint32_t, uint32_t>> spans_;  // [begin, end)
  std::vector<TokenId> arena_;
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerData data;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> bpe;
  // With parse_special: control, unknown and user-defined tokens.
  std::optional<SpecialTokenMatcher> all_special;
  // Without: user-defined tokens only.
  std::optional<SpecialTokenMatcher> user_defined;
  absl::flat_hash_map<std::string, TokenId> token_ids;  // text -> first id with it
  std::vector<std::string> token_bytes;
  std::vector<bool> is_control;
  std::vector<bool> is_special;

  void EncodeText(std::string_view text, WordCache* cache, std::vector<std::string_view>* words,
                  std::vector<TokenId>* ids) const {
    words->clear();
    pre_tokenizer->Split(text, words);
    for (std::string_view word : *words) {
      if (word.size() == 1) {
        const TokenId id = bpe->byte_token(static_cast<uint8_t>(word[0]));
        if (id >= 0) ids->push_back(id);  // else a byte without a token: dropped
      } else {
        cache->Append(*bpe, word, ids);
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerData data) {
  TANDEM_RETURN_IF_ERROR(Validate(data));
  auto impl = std::make_unique<Impl>();
  TANDEM_ASSIGN_OR_RETURN(impl->pre_tokenizer, PreTokenizer::Create(data.pre));
  const size_t n = data.tokens.size();
  impl->token_ids.reserve(n);
  impl->token_bytes.resize(n);
  impl->is_control.resize(n);
  impl->is_special.resize(n);
  std::vector<std::pair<std::string, TokenId>> all_special, user_defined;
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = data.tokens[i];
    const TokenId id = static_cast<TokenId>(i);
    impl->token_ids.try_emplace(text, id);
    const int32_t type = data.token_types.empty() ? 1 : data.token_types[i];
    impl->is_control[i] = IsControlType(type);
    impl->is_special[i] = IsControlType(type) || IsUserDefinedType(type);
    if (impl->is_special[i]) {
      impl->token_bytes[i] = text;
      all_special.emplace_back(text, id);
      if (IsUserDefinedType(type)) user_defined.emplace_back(text, id);
    } else if (!tokenizer_internal::DecodeByteAlphabet(text, &impl->token_bytes[i])) {
      // Outside the alphabet: HF's ByteLevel decoder falls back to the text.
      impl->token_bytes[i] = text;
    }
  }
  TANDEM_ASSIGN_OR_RETURN(impl->bpe, BpeModel::Create(impl->token_ids, data.merges));
  impl->all_special.emplace(std::move(all_special));
  impl->user_defined.emplace(std::move(user_defined));
  impl->data = std::move(data);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special && impl_->data.add_bos_token && impl_->data.bos_token_id >= 0) {
    ids.push_back(impl_->data.bos_token_id);
  }
  const SpecialTokenMatcher& specials = parse_special ? *impl_->all_special : *impl_->user_defined;
  WordCache cache;
  std::vector<std::string_view> words;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::optional<SpecialTokenMatcher::Match> match = specials.FindNext(text, pos);
    const size_t end = match ? match->pos : text.size();
    // Text between special tokens is pre-tokenized on its own, as in HF.
    impl_->EncodeText(text.substr(pos, end - pos), &cache, &words, &ids);
    if (!match) break;
    ids.push_back(match->id);
    pos = match->pos + match->length;
  }
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const TokenId> ids, bool skip_special) const {
  std::string out;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && impl_->is_control[id]) continue;
    out += impl_->token_bytes[id];
  }
  return out;
}

std::string Tokenizer::TokenBytes(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->token_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_bytes.size()); }
TokenId Tokenizer::bos_token_id() const { return impl_->data.bos_token_id; }
TokenId Tokenizer::eos_token_id() const { return impl_->data.eos_token_id; }

bool Tokenizer::IsSpecial(TokenId id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special[id];
}

TokenId Tokenizer::FindToken(std::string_view text) const {
  auto it = impl_->token_ids.find(absl::string_view(text.data(), text.size()));
  return it == impl_->token_ids.end() ? -1 : it->second;
}

const TokenizerData& Tokenizer::data() const { return impl_->data; }

}  // namespace tandem
