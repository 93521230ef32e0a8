// A bounded, seeded random-mutation test of the OpenAI request parser and the
// chat template reader and renderer: the checks of the libFuzzer targets
// (openai_fuzz_checks.h) over mutations of their seed corpus, with their
// dictionaries. Deterministic (fixed seed, fixed count), about a second; the
// unbounded search is tools/fuzz.sh.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/server/openai/fuzz/openai_fuzz_checks.h"

namespace tandem::openai::fuzz {
namespace {

const std::string kDir = std::string(TANDEM_SOURCE_DIR) + "/scheduler/server/openai/fuzz/";

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Corpus(const std::string& name) {
  std::vector<std::string> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(kDir + "corpus/" + name)) {
    seeds.push_back(ReadFile(entry.path()));
  }
  std::sort(seeds.begin(), seeds.end());  // directory order is not stable
  return seeds;
}

// The "..." entries of a libFuzzer dictionary (C escapes, as absl reads them).
std::vector<std::string> Dictionary(const std::string& name) {
  std::vector<std::string> words;
  std::istringstream lines(ReadFile(kDir + name));
  for (std::string line; std::getline(lines, line);) {
    if (line.size() < 2 || line.front() != '"' || line.back() != '"') continue;
    std::string word;
    if (absl::CUnescape(line.substr(1, line.size() - 2), &word)) words.push_back(word);
  }
  return words;
}

// libFuzzer's kinds of edit, roughly: bytes flipped, inserted, erased,
// dictionary words inserted or overwritten, ranges duplicated, splices with
// another seed, truncation.
class Mutator {
 public:
  Mutator(std::vector<std::string> seeds, std::vector<std::string> words, uint64_t seed)
      : seeds_(std::move(seeds)), words_(std::move(words)), rng_(seed) {}

  std::string Next() {
    std::string s = seeds_[Below(seeds_.size())];
    const int edits = 1 + static_cast<int>(Below(4));
    for (int e = 0; e < edits; ++e) Edit(s);
    return s;
  }

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  void Edit(std::string& s) {
    const size_t at = Below(s.size() + 1);
    const std::string& word = words_[Below(words_.size())];
    switch (Below(8)) {
      case 0:
        if (at < s.size()) s[at] = static_cast<char>(s[at] ^ (1 << Below(8)));
        break;
      case 1:
        s.insert(at, 1, static_cast<char>(Below(256)));
        break;
      case 2:
        s.erase(at, 1 + Below(8));
        break;
      case 3:
      case 4:
        s.insert(at, word);
        break;
      case 5:
        s.replace(at, word.size(), word);
        break;
      case 6: {
        const size_t from = Below(s.size() + 1);
        s.insert(at, s.substr(from, 1 + Below(32)));
        break;
      }
      default: {
        const std::string& other = seeds_[Below(seeds_.size())];
        s = s.substr(0, at) + other.substr(Below(other.size() + 1));
        break;
      }
    }
  }

  std::vector<std::string> seeds_;
  std::vector<std::string> words_;
  std::mt19937_64 rng_;
};

// Runs `check` over the seeds and `count` mutations of them; reports the
// first few problems with the input that caused them.
void RunChecks(const std::string& name, int count, const std::function<std::string(std::string_view)>& check) {
  const std::vector<std::string> seeds = Corpus(name);
  ASSERT_FALSE(seeds.empty());
  for (const std::string& seed : seeds) EXPECT_EQ(check(seed), "") << absl::CHexEscape(seed);
  Mutator mutator(seeds, Dictionary(name + ".dict"), /*seed=*/20261201);
  int failures = 0;
  for (int i = 0; i < count && failures < 5; ++i) {
    const std::string input = mutator.Next();
    const std::string problem = check(input);
    if (!problem.empty()) {
      ++failures;
      ADD_FAILURE() << problem << "\ninput " << i << ": \"" << absl::CHexEscape(input) << "\"";
    }
  }
  std::printf("[ info     ] %s: %zu seeds and %d mutations checked\n", name.c_str(), seeds.size(), count);
}

TEST(OpenAiMutationTest, RequestBodies) { RunChecks("request", 60000, CheckRequestBody); }

TEST(OpenAiMutationTest, ChatTemplates) { RunChecks("chat_template", 30000, CheckChatTemplate); }

}  // namespace
}  // namespace tandem::openai::fuzz
