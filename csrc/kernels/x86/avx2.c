/*
 * avx2.c -- the avx2 family (AVX2+FMA+F16C, 8 floats / 4 doubles per
 * vector): the width-generic bodies of kernels/vec over simd_avx2.h, which
 * define every kernel kind of PA_KERNEL_KINDS (registry.h) as
 * pa_<kind>_<sfx>_avx2 -- GEMM 6x16 / 6x8, the tile steps, softmax rows,
 * the softcap, the decode rows, widening, the read probe -- plus the FMA
 * peak probe pa_fma_probe_avx2; and the family's table, pa_family_avx2.
 * Blocking: KC = PA_GEMM_KC (the contract); MC and NC from the L1/L2 of the
 * CPUs it targets. The flash query block is the smallest multiple of
 * lcm(MR, NR) >= 48.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx2.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD avx2
#define PA_ISA avx2
#define PA_VFN __attribute__((target("avx2,fma,f16c")))
#define PA_MR 6
#define PA_GEMM_CPF 64        /* C's tile fetched 64 k steps before the end (gemm_vec.inc) */
#define PA_WITH_SOFTMAX 1
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_GEMM_CPF
#undef PA_WITH_SOFTMAX

#define PA_TILE_gemm_f32 6, 16, PA_GEMM_KC, 96, 2048
#define PA_TILE_gemm_f64 6, 8, PA_GEMM_KC, 72, 1024
const pa_family pa_family_avx2 = {
    PA_FAMILY_KERNELS(avx2),
    .gemm_bf16 = {PA_NAMED(pa_gemm_bf16_avx2), 6, 16, PA_GEMM_KC_BF16, 96, 2048},
    .attn_bq = {48, 48},
    .fma_probe = pa_fma_probe_avx2, .fma_lanes = 8,
    .bf16_pack_p = pa_bf16_pack_p_avx2,
    .bf16_narrow = pa_bf16_narrow_avx2,
};
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64
#endif
