/*
 * neon.c -- the neon family (aarch64): the width-generic bodies of
 * kernels/vec over the vocabulary of simd_neon.h -- 4 floats / 2 doubles
 * per vector -- which define every kernel kind of PA_KERNEL_KINDS
 * (registry.h) as pa_<kind>_<sfx>_neon: GEMM 12x8 / 12x4 (24 of the 32
 * vector registers hold the tile), the tile steps, softmax rows in 32-byte
 * pieces (2 vectors), the softcap, the decode rows, widening, the read
 * probe; plus the FMA peak probe pa_fma_probe_neon and the family's table,
 * pa_family_neon, whose bfloat16 products are bf16emu_neon.c's (6 x 16).
 * Blocking: KC = PA_GEMM_KC (the contract); MC 96 / NC 2048
 * sized for 64 KiB L1d and >= 1 MiB L2 (Apple M-series, Neoverse N1/V1/V2),
 * not tuned on one: none was at hand.
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

#define PA_TILE_gemm_f32 12, 8, PA_GEMM_KC, 96, 2048
#define PA_TILE_gemm_f64 12, 4, PA_GEMM_KC, 96, 1024
const pa_family pa_family_neon = {
    PA_FAMILY_KERNELS(neon),
    .gemm_bf16 = {PA_NAMED(pa_gemm_bf16_neon), 6, 16, PA_GEMM_KC_BF16, 96, 2048},
    .attn_bq = {48, 48},
    .fma_probe = pa_fma_probe_neon, .fma_lanes = 4,
    .bf16_narrow = pa_bf16_narrow_ref,
};
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64
#endif
