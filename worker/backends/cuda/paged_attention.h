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
// parameters, checked on the host before anything is enqueued (heads not
// divisible, head_dim other than 64 or 128, block_size not a power of two,
// max_query_len < 1 or > max_seq_len, q/out/cache not aligned to
// head_dim / 32 floats, workspace smaller than PagedAttentionWorkspaceBytes);
// a launch failure as cuda_status.h maps it. REQUIRES (device values the
// host cannot check): every seq_lens[i] <= max_seq_len and every sequence's
// query count <= max_query_len and <= its seq_len; a decode row whose context
// exceeds what max_seq_len provided for is written as NaN, never truncated.
absl::Status LaunchPagedAttention(const AttentionParams& p, void* workspace, size_t workspace_bytes,
                                  CUstream_st* stream);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_PAGED_ATTENTION_H_
