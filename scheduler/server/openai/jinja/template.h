// jinja::Template: a parsed Jinja template, rendered by our own interpreter
// with the semantics of jinja2 as Hugging Face transformers configures it for
// chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// the loopcontrols extension, transformers' `generation` block). The subset
// real chat templates use: outputs, if/elif/else, for (loop.*, else, a
// filter `if`, break/continue), set (tuples, blocks, namespace attributes),
// macros with defaults, call blocks, filter blocks, jinja2's filters and
// tests, and the Python methods of str, dict and list (builtins.h).
//
// Errors, in parsing and in rendering (an undefined method, a type error,
// a template's raise_exception), are InvalidArgument naming the line and
// column; nothing throws. Rendering is bounded: nesting, macro recursion,
// steps and output size have limits, so any input finishes quickly.
//
// Thread-safe after Parse (immutable); Render may run on any thread at once.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_TEMPLATE_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler/server/openai/jinja/value.h"

namespace tandem::jinja {

struct RenderLimits {
  int64_t max_steps = 5'000'000;       // nodes executed plus expressions evaluated
  size_t max_output_bytes = 64 << 20;  // rendered text, including macro results
  int max_call_depth = 64;             // nested macro calls
};

class Template {
 public:
  static absl::StatusOr<Template> Parse(std::string_view source);

  // `globals` are the template's variables and functions (a callable's
  // errors become the render's, with the caller's position). jinja2's own
  // globals (range, namespace, dict) are always there.
  absl::StatusOr<std::string> Render(const ValueDict& globals, const RenderLimits& limits = {}) const;

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_TEMPLATE_H_
