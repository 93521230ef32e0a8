// structured_mask_bench: what structured output costs the scheduler's engine
// thread per step, on the real SmolLM2 vocabulary: building the vocabulary,
// compiling the benchmark's JSON schema, and per row of a step the mask
// (FillBitmask) and the matcher's advance (AcceptTokens), along a valid
// output. CPU time (of this thread for masks, of the process for compiling),
// so a loaded machine does not inflate it. tools/bench/structured_bench.py runs it.
//
//   build/bin/structured_mask_bench [MODEL.gguf] [--json]
#include <time.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/structured/grammar_factory.h"

namespace {

double CpuSeconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The schema of tools/bench/structured_bench.py and an output it allows.
constexpr char kSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":24},"age":{"type":"integer"},)"
    R"("city":{"type":"string","maxLength":24},"email":{"type":"string","maxLength":40},)"
    R"("active":{"type":"boolean"}},"required":["name","age","city","email","active"]})";
constexpr char kOutput[] =
    R"({"name": "Ada Lovelace", "age": 36, "city": "London", "email": "ada@example.org", "active": true})";

double ThreadSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }
// Compilation runs on xgrammar's threads too.
double ProcessSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      model = argv[i];
    }
  }
  auto tokenizer = tandem::LoadTokenizerFile(model);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "structured_mask_bench: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  tandem::structured::GrammarFactory factory(tokenizer->get());
  const tandem::structured::StructuredSpec spec{tandem::structured::StructuredKind::kJsonSchema, kSchema, {}, "bench"};
  double t0 = ProcessSeconds();
  auto compiled = factory.Compile(spec);  // the vocabulary and the first compilation
  const double first_compile = ProcessSeconds() - t0;
  if (!compiled.ok()) {
    std::fprintf(stderr, "structured_mask_bench: %s\n", std::string(compiled.status().message()).c_str());
    return 1;
  }
  t0 = ThreadSeconds();
  (void)factory.Compile(spec);
  const double cached = ThreadSeconds() - t0;

  const std::vector<tandem::TokenId> tokens = (*tokenizer)->Encode(kOutput, false, false);
  const int32_t vocab = (*tokenizer)->vocab_size();
  std::vector<uint32_t> row((vocab + 31) / 32);
  constexpr int kRounds = 200;
  double fill = 0, accept = 0;
  int64_t rows = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto g = tandem::structured::GrammarFactory::NewGrammar(*compiled, {(*tokenizer)->eos_token_id()});
    for (tandem::TokenId t : tokens) {
      std::fill(row.begin(), row.end(), 0u);
      double a = ThreadSeconds();
      g->FillBitmask(absl::MakeSpan(row), vocab);
      double b = ThreadSeconds();
      if (!(row[t / 32] >> (t % 32) & 1u) || !g->AcceptTokens({t})) {
        std::fprintf(stderr, "structured_mask_bench: the sample output is not allowed by its schema\n");
        return 1;
      }
      double c = ThreadSeconds();
      fill += b - a;
      accept += c - b;
      ++rows;
    }
  }
  const double fill_us = 1e6 * fill / rows, accept_us = 1e6 * accept / rows;
  if (json) {
    std::printf(
        "{\"first_compile_ms\": %.1f, \"cached_compile_us\": %.1f, \"fill_us_per_row\": %.1f, "
        "\"accept_us_per_row\": %.2f, \"tokens_per_output\": %zu}\n",
        1e3 * first_compile, 1e6 * cached, fill_us, accept_us, tokens.size());
  } else {
    std::printf("vocabulary + first compile: %.1f ms CPU; cached compile: %.1f us\n", 1e3 * first_compile, 1e6 * cached);
    std::printf("per structured row per step: mask %.1f us, advance %.2f us (over %lld rows, %zu tokens each)\n",
                fill_us, accept_us, static_cast<long long>(rows), tokens.size());
    std::printf("per step at 32 rows: %.2f ms at 100%% structured, %.2f ms at 25%%\n", 32 * (fill_us + accept_us) / 1e3,
                8 * (fill_us + accept_us) / 1e3);
  }
  return 0;
}
