/*
 * avx512emu.c -- the avx512emu family's SIMD kernels: the width-generic bodies of
 * kernels/vec over the vocabulary of simd_avx512emu.h -- the AVX-512 widths over pairs of AVX2 registers (tests only): the same bodies, bit for bit the same arithmetic as avx512.c.
 * Exports pa_{gemm,tilesm}_{f32,f64}_avx512emu (kernels/kernels.h).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512emu.h"

#define PA_SIMD emu
#define PA_ISA avx512emu
#define PA_VFN __attribute__((target("avx2,fma")))
#define PA_MR 12
#define PA_WITH_SOFTMAX 0
#include "kernels/vec/family_vec.inc"
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
