# Registers each doctest case of TEST_EXECUTABLE as a ctest test, labelled with its suite
# (ctest -L sharding), from one run of the executable: doctest's own discovery with ADD_LABELS
# runs it once more per test case to ask for the suite, 2.5 minutes of every rebuild at 200
# cases. Run after each link (tests/CMakeLists.txt):
#   cmake -D TEST_EXECUTABLE=... -D TEST_WORKING_DIR=... -D CTEST_FILE=... -P discover_tests.cmake
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND "${TEST_EXECUTABLE}" --reporters=xml --list-test-cases
                OUTPUT_VARIABLE listing RESULT_VARIABLE result WORKING_DIRECTORY "${TEST_WORKING_DIR}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --list-test-cases failed (${result}):\n${listing}")
endif()

# Attribute values as written in the source. The entities go before the listing is split into
# lines (a CMake list): their semicolons would split it too. A quote stays a placeholder until
# the attribute is cut out, as it ends one.
string(REPLACE "&lt;" "<" listing "${listing}")
string(REPLACE "&gt;" ">" listing "${listing}")
string(REPLACE "&apos;" "'" listing "${listing}")
string(REPLACE "&quot;" "@quote@" listing "${listing}")
string(REPLACE "&amp;" "&" listing "${listing}")

set(script "")
set(count 0)
string(REGEX MATCHALL "<TestCase [^\n]*/>" cases "${listing}")
foreach(entry IN LISTS cases)
  if(NOT entry MATCHES " name=\"([^\"]*)\"")
    message(FATAL_ERROR "unexpected doctest listing line: ${entry}")
  endif()
  string(REPLACE "@quote@" "\"" name "${CMAKE_MATCH_1}")
  set(suite "")  # a case outside any TEST_SUITE has no label
  if(entry MATCHES " testsuite=\"([^\"]*)\"")
    string(REPLACE "@quote@" "\"" suite "${CMAKE_MATCH_1}")
  endif()
  # --test-case takes a comma-separated list of patterns: a comma inside a name is escaped.
  string(REPLACE "," "\\," filter "${name}")
  set(labels "")
  if(suite)
    set(labels " LABELS [==[${suite}]==]")
  endif()
  string(APPEND script "add_test([==[${name}]==] \"${TEST_EXECUTABLE}\" [==[--test-case=${filter}]==])\n"
                       "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY \"${TEST_WORKING_DIR}\""
                       "${labels})\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} lists no test cases")
endif()
file(WRITE "${CTEST_FILE}" "${script}")
