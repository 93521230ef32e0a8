// SchedulerFlags: the engine flags of tandem-scheduler, declared once. The
// scheduler's main registers them; `tandem serve` registers the same ones,
// validates them itself (a bad value fails at once, in the parent) and
// forwards them to the scheduler it starts (ToArgs). Where the process
// listens (hosts, ports, port files) is not here: a launcher chooses that.
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_SCHEDULER_SERVER_SCHEDULER_FLAGS_H_
#define TANDEM_SCHEDULER_SERVER_SCHEDULER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "common/rpc/tls_files.h"
#include "scheduler/core/engine_config.h"

namespace tandem::scheduler {

struct SchedulerFlags {
  std::string model = DefaultModelPath();
  int64_t pipeline_parallel_size = 1;
  int64_t max_num_seqs = 128;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;  // 0: the model's, capped by what the KV cache holds
  int64_t block_size = 16;
  bool async_scheduling = true;
  bool enable_prefix_caching = true;
  std::string scheduling_policy = "fcfs";  // or "priority" (vLLM's --scheduling-policy)
  double step_timeout = 30;  // seconds
  // While the worker group is not ready, seconds a request may wait before it
  // fails (503); 0: no bound. Requests past max_queued_requests (not yet
  // scheduled) fail at once (429); 0: no limit. SGLang's --max-queued-requests.
  double queue_timeout = 60;
  int64_t max_queued_requests = 4096;
  std::string trace_steps;   // empty: no trace
  std::string api_key;       // empty: none
  std::string served_model_name;  // empty: the model file's name
  std::string chat_template;      // --chat-template FILE; empty: the GGUF's tokenizer.chat_template
  bool enable_auto_tool_choice = false;  // tool_choice "auto" (needs tool_call_parser)
  std::string tool_call_parser;          // "hermes" or empty
  int64_t http_threads = 2;
  double http_request_timeout = 30;  // seconds from a request's first byte to its last
  double shutdown_grace = 30;  // seconds
  // Mutual TLS on the gRPC port (--tls-cert, --tls-key, --tls-ca): workers
  // and gRPC clients must present a certificate --tls-ca signed. Registered
  // by RegisterTls, not Register, since tandem-worker registers the same
  // names: `tandem serve` calls RegisterTls once and gives the same files to
  // the scheduler and every worker (LocalCluster); ToArgs does not forward
  // them.
  rpc::TlsFiles tls;
  // HTTPS on the HTTP port (--https-cert, --https-key, PEM; both or none):
  // the OpenAI API's clients need no certificate. Registered by Register
  // (tandem serve takes them and forwards them with ToArgs).
  std::string https_cert;
  std::string https_key;

  // Registers every flag above; the current values are the defaults shown.
  void Register(FlagParser* flags);
  // The --tls-* flags (tandem-scheduler, and tandem serve for all its processes).
  void RegisterTls(FlagParser* flags);
  // What can be checked before the model is read: the ranges the parser
  // does not know and the engine configuration, but for the pool size.
  // InvalidArgument naming the flag.
  absl::Status Validate() const;
  // The engine's configuration. The pool size, the vocabulary and (when
  // max_model_len is 0) the model's limit come later.
  EngineConfig ToEngineConfig() const;
  // These flags as tandem-scheduler's arguments ("--name=value").
  std::vector<std::string> ToArgs() const;
  // The model's id in the API: --served-model-name, else the file's name
  // without its directory and ".gguf".
  std::string ServedModelName() const;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_SCHEDULER_FLAGS_H_
