// A small typed command-line parser for tandem's executables. Flags are
// declared in main.cc files, or in a process's *_flags.h when `tandem serve`
// forwards them too; libraries receive typed config structs
// (scheduler/README.md §9, convention 6).
// Every parse error names the flag and what was expected, so a bad flag exits
// non-zero with a message a user can act on.
//
//   FlagParser flags("tandem trace", "Walk one request through the engine.");
//   int64_t max_tokens = 3;
//   flags.AddInt("max-tokens", &max_tokens, "output tokens to generate", 1);
//   if (absl::Status s = flags.Parse(args); !s.ok()) { ... exit 2 ... }
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_COMMON_FLAGS_H_
#define TANDEM_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Parses a byte size as AddBytes accepts it.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);
// The shortest exact form ParseByteSize reads back: "1GiB", "96MiB", "1000".
std::string FormatByteSize(int64_t bytes);

class FlagParser {
 public:
  FlagParser(std::string program, std::string description);

  void AddInt(const std::string& name, int64_t* target, const std::string& help,
              int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max());
  void AddDouble(const std::string& name, double* target, const std::string& help);
  // Accepts --name, --no-name, --name=true|false.
  void AddBool(const std::string& name, bool* target, const std::string& help);
  void AddString(const std::string& name, std::string* target, const std::string& help);
  // A byte size: "1073741824", "512MiB", "2GiB", "1.5GB" (KiB/MiB/GiB are
  // powers of 1024, KB/MB/GB of 1000).
  void AddBytes(const std::string& name, int64_t* target, const std::string& help);

  // Parses `args` (without the program name). Accepts `--name=value` and
  // `--name value`. Returns InvalidArgument naming the offending flag.
  // `help_requested()` is true after `--help`/`-h`.
  absl::Status Parse(const std::vector<std::string>& args);
  // For a command's main: parses `args`; on an error prints it to stderr and
  // returns 2, on --help prints the usage and returns 0; otherwise nullopt.
  std::optional<int> ParseOrExitCode(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // Whether the last Parse gave --name a value (so a caller can pick a
  // default that depends on other flags).
  bool WasSet(const std::string& name) const;
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    // Parses and stores a value; returns an error message or "".
    std::function<std::string(const std::string&)> set;
    bool was_set = false;  // by the last Parse
  };
  Flag* Find(const std::string& name);

  std::string program_;
  std::string description_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_H_
