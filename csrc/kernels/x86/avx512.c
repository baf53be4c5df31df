/*
 * avx512.c -- the avx512 family's SIMD kernels: the width-generic bodies of
 * kernels/vec over the vocabulary of simd_avx512.h -- AVX-512F: 16 floats / 8 doubles per vector; GEMM 12x32 / 12x16. The softmax rows are the AVX2 family's (their 32-byte pieces are narrower than a vector here).
 * Exports pa_{gemm,tilesm}_{f32,f64}_avx512 (kernels/kernels.h).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512.h"

#define PA_SIMD avx512
#define PA_ISA avx512
#define PA_VFN __attribute__((target("avx512f,fma")))
#define PA_MR 12
#define PA_WITH_SOFTMAX 0
#include "kernels/vec/family_vec.inc"
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
