# Bad flags and files get a clear message and a non-zero exit at once, in
# the process that was given them: `tandem serve` checks what it forwards
# before it starts any child.
function(expect_refusal expected_rc expected_message)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 20)
  if(NOT rc STREQUAL "${expected_rc}")
    message(FATAL_ERROR "${ARGN}: exit status ${rc}, expected ${expected_rc}\n${err}")
  endif()
  string(FIND "${err}" "${expected_message}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${ARGN}: expected the message\n  ${expected_message}\ngot\n${err}")
  endif()
  # Said once: the cause is not repeated by a caller that wraps it.
  string(REPLACE "${expected_message}" "" rest "${err}")
  string(FIND "${rest}" "${expected_message}" again)
  if(NOT again EQUAL -1)
    message(FATAL_ERROR "${ARGN}: the message appears twice:\n${err}")
  endif()
endfunction()

set(missing "${CMAKE_CURRENT_BINARY_DIR}/no-such-model.gguf")
expect_refusal(2 "flag --kv-cache-memory expects a size like 512MiB or 2GiB, got 'banana'"
               ${TANDEM} serve --kv-cache-memory banana --port 0 --grpc-port 0)
expect_refusal(2 "flag --block-size must be a power of two, got 3" ${TANDEM} serve --block-size 3 --port 0 --grpc-port 0)
expect_refusal(2 "flag --step-timeout must be positive" ${TANDEM} serve --step-timeout 0 --port 0 --grpc-port 0)
expect_refusal(2 "cannot open ${missing}: No such file or directory (tools/setup.sh fetches the default model)"
               ${TANDEM} serve --model ${missing} --port 0 --grpc-port 0)
expect_refusal(1 "cannot open ${missing}: No such file or directory (tools/setup.sh fetches the default model)"
               ${SCHEDULER} --model ${missing} --port 0 --http-port -1)
expect_refusal(1 "cannot open ${missing}: No such file or directory (tools/setup.sh fetches the default model)"
               ${WORKER} --model ${missing})
expect_refusal(2 "flag --kv-cache-memory expects a size" ${WORKER} --kv-cache-memory banana)
expect_refusal(2 "flag --max-num-seqs must be in [1, 1048576], got 0" ${SCHEDULER} --max-num-seqs 0)
expect_refusal(2 "flag --worker-port must be in [-1, 65535], got 70000" ${SCHEDULER} --worker-port 70000)
expect_refusal(1 "the workers' port must differ from the gRPC port (50999)"
               ${SCHEDULER} --port 50999 --worker-port 50999 --http-port -1)
string(REPEAT "d" 120 long_dir)
expect_refusal(1 "the workers' socket path is 132 bytes; a Unix socket's is at most 107"
               ${SCHEDULER} --worker-socket /tmp/${long_dir}/w.sock --http-port -1)
expect_refusal(1 "${CMAKE_CURRENT_LIST_FILE} exists and is not a socket: not replacing it"
               ${SCHEDULER} --worker-socket ${CMAKE_CURRENT_LIST_FILE} --http-port -1)
expect_refusal(1 "no directory /nonexistent-dir/ for the workers' socket /nonexistent-dir/w.sock"
               ${SCHEDULER} --worker-socket /nonexistent-dir/w.sock --http-port -1)
expect_refusal(2 "flag --scheduler: unix: needs the path of the scheduler's --worker-socket" ${WORKER} --scheduler unix:)
expect_refusal(2 "flag --backend must be cpu or cuda, got 'tpu'" ${TANDEM} serve --backend tpu --port 0 --grpc-port 0)
expect_refusal(2 "flag --backend must be cpu or cuda, got 'tpu'" ${WORKER} --backend tpu)
expect_refusal(2 "flag --comm nccl needs --backend cuda" ${WORKER} --comm nccl)
expect_refusal(2 "flag --gpu-memory-utilization must be in (0, 1], got 1.5" ${WORKER} --gpu-memory-utilization 1.5)
expect_refusal(2 "flag --kv-cache-dtype must be auto, float16 or float32, got 'fp8'"
               ${TANDEM} serve --kv-cache-dtype fp8 --port 0 --grpc-port 0)
expect_refusal(2 "flag --kv-cache-dtype must be auto, float16 or float32, got 'fp8'" ${WORKER} --kv-cache-dtype fp8)
# A type the backend does not keep: refused before any child starts, and by
# --check-flags as at start.
expect_refusal(1 "--kv-cache-dtype float16: the CUDA backend's KV cache is float32 (use auto or float32)"
               ${TANDEM} serve --backend cuda --kv-cache-dtype float16 --port 0 --grpc-port 0)
expect_refusal(2 "--kv-cache-dtype float16: the CUDA backend's KV cache is float32 (use auto or float32)"
               ${WORKER} --check-flags --backend cuda --kv-cache-dtype float16)
expect_refusal(2 "unknown --kv-cache-dtype 'half' (auto, float16 or float32)"
               ${TANDEM} generate --prompt hi --kv-cache-dtype half)
expect_refusal(2 "unknown --kv-cache-dtype 'half' (auto, float16 or float32)"
               ${TANDEM} perplexity --file ${CMAKE_CURRENT_LIST_FILE} --kv-cache-dtype half)

# --backend cuda where it cannot run (a build without CUDA, a machine without
# a usable GPU, as in CI) exits 1 naming the cause, before the model is read;
# where it can, the missing model is what stops it.
execute_process(COMMAND ${WORKER} --backend cuda --model ${missing}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 20)
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "tandem-worker --backend cuda: exit status ${rc}, expected 1\n${err}")
endif()
string(FIND "${err}" "--backend cuda" cause)
string(FIND "${err}" "cannot open ${missing}" no_model)
if(cause EQUAL -1 AND no_model EQUAL -1)
  message(FATAL_ERROR "tandem-worker --backend cuda: expected the cause (--backend cuda ...), got\n${err}")
endif()

# --check-flags (what the deploy_manifests test runs on every manifest's
# command line): a bad value is refused as without it; good ones exit 0
# without reading the model.
expect_refusal(2 "flag --rank expects an integer, got '$(LWS_WORKER_INDEX)'" ${WORKER} --check-flags "--rank=$(LWS_WORKER_INDEX)")
expect_refusal(2 "flag --rank must be below --world-size (2), got 2" ${WORKER} --check-flags --rank=2 --world-size=2)
expect_refusal(2 "flag --max-num-seqs must be in [1, 1048576], got 0" ${SCHEDULER} --check-flags --max-num-seqs=0)
expect_refusal(0 "tandem-worker: flags accepted" ${WORKER} --check-flags --model=${missing} --rank=1 --world-size=2
               --scheduler=leader.tandem:50051 --comm-port=50100 --health-port=50052)
expect_refusal(0 "tandem-scheduler: flags accepted" ${SCHEDULER} --check-flags --model=${missing} --host=0.0.0.0)
