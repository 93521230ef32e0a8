#include "scheduler/server/openai/prompt_logprobs_json.h"

#include <algorithm>
#include <string>

namespace tandem::openai {

using Json = nlohmann::json;

Json PromptLogprobsJson(const std::vector<scheduler::PromptTokenLogprob>& scores, const Tokenizer& tokenizer) {
  Json list = Json::array({nullptr});
  for (const scheduler::PromptTokenLogprob& s : scores) {
    Json entry = Json::object();
    int32_t rank = 1;
    for (const auto& [id, logprob] : s.top) {
      entry[std::to_string(id)] = {{"logprob", logprob}, {"rank", rank++}, {"decoded_token", tokenizer.TokenBytes(id)}};
    }
    entry[std::to_string(s.token)] = {
        {"logprob", s.logprob}, {"rank", s.rank}, {"decoded_token", tokenizer.TokenBytes(s.token)}};
    list.push_back(std::move(entry));
  }
  return list;
}

Json EchoLogprobs(const std::vector<TokenId>& prompt, const std::vector<scheduler::PromptTokenLogprob>& scores,
                  int32_t top, const Tokenizer& tokenizer, const Json& completion) {
  Json tokens = Json::array(), token_logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  int32_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string token = tokenizer.TokenBytes(prompt[i]);
    tokens.push_back(token);
    offsets.push_back(offset);
    offset += static_cast<int32_t>(token.size());
    // Position i - 1's logits score token i; the first token has none.
    if (i == 0 || i - 1 >= scores.size()) {
      token_logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const scheduler::PromptTokenLogprob& s = scores[i - 1];
    token_logprobs.push_back(s.logprob);
    Json entry = Json::object();
    const size_t n = std::min(s.top.size(), static_cast<size_t>(std::max(top, 0)));
    for (size_t j = 0; j < n; ++j) entry[tokenizer.TokenBytes(s.top[j].first)] = s.top[j].second;
    entry[token] = s.logprob;
    tops.push_back(std::move(entry));
  }
  for (const Json& t : completion.value("tokens", Json::array())) tokens.push_back(t);
  for (const Json& l : completion.value("token_logprobs", Json::array())) token_logprobs.push_back(l);
  for (const Json& t : completion.value("top_logprobs", Json::array())) tops.push_back(t);
  for (const Json& o : completion.value("text_offset", Json::array())) offsets.push_back(offset + o.get<int32_t>());
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace tandem::openai
