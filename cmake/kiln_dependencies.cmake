# kiln_dependencies.cmake: finds what kiln's headers need and bundles it in one INTERFACE
# target, kiln::dependencies. Used by kiln's own build and by find_package(kiln).
#
# LibTorch: Debian's libtorch-dev (find_package(Torch)), or a PyTorch install found through
# CMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)').
if(TARGET kiln::dependencies)
  return()
endif()

find_package(Torch REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(ZLIB REQUIRED)

# Imported targets are visible only in the directory that found them. kiln is often added with
# add_subdirectory(), and LibTorch's targets refer to each other by name (also in generator
# expressions), so make every target these packages imported global.
get_directory_property(_kiln_imported IMPORTED_TARGETS)
foreach(_target IN LISTS _kiln_imported)
  get_target_property(_global ${_target} IMPORTED_GLOBAL)
  if(NOT _global)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()

add_library(kiln_dependencies INTERFACE IMPORTED GLOBAL)
add_library(kiln::dependencies ALIAS kiln_dependencies)
target_link_libraries(kiln_dependencies INTERFACE ${TORCH_LIBRARIES} tomlplusplus::tomlplusplus ZLIB::ZLIB
                                                  ${CMAKE_DL_LIBS})
# TorchConfig.cmake gives its flags as one string (1.13: -D_GLIBCXX_USE_CXX11_ABI=1; recent
# wheels give none, their ABI being the compiler's default).
separate_arguments(_kiln_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(kiln_dependencies INTERFACE ${_kiln_torch_flags})
# A PyTorch wheel's CUDA libraries (NCCL, cuDNN, cuBLAS, ...) are other wheels under
# site-packages/nvidia, which libtorch_cuda finds at run time through its own RPATH ($ORIGIN/../../
# nvidia/*/lib). The linker does not follow that $ORIGIN, and would take a CUDA toolkit's older
# libnccl from the system (missing symbols 2.x's libtorch_cuda needs): point it at the wheels'.
file(GLOB _kiln_wheel_cuda_libs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
if(_kiln_wheel_cuda_libs)
  list(JOIN _kiln_wheel_cuda_libs ":" _kiln_wheel_cuda_libs)
  target_link_options(kiln_dependencies INTERFACE "LINKER:-rpath-link,${_kiln_wheel_cuda_libs}")
endif()
# c10d's process groups, each compiled into kiln only where its headers are found: KILN_GLOO and
# KILN_NCCL are kiln's own switches (kiln/detail/process_group.hpp). LibTorch's headers also
# hide each group behind USE_C10D_GLOO / USE_C10D_NCCL, which Debian's TorchConfig.cmake does not
# always define (FIELD-NOTES) and a PyTorch wheel may define without shipping the headers they
# need, so these macros alone cannot tell.
# Gloo's headers must be those LibTorch was built with, so they are looked for beside LibTorch's
# own (Debian's libgloo-dev puts them in /usr/include, as its LibTorch's; a PyTorch wheel ships
# none), not wherever else the system has a Gloo.
# A PyTorch wheel has Gloo in libtorch_cpu but no headers: -DKILN_GLOO_INCLUDE=DIR names other
# ones (./kiln --torch pypi passes Debian's, /usr/include; docs/libtorch.md says how that is tested).
find_path(KILN_GLOO_INCLUDE gloo/config.h HINTS "${TORCH_INSTALL_PREFIX}/include" NO_DEFAULT_PATH)
if(KILN_GLOO_INCLUDE)
  target_compile_definitions(kiln_dependencies INTERFACE USE_C10D_GLOO KILN_GLOO)
  if(NOT KILN_GLOO_INCLUDE STREQUAL "/usr/include")  # the compiler's own: -isystem would reorder it
    target_include_directories(kiln_dependencies SYSTEM INTERFACE ${KILN_GLOO_INCLUDE})
  endif()
endif()
# NCCL: a CUDA LibTorch built with it marks torch_cuda with USE_C10D_NCCL; its header includes
# nccl.h, which the wheel's nvidia-nccl package keeps next to torch/. -DKILN_WITH_NCCL=OFF leaves
# it out (kiln/detail/process_group.hpp says how tested it is).
option(KILN_WITH_NCCL "use NCCL for [sharding] backend = auto/nccl where LibTorch has it and nccl.h is found" ON)
if(KILN_WITH_NCCL AND TARGET torch_cuda)
  get_target_property(_kiln_torch_cuda_definitions torch_cuda INTERFACE_COMPILE_DEFINITIONS)
  if("USE_C10D_NCCL" IN_LIST _kiln_torch_cuda_definitions)
    # The header must match the NCCL LibTorch was built with (c10d's NCCL options embed its
    # ncclConfig_t): NCCL_INCLUDE_DIR, then the wheel's nvidia-nccl package, before any other.
    find_path(KILN_NCCL_INCLUDE nccl.h HINTS ENV NCCL_INCLUDE_DIR "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include"
              NO_DEFAULT_PATH)
    if(NOT KILN_NCCL_INCLUDE)
      find_path(KILN_NCCL_INCLUDE nccl.h)
      if(KILN_NCCL_INCLUDE)
        message(STATUS "kiln: using ${KILN_NCCL_INCLUDE}/nccl.h: it must be the NCCL version LibTorch was built with")
      endif()
    endif()
    if(KILN_NCCL_INCLUDE)
      target_compile_definitions(kiln_dependencies INTERFACE USE_C10D_NCCL KILN_NCCL)
      target_include_directories(kiln_dependencies INTERFACE ${KILN_NCCL_INCLUDE})
    else()
      message(WARNING "kiln: LibTorch has NCCL but nccl.h was not found (set NCCL_INCLUDE_DIR); "
                      "distributed recipes will use Gloo")
    endif()
  endif()
endif()
# at::parallel_for, which kiln's fused CPU loops (optimizers, dropout) split their work with, is an
# inline template: in a LibTorch built with OpenMP (Debian's is) it runs on LibTorch's threads
# only where the *including* file is compiled with OpenMP, and on one thread otherwise. So kiln's
# users compile with it, and link the OpenMP runtime LibTorch itself uses: a PyTorch wheel ships
# its own libgomp next to libtorch, and two copies in one process would keep two thread pools.
find_file(KILN_ATEN_CONFIG ATen/Config.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(KILN_ATEN_CONFIG)
  file(STRINGS "${KILN_ATEN_CONFIG}" _kiln_aten_openmp REGEX "#define AT_PARALLEL_OPENMP 1")
endif()
if(_kiln_aten_openmp)
  file(GLOB _kiln_bundled_gomp "${TORCH_INSTALL_PREFIX}/lib/libgomp*.so*")
  if(_kiln_bundled_gomp AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(GET _kiln_bundled_gomp 0 _kiln_bundled_gomp)
    target_compile_options(kiln_dependencies INTERFACE -fopenmp)
    target_link_libraries(kiln_dependencies INTERFACE "${_kiln_bundled_gomp}")
  else()
    find_package(OpenMP COMPONENTS CXX)
    if(OpenMP_CXX_FOUND)
      target_link_libraries(kiln_dependencies INTERFACE OpenMP::OpenMP_CXX)
    else()
      message(WARNING "kiln: LibTorch uses OpenMP but this compiler has none: kiln's fused loops run on one thread")
    endif()
  endif()
endif()
# kiln's fused optimizers (kiln/optim/detail/fused_loop.hpp) inline update rules over 8-float
# vectors into a copy of their loop compiled for AVX2; GCC notes, once per file, that passing such
# vectors to a function compiled without AVX changed ABI in GCC 4.6. No vector crosses a call.
target_compile_options(kiln_dependencies INTERFACE $<$<CXX_COMPILER_ID:GNU>:-Wno-psabi>)
