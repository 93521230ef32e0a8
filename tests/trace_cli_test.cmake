# Runs `tandem trace` as a user would and checks the numbers of the worked
# example in scheduler/README.md §2 (case 1, case 2, an EOS as the first
# token, and depth 3), and that a bad flag exits non-zero with a message
# naming it.
function(expect_summary args expected)
  separate_arguments(argv UNIX_COMMAND "${args}")
  execute_process(COMMAND ${TANDEM} trace ${argv} --json
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tandem trace ${args} failed (${rc}): ${err}")
  endif()
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tandem trace ${args}: expected\n  ${expected}\ngot\n${out}")
  endif()
endfunction()

# Case 1: 3 tokens, length, nothing wasted, 8 tokens scheduled.
expect_summary("--prompt-tokens 6 --max-tokens 3 --token-budget 4"
  "{\"event\":\"summary\",\"wasted_steps\":0,\"output_tokens\":3,\"finish_reason\":\"length\",\"scheduled_tokens\":8}")
# Case 2: EOS as the 2nd token: 2 tokens, stop, one step wasted.
expect_summary("--prompt-tokens 6 --max-tokens 8 --token-budget 4 --eos-at 2"
  "{\"event\":\"summary\",\"wasted_steps\":1,\"output_tokens\":2,\"finish_reason\":\"stop\"")
# Try it 1: EOS as the 1st token still wastes one step at depth 2.
expect_summary("--prompt-tokens 6 --max-tokens 8 --token-budget 4 --eos-at 1"
  "{\"event\":\"summary\",\"wasted_steps\":1,\"output_tokens\":1,\"finish_reason\":\"stop\"")
# Try it 2: a queue of depth 3 wastes two.
expect_summary("--prompt-tokens 6 --max-tokens 8 --token-budget 4 --eos-at 2 --depth 3"
  "{\"event\":\"summary\",\"wasted_steps\":2,\"output_tokens\":2,\"finish_reason\":\"stop\"")
# ...and a length-capped request wastes none at depth 3 either.
expect_summary("--prompt-tokens 6 --max-tokens 3 --token-budget 4 --depth 3"
  "{\"event\":\"summary\",\"wasted_steps\":0,\"output_tokens\":3,\"finish_reason\":\"length\",\"scheduled_tokens\":8}")

execute_process(COMMAND ${TANDEM} trace --max-tokens 0 ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--max-tokens must be")
  message(FATAL_ERROR "a bad flag should exit 2 naming the flag; got ${rc}: ${err}")
endif()
