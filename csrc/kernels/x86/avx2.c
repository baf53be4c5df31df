/*
 * avx2.c -- the avx2 family's SIMD kernels (AVX2+FMA, 8 floats / 4 doubles
 * per vector): the width-generic bodies of kernels/vec over simd_avx2.h --
 * GEMM 6x16 / 6x8, the tile step, softmax rows, the peak probe. Exports
 * pa_{gemm,tilesm,softmax}_{f32,f64}_avx2 and pa_fma_probe_avx2.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx2.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD avx2
#define PA_ISA avx2
#define PA_VFN __attribute__((target("avx2,fma,f16c")))
#define PA_MR 6
#define PA_WITH_SOFTMAX 1
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
