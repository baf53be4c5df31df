/*
 * avx2.c -- the avx2 family's SIMD kernels: the width-generic bodies of
 * kernels/vec over the vocabulary of simd_avx2.h -- AVX2+FMA: 8 floats / 4 doubles per vector; GEMM 6x16 / 6x8.
 * Exports pa_{gemm,tilesm,softmax}_{f32,f64}_avx2 (kernels/kernels.h).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx2.h"

#define PA_SIMD avx2
#define PA_ISA avx2
#define PA_VFN __attribute__((target("avx2,fma")))
#define PA_MR 6
#define PA_WITH_SOFTMAX 1
#include "kernels/vec/family_vec.inc"
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
