// Paged attention on the GPU, through the scheduler's block tables, with GQA.
// Decode rows (one query token) run one CTA per (sequence, KV head) with an
// online softmax, the context split across CTAs beyond a few hundred tokens
// and merged by a second kernel; chunked-prefill rows are causal within the
// chunk. Semantics are CpuBackend::PagedAttention's (backend.h).
//
// Host launchers: no CUDA header here.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_PAGED_ATTENTION_H_
#define TANDEM_WORKER_BACKENDS_CUDA_PAGED_ATTENTION_H_

#include <cstddef>

#include "absl/status/status.h"
#include "worker/backends/backend.h"

struct CUstream_st;

namespace tandem::worker {

// Device scratch the launch needs for `p` (partial results of split
// contexts); depends only on host fields (num_seqs, max_seq_len, heads).
size_t PagedAttentionWorkspaceBytes(const AttentionParams& p);

// Enqueues the attention of `p` on `stream`. InvalidArgument for bad
// parameters (head_dim unsupported, workspace too small).
absl::Status LaunchPagedAttention(const AttentionParams& p, void* workspace, size_t workspace_bytes,
                                  CUstream_st* stream);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_PAGED_ATTENTION_H_
