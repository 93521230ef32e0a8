#include "common/tokenizer/tokenizer_test_util.h"

#include "common/tokenizer/byte_alphabet.h"

namespace tandem::tokenizer_test {

TokenizerData ByteVocabularyData() {
  TokenizerData data;
  data.model = "gpt2";
  data.pre = "gpt2";
  for (int b = 0; b < 256; ++b) {
    data.tokens.push_back(
        tokenizer_internal::EncodeByteAlphabet(std::string(1, static_cast<char>(b))));
    data.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    data.tokens.push_back(special);
    data.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  data.tokens.push_back("<tool>");
  data.token_types.push_back(static_cast<int32_t>(TokenType::kUserDefined));
  data.bos_token_id = kByteVocabImStart;
  data.eos_token_id = kByteVocabImEnd;
  data.padding_token_id = kByteVocabEndOfText;
  return data;
}

std::vector<std::string> Utf8Corpus() {
  std::vector<std::string> corpus = {
      "",
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.\n",
      "\U0001F44B\U0001F3FD\U0001F44B\U0001F3FF waving, skin tones",
      "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 (ZWJ)",
      "flags \U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8 and \u2764\uFE0F",
      "日本語のテキスト、漢字とかな。",
      "中文文本：你好，世界！",
      "한국어 텍스트",
      "مرحبا بالعالم — العربية",
      "שלום עולם",
      "naïve café résumé Ünïcödé",
      "e\u0301 a\u0308 o\u0302\u0323 combining marks",
      "control \x01\x02\x07\x1b[0m\x7f chars",
      "\x1c\x1d\x1e\x1f separators",
      "tabs\tand\t\ttabs\t",
      "   leading and trailing   ",
      "\n\n\nnewlines\r\n\r\n",
      "nbsp\u00A0ideographic\u3000\u3000line\u2028para\u2029em\u2003x",
      "digits 0123456789 ٠١٢٣ ๑๒๓ ½ Ⅻ ①",
      "don't I'll we're they've she'd it's DON'T ''s",
      "<|im_start|>user\nhi<|im_end|>\n<|im_end <|im_start| <tool></tool>",
      "code:\n    if (x  ==  y) {\n\t\treturn;  // done\n    }\n",
      "4-byte: \U00010348 \U0001D11E \U0010FFFD",
      "BOM \uFEFF and ZWSP \u200B and soft\u00ADhyphen",
  };
  // A NUL inside a literal ends the std::string early; add one explicitly.
  corpus.push_back(std::string("nul\0byte", 8));
  return corpus;
}

std::string SmolLm2Path() {
  return std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace tandem::tokenizer_test
