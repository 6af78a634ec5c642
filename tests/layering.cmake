# The headers' one-way dependencies (README, "How we work"), checked on every test run:
#   settings/ (description, validation, spelling help) at the bottom: only settings/ and errors.hpp;
#   policies, models, data, accelerator and trainer: nothing from recipe/;
#   recipe/ and recipes.hpp: anything in the library;
#   no library header includes the application (app/kiln/app/: the CLI, launcher and doctor);
#   kiln/kiln.hpp, the library's include, reaches neither recipe/ nor toml++, through any header.
# Run: cmake -DKILN_INCLUDE=<repo>/include/kiln -P tests/layering.cmake
cmake_minimum_required(VERSION 3.22)  # IN_LIST, POP_FRONT
file(GLOB_RECURSE headers RELATIVE ${KILN_INCLUDE} ${KILN_INCLUDE}/*.hpp)
set(broken "")
foreach(header IN LISTS headers)
  file(STRINGS ${KILN_INCLUDE}/${header} includes REGEX "^#include [\"<]kiln/")
  set(kiln_includes_of_${header} "")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include [\"<]kiln/([^\">]+)[\">].*" "\\1" target "${line}")
    list(APPEND kiln_includes_of_${header} ${target})
    set(why "")
    if(target MATCHES "^app/")
      set(why "the library never includes the application (app/)")
    elseif(header MATCHES "^settings/")
      if(NOT target MATCHES "^settings/" AND NOT target STREQUAL "errors.hpp")
        set(why "settings/ is the bottom layer: it may include settings/ and errors.hpp only")
      endif()
    elseif(target MATCHES "^recipe/" AND NOT header MATCHES "^recipe/" AND NOT header STREQUAL "recipes.hpp")
      set(why "recipes sit above policies, models, data, accelerator and trainer")
    elseif(target STREQUAL "recipes.hpp")
      set(why "recipes.hpp is the top of the library: nothing in it includes it")
    endif()
    if(why)
      string(APPEND broken "  include/kiln/${header} includes kiln/${target}: ${why}\n")
    endif()
  endforeach()
endforeach()

# Everything kiln.hpp reaches, header by header: none of it may be recipe/ or include toml++.
set(reached "")
set(frontier kiln.hpp)
while(frontier)
  list(POP_FRONT frontier header)
  if(header IN_LIST reached OR NOT EXISTS ${KILN_INCLUDE}/${header})
    continue()
  endif()
  list(APPEND reached ${header})
  list(APPEND frontier ${kiln_includes_of_${header}})
  if(header MATCHES "^recipe/")
    string(APPEND broken "  include/kiln/kiln.hpp reaches kiln/${header}: the library's include stops below the recipes\n")
  endif()
  file(STRINGS ${KILN_INCLUDE}/${header} toml REGEX "^#include [\"<]toml\\+\\+/")
  if(toml)
    string(APPEND broken "  include/kiln/kiln.hpp reaches kiln/${header}, which includes toml++: only recipes read TOML\n")
  endif()
endwhile()

if(broken)
  message(FATAL_ERROR "kiln: headers that include upwards:\n${broken}")
endif()
list(LENGTH headers count)
list(LENGTH reached reached_count)
message(STATUS "kiln: ${count} headers, every include points downwards; kiln.hpp reaches ${reached_count} of them, "
               "none from recipe/ and none with toml++")
