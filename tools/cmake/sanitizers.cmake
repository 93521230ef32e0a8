# Sanitizer and fuzzing builds (README "Reliability").
#
#   -DTANDEM_SANITIZE=address,undefined   every target of the build compiled and
#                                         linked with these -fsanitize= checks;
#                                         a UBSan report stops the program, so
#                                         it fails its test (tools/sanitizer_tests.sh
#                                         runs the unit tests so in ctest)
#   -DTANDEM_SANITIZE=thread              ThreadSanitizer (tools/tsan.sh)
#   -DTANDEM_FUZZ=ON                      libFuzzer targets (clang only; tools/fuzz.sh)
set(TANDEM_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list for the whole build (empty: none)")
option(TANDEM_FUZZ "Build the libFuzzer targets (needs clang)" OFF)

if(TANDEM_SANITIZE)
  add_compile_options(-fsanitize=${TANDEM_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${TANDEM_SANITIZE})
  if(TANDEM_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

if(TANDEM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TANDEM_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage for libFuzzer in every library; the fuzz targets link the driver.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
