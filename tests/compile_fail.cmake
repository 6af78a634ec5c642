# One compile-fail program: building TARGET must fail with exactly one `error:` line, and that
# line must match EXPECT (the program's "// expect: " comment). A wrong policy is a sentence,
# not pages of template backtrace.
# Run: cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=... -P tests/compile_fail.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled; it must not")
endif()
# A CMake list splits at ';', which compiler messages contain: count on a copy without them.
string(REPLACE ";" "," out "${out}")
string(REGEX MATCHALL "[^\n]*error:[^\n]*" errors "${out}")
list(LENGTH errors count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "${TARGET}: ${count} error lines, expected exactly 1:\n${out}")
endif()
if(NOT errors MATCHES "${EXPECT}")
  message(FATAL_ERROR "${TARGET}: the error does not say \"${EXPECT}\":\n${errors}")
endif()
message(STATUS "${TARGET}: ${errors}")
