// kiln/detail/kernels.hpp: where kiln's CPU kernels are compiled.
//
// The ops with kernels of their own (kiln::models::cross_entropy, apply_dropout, gelu and
// apply_layer_norm) and the built-in optimizers' update (adamw, lion, adam8bit, adafactor: their
// fused loops are most of the code a trainer instantiates) declare an entry point in their header
// and define it below it, behind KILN_KERNEL_DEFINITIONS. sgd's stays inline: its header is the
// one a user copies to write an optimizer. Two ways to build:
//  - header-only (nothing defined): the entry points are inline, and every translation unit
//    that calls one compiles the kernels behind it, about 12 s of compile per such unit on a
//    2-core AMD EPYC (bench/run_compile_time);
//  - KILN_SEPARATE_KERNELS defined: the headers only declare the entry points, and one
//    translation unit, src/kernels.cpp, compiles them. The CMake target kiln::kiln does this: it
//    links kiln::kernels, a static library of that file, built with the same LibTorch.
#pragma once

#if defined(KILN_SEPARATE_KERNELS) && !defined(KILN_COMPILING_KERNELS)
#define KILN_KERNEL_DEFINITIONS 0
#else
#define KILN_KERNEL_DEFINITIONS 1
#endif

#ifdef KILN_SEPARATE_KERNELS
#define KILN_KERNEL_ENTRY
#else
#define KILN_KERNEL_ENTRY inline
#endif
