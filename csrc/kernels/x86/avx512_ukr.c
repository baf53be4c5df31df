/*
 * avx512_ukr.c -- the avx512 family's float32 GEMM micro-kernel in other
 * register shapes than its table's 12x32 (avx512.c), the same body
 * (kernels/vec/gemm_vec.inc) instantiated again: ukr_select.c chooses one per
 * CPU class and gives it to a copy of the family's table. Every shape sums
 * each C element's terms in the same order (one FMA per term, k in order), so
 * the bits do not depend on the shape.
 *   pa_gemm_f32_avx512_6x48    6 rows x 3 vectors, 18 accumulators (MR = 6
 *                              divides PA_FLASH_BK = 60, lcm(6, 48) = 48
 *                              divides attn_bq = 96: the attention can run it)
 * Measured on a Zen 5 and left out: 14x32 and 8x48 (MR does not divide 60,
 * so the attention could not share them; slower in matmul anyway), an A
 * prefetch and a k loop unrolled 2x / 4x (no faster); csrc/README.md, "The
 * AVX-512 micro-kernel", has the figures.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD avx512
#define PA_ISA avx512
#define PA_VFN __attribute__((target("avx512f,fma")))
#define PA_TEMPLATE "kernels/x86/avx512_ukr.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#endif
