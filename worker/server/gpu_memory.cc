#include "worker/server/gpu_memory.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

double GiB(double bytes) { return bytes / double(int64_t{1} << 30); }

// free_before - free_after, 0 when memory was returned meanwhile.
size_t Used(size_t free_before, size_t free_after) { return free_before > free_after ? free_before - free_after : 0; }

}  // namespace

size_t GpuMemoryPlan::weight_bytes() const { return Used(free_at_start, free_after_weights); }
size_t GpuMemoryPlan::activation_bytes() const {
  return Used(free_after_weights, free_after_profile) + step_io_bytes;
}

std::string GpuMemoryPlan::Describe() const {
  return absl::StrFormat(
      "--gpu-memory-utilization %.2f of %.2f GiB: weights %.2f GiB, activations %.2f GiB, reserve %.2f GiB; "
      "%.2f GiB free now, %.2f GiB held by others",
      utilization, GiB(total_bytes), GiB(weight_bytes()), GiB(activation_bytes()), GiB(reserve_bytes),
      GiB(free_after_profile), GiB(total_bytes > free_at_start ? total_bytes - free_at_start : 0));
}

absl::StatusOr<int64_t> KvCacheBytesFor(const GpuMemoryPlan& plan) {
  const double allowed = plan.utilization * static_cast<double>(plan.total_bytes);
  const double mine = static_cast<double>(plan.weight_bytes() + plan.activation_bytes() + plan.reserve_bytes);
  double kv = allowed - mine;
  // Never more than is free (another process may hold part of the device).
  kv = std::min(kv, static_cast<double>(plan.free_after_profile) -
                        static_cast<double>(plan.reserve_bytes + plan.step_io_bytes));
  if (kv <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no GPU memory is left for the KV cache (", plan.Describe(),
        "); raise --gpu-memory-utilization or free the GPU"));
  }
  return static_cast<int64_t>(kv);
}

absl::StatusOr<size_t> ProfileLargestStep(Backend& backend, LlamaModel& model, int32_t tokens, int32_t rows,
                                int32_t block_size) {
  if (tokens < 1 || rows < 1 || block_size < 1) {
    return absl::InvalidArgumentError("profile step: tokens, rows and block size must be positive");
  }
  rows = std::min(rows, tokens);
  const gguf::LlamaConfig& config = model.config();
  TANDEM_RETURN_IF_ERROR(model.AllocateKvCache(2, block_size));
  // `rows` sequences sharing the tokens; every position's KV goes to block 1
  // (slots repeat, which costs nothing here), and every block table entry is
  // block 1.
  std::vector<TokenId> ids(tokens);
  std::vector<int32_t> positions(tokens), query_start{0}, seq_lens, table_start{0}, logits_rows;
  std::vector<int64_t> slots(tokens);
  std::vector<BlockId> tables;
  int32_t max_len = 0;
  for (int32_t r = 0, start = 0; r < rows; ++r) {
    const int32_t n = tokens / rows + (r < tokens % rows ? 1 : 0);
    for (int32_t p = 0; p < n; ++p) {
      ids[start + p] = (start + p) % config.vocab_size;
      positions[start + p] = p;
      slots[start + p] = int64_t{block_size} + p % block_size;
    }
    start += n;
    query_start.push_back(start);
    seq_lens.push_back(n);
    tables.insert(tables.end(), (n + block_size - 1) / block_size, 1);
    table_start.push_back(static_cast<int32_t>(tables.size()));
    logits_rows.push_back(start - 1);
    max_len = std::max(max_len, n);
  }
  std::vector<std::unique_ptr<DeviceBuffer>> held;
  auto put = [&](const auto& host) -> absl::StatusOr<void*> {
    const size_t bytes = std::max<size_t>(1, host.size() * sizeof(host[0]));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer, backend.Allocate(bytes));
    if (!host.empty()) TANDEM_RETURN_IF_ERROR(backend.Upload(*buffer, 0, host.data(), host.size() * sizeof(host[0])));
    held.push_back(std::move(buffer));
    return held.back()->data();
  };
  ForwardInputs in;
  TANDEM_ASSIGN_OR_RETURN(void* d_ids, put(ids));
  TANDEM_ASSIGN_OR_RETURN(void* d_positions, put(positions));
  TANDEM_ASSIGN_OR_RETURN(void* d_slots, put(slots));
  TANDEM_ASSIGN_OR_RETURN(void* d_query_start, put(query_start));
  TANDEM_ASSIGN_OR_RETURN(void* d_seq_lens, put(seq_lens));
  TANDEM_ASSIGN_OR_RETURN(void* d_table_start, put(table_start));
  TANDEM_ASSIGN_OR_RETURN(void* d_tables, put(tables));
  TANDEM_ASSIGN_OR_RETURN(void* d_logits_rows, put(logits_rows));
  in.input_ids = static_cast<const TokenId*>(d_ids);
  in.positions = static_cast<const int32_t*>(d_positions);
  in.kv_slots = static_cast<const int64_t*>(d_slots);
  in.num_tokens = tokens;
  in.query_start = static_cast<const int32_t*>(d_query_start);
  in.seq_lens = static_cast<const int32_t*>(d_seq_lens);
  in.block_table_start = static_cast<const int32_t*>(d_table_start);
  in.block_tables = static_cast<const BlockId*>(d_tables);
  in.num_seqs = rows;
  in.max_seq_len = max_len;
  in.max_query_len = max_len;
  in.logits_rows = static_cast<const int32_t*>(d_logits_rows);
  in.num_logits_rows = model.is_last_stage() ? rows : 0;
  const size_t hidden_bytes = size_t{1} * tokens * config.hidden_size * sizeof(float);
  std::unique_ptr<DeviceBuffer> hidden_in, hidden_out, logits;
  if (!model.is_first_stage()) {
    TANDEM_ASSIGN_OR_RETURN(hidden_in, backend.Allocate(hidden_bytes));
    const std::vector<float> zeros(size_t{1} * tokens * config.hidden_size, 0.0f);
    TANDEM_RETURN_IF_ERROR(backend.Upload(*hidden_in, 0, zeros.data(), hidden_bytes));
  }
  if (!model.is_last_stage()) {
    TANDEM_ASSIGN_OR_RETURN(hidden_out, backend.Allocate(hidden_bytes));
  } else {
    TANDEM_ASSIGN_OR_RETURN(logits, backend.Allocate(size_t{1} * rows * config.vocab_size * sizeof(float)));
  }
  TANDEM_RETURN_IF_ERROR(model.Forward(in, hidden_in ? hidden_in->as<float>() : nullptr,
                                       hidden_out ? hidden_out->as<float>() : nullptr,
                                       logits ? logits->as<float>() : nullptr));
  TANDEM_RETURN_IF_ERROR(backend.Synchronize());
  size_t io_bytes = 0;
  for (const auto& buffer : held) io_bytes += buffer->size();
  for (const auto* buffer : {hidden_in.get(), hidden_out.get(), logits.get()}) io_bytes += buffer ? buffer->size() : 0;
  return io_bytes;
}

}  // namespace tandem::worker
