/*
 * neon.c -- the neon family's SIMD kernels (aarch64): the width-generic
 * bodies of kernels/vec over the vocabulary of simd_neon.h -- 4 floats /
 * 2 doubles per vector; GEMM 12x8 / 12x4 (24 of the 32 vector registers
 * hold the tile), the tile step, softmax rows in 32-byte pieces (2 vectors)
 * and the peak probe. Exports pa_{gemm,tilesm,softmax}_{f32,f64}_neon and
 * pa_fma_probe_neon (kernels/kernels.h).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_NEON_KERNELS
#include "simd_neon.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD neon
#define PA_ISA neon
#define PA_VFN
#define PA_MR 12
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
