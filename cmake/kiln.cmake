# kiln.cmake: CMake functions for projects that use kiln (and for kiln itself).
#
#   kiln_add_recipe_executable(<target> RECIPES a.toml [b.toml ...])
#       A kiln CLI (run/check/list/doctor) that contains exactly the policy combinations the
#       recipes ask for. The catalog is generated from the recipes at build time.
#
#   kiln_use_precompiled_torch(<target>)
#       Reuse one precompiled <torch/torch.h> (the largest part of every kiln compile).

function(_kiln_ensure_catalog_generator)
  if(TARGET kiln_catalog_gen)
    return()
  endif()
  # Built from source in whichever project uses kiln: it needs only toml++ and kinds.hpp.
  # CMAKE_CURRENT_FUNCTION_LIST_DIR: this file's folder, whichever project calls the function.
  set(_here "${CMAKE_CURRENT_FUNCTION_LIST_DIR}")
  if(EXISTS "${_here}/../tools/kiln/catalog_gen.cpp")
    set(_src "${_here}/../tools/kiln/catalog_gen.cpp")
  else()
    set(_src "${_here}/catalog_gen.cpp")  # installed layout
  endif()
  add_executable(kiln_catalog_gen "${_src}")
  target_compile_features(kiln_catalog_gen PRIVATE cxx_std_20)
  target_link_libraries(kiln_catalog_gen PRIVATE tomlplusplus::tomlplusplus)
  get_target_property(_inc kiln::kiln INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(kiln_catalog_gen PRIVATE ${_inc})
endfunction()

function(kiln_use_precompiled_torch target)
  if(NOT TARGET kiln_pch)
    file(WRITE "${CMAKE_BINARY_DIR}/kiln_pch.cpp" "// translation unit that carries kiln's precompiled header\n")
    add_library(kiln_pch OBJECT "${CMAKE_BINARY_DIR}/kiln_pch.cpp")
    target_link_libraries(kiln_pch PUBLIC kiln::kiln)
    target_precompile_headers(kiln_pch PRIVATE <kiln/detail/torch.hpp> <toml++/toml.h>)
  endif()
  target_precompile_headers(${target} REUSE_FROM kiln_pch)
  # GCC does not carry kiln/detail/torch.hpp's diagnostic pragma through a precompiled header, so
  # the targets that share it silence GCC 13+'s false -Wstringop-overflow in LibTorch's
  # custom_function.h by flag instead (that header says more).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    target_compile_options(${target} PRIVATE -Wno-stringop-overflow)
  endif()
endfunction()

function(kiln_add_recipe_executable target)
  cmake_parse_arguments(ARG "" "" "RECIPES" ${ARGN})
  if(NOT ARG_RECIPES)
    message(FATAL_ERROR "kiln_add_recipe_executable(${target}): give at least one recipe: RECIPES a.toml ...")
  endif()
  _kiln_ensure_catalog_generator()
  set(_recipes "")
  foreach(_r IN LISTS ARG_RECIPES)
    get_filename_component(_abs "${_r}" ABSOLUTE)
    list(APPEND _recipes "${_abs}")
  endforeach()
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/${target}_catalog.cpp")
  add_custom_command(
    OUTPUT "${_out}"
    COMMAND kiln_catalog_gen "${_out}" ${_recipes}
    DEPENDS kiln_catalog_gen ${_recipes}
    COMMENT "kiln: policy catalog of ${target} from its recipes"
    VERBATIM)
  add_executable(${target} "${_out}")
  target_link_libraries(${target} PRIVATE kiln::kiln)
  kiln_use_precompiled_torch(${target})
endfunction()
