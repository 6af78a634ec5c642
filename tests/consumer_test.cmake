# Configures, builds and runs examples/consumer as a separate CMake project, the way a user
# would: MODE=subdirectory uses add_subdirectory(kiln) and runs the program, MODE=installed uses
# find_package(kiln) from a `cmake --install` of this build tree and checks its recipe CLI too.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message("${out}")
  set(output "${out}" PARENT_SCOPE)
endfunction()

# Runs a command that must fail with `expected` in its output.
function(refused expected)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(FIND "${out}" "${expected}" at)
  if(rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "expected a failure saying '${expected}' (exit ${rc}): ${ARGN}\n${out}")
  endif()
  message("refused as expected: ${expected}")
endfunction()

function(expect_in text expected)
  string(FIND "${text}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${expected}' in:\n${text}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(args -S ${KILN_SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release)
find_program(CCACHE ccache)
if(CCACHE)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
if(MODE STREQUAL "subdirectory")
  list(APPEND args -DKILN_SOURCE_DIR=${KILN_SOURCE_DIR})
else()
  run(${CMAKE_COMMAND} --install ${KILN_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
endif()
run(${CMAKE_COMMAND} ${args})
if(MODE STREQUAL "subdirectory")
  # Through add_subdirectory only the program is built and run: the recipe CLI below is the same
  # code either way (kiln's own kiln_cli is built through the same in-tree kiln.cmake), and its
  # catalog is the longest compile of the suite, so the installed mode alone builds and checks it.
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --target consumer)
  run(${WORK_DIR}/build/consumer)
  return()
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)

# The project's own optimizer, model, dataset and loss, named in its recipe (my_kinds.hpp registers them).
set(cli ${WORK_DIR}/build/consumer_cli)
set(recipe ${KILN_SOURCE_DIR}/examples/consumer/consumer.toml)
run(${cli} check ${recipe} --set optimizer.alpha=0.9 --set data.arms=4)
expect_in("${output}" "kind = \"rmsprop\"")
expect_in("${output}" "alpha = 0.9 ")
expect_in("${output}" "arms = 4 ")
expect_in("${output}" "blocks = 2 ")
expect_in("${output}" "smoothing = 0.05 ")
run(${cli} list)
expect_in("${output}" "[optimizer] rmsprop")
expect_in("${output}" "consumer::spirals")
refused("did you mean \"residual-mlp\"" ${cli} check ${recipe} --set model.kind=residual-mpl)
refused("did you mean \"rmsprop\"" ${cli} check ${recipe} --set optimizer.kind=rmsprp)
refused("unknown key data.armz (did you mean \"arms\"" ${cli} check ${recipe} --set data.armz=4)
refused("optimizer.alpha = 1.5: expected a value in [0, 1)" ${cli} check ${recipe} --set optimizer.alpha=1.5)
refused("did you mean \"label-smoothing\"" ${cli} check ${recipe} --set loss.kind=label-smooting)

# It trains: RMSprop on three spiral arms, and the sgd alternative compiled beside it.
set(run_dir ${WORK_DIR}/run)
run(${cli} run ${recipe} --no-progress --set run.dir=${run_dir})
expect_in("${output}" "loss label-smoothing")
string(REGEX MATCH "eval loss [0-9.]+, accuracy ([0-9.]+)%" _ "${output}")
if(NOT CMAKE_MATCH_1 GREATER_EQUAL 80)
  message(FATAL_ERROR "consumer recipe: accuracy ${CMAKE_MATCH_1}% on spirals, expected at least 80%")
endif()
run(${cli} check ${recipe} --set optimizer.kind=sgd)

# An unfinished run of the same recipe resumes, RMSprop's running means included; another
# width of the project's model is another recipe, which the run directory refuses.
file(REMOVE ${run_dir}/summary.json)
run(${cli} run ${recipe} --no-progress --set run.dir=${run_dir} --set train.steps=400)
expect_in("${output}" "resuming ${run_dir} at step 300")
file(REMOVE ${run_dir}/summary.json)
refused("a different recipe (saved: \"width = 64" ${cli} run ${recipe} --no-progress --set run.dir=${run_dir} --set model.width=32)
