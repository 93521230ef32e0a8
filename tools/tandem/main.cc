// tandem: the command-line entry point. `tandem <command> [flags]`.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/tandem/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: tandem <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve       serve a model with an OpenAI-compatible HTTP API (and a gRPC API):\n"
    "              a scheduler and its workers on this machine\n"
    "  generate    continue a prompt with a model (in-process engine, or --connect)\n"
    "  bench       benchmark an OpenAI-compatible HTTP server (like `vllm bench serve`)\n"
    "  perplexity  the perplexity of a text file under a model\n"
    "  trace       walk one request through the real scheduler and engine loop\n"
    "              (fake model) and print every schedule, output and discard\n"
    "  make-model  write a small random-weight Llama GGUF (for tests)\n"
    "  version     print the version and the build's accelerator support\n"
    "\n"
    "`tandem <command> --help` lists a command's flags.\n";

int PrintVersion() {
  // Whether a device is usable is the worker's question (--backend cuda says
  // why not); this is what the build can run.
  std::printf("tandem %s (CUDA %s, NCCL %s; backends: %s)\n", TANDEM_VERSION, TANDEM_HAVE_CUDA ? "yes" : "no",
              TANDEM_HAVE_NCCL ? "yes" : "no", TANDEM_HAVE_CUDA ? "cpu, cuda" : "cpu");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "trace") return tandem::tools::RunTrace(args);
  if (command == "make-model") return tandem::tools::RunMakeModel(args);
  if (command == "generate") return tandem::tools::RunGenerate(args);
  if (command == "perplexity") return tandem::tools::RunPerplexity(args);
  if (command == "serve") return tandem::tools::RunServe(args);
  if (command == "bench") return tandem::tools::RunBench(args);
  if (command == "version" || command == "--version") return PrintVersion();
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
