// What the fuzz harnesses of the OpenAI wire format check on every input,
// shared by the libFuzzer targets (built with -DTANDEM_FUZZ=ON, run by
// tools/fuzz.sh) and the seeded mutation test that runs in ctest.
//
// Beyond "no crash, no sanitizer report", each check states properties that
// the rest of the server relies on, so that a fuzzer finds wrong answers too:
// a parsed request is within every documented limit and its strings are
// valid UTF-8 (they are later tokenized and echoed in JSON); a refusal is a
// 4xx whose JSON body parses; a rendered chat prompt holds each message's
// content in order and grows by appending.
//
// Each returns "" when the input behaved, otherwise what went wrong (the
// libFuzzer target aborts with it, the test reports it). Thread-compatible.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_FUZZ_OPENAI_FUZZ_CHECKS_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_FUZZ_OPENAI_FUZZ_CHECKS_H_

#include <string>
#include <string_view>

namespace tandem::openai::fuzz {

// `body` as a /v1/completions and as a /v1/chat/completions request body.
std::string CheckRequestBody(std::string_view body);

// `input` is a chat template, optionally followed by "\0" and messages:
// "role\x01content" entries separated by "\x02". Without "\0" the template
// renders [{"user", "hi"}]. The template is recognized or refused; what is
// recognized renders the messages (with and without the generation prompt)
// or refuses them by their roles.
std::string CheckChatTemplate(std::string_view input);

// Splits a chat-template fuzz input as CheckChatTemplate does.
inline constexpr char kTemplateEnd = '\0';
inline constexpr char kRoleEnd = '\x01';
inline constexpr char kMessageEnd = '\x02';

}  // namespace tandem::openai::fuzz

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_FUZZ_OPENAI_FUZZ_CHECKS_H_
