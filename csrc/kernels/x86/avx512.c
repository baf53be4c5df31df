/*
 * avx512.c -- the avx512 family's SIMD kernels (AVX-512F, 16 floats /
 * 8 doubles per vector): the width-generic bodies of kernels/vec over
 * simd_avx512.h -- GEMM 12x32 / 12x16, the tile step, softmax rows (two
 * 32-byte pieces per vector), the peak probe. Exports
 * pa_{gemm,tilesm,softmax}_{f32,f64}_avx512 and pa_fma_probe_avx512.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD avx512
#define PA_ISA avx512
#define PA_VFN __attribute__((target("avx512f,fma")))
#define PA_MR 12
#define PA_WITH_SOFTMAX 2
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
