/*
 * avx512.c -- the avx512 family (AVX-512F, 16 floats / 8 doubles per
 * vector): the width-generic bodies of kernels/vec over simd_avx512.h, which
 * define every kernel kind of PA_KERNEL_KINDS (registry.h) as
 * pa_<kind>_<sfx>_avx512 -- GEMM 12x32 / 12x16, the tile steps, softmax
 * rows (two 32-byte pieces per vector), the softcap, the decode rows,
 * widening, the read probe -- plus the FMA peak probe pa_fma_probe_avx512;
 * and the family's two tables: pa_family_avx512, and pa_family_avx512bf16
 * with AVX512_BF16's bfloat16 products (avx512bf16.c) where the CPU has them
 * (dispatch.c). Blocking: KC = PA_GEMM_KC (the contract); MC and NC sized
 * for Xeons and Zen 4/5. The flash query block is the smallest multiple of
 * lcm(MR, NR) >= 48 (96 for float32).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD avx512
#define PA_ISA avx512
#define PA_VFN __attribute__((target("avx512f,fma")))
#define PA_MR 12
#define PA_GEMM_CPF 64        /* C's tile fetched 64 k steps before the end (gemm_vec.inc) */
#define PA_WITH_SOFTMAX 2
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_GEMM_CPF
#undef PA_WITH_SOFTMAX

#define PA_TILE_gemm_f32 12, 32, PA_GEMM_KC, 96, 2048
#define PA_TILE_gemm_f64 12, 16, PA_GEMM_KC, 96, 1024
/* the four avx512 tables (dispatch.c picks by AVX512_BF16, AVX512_VNNI):
 * the same kernels but bfloat16 products on vdpbf16ps and int8 query
 * products on vpdpbusd, each the same bits as the portable twins */
#define PA_AVX512_TABLE(bf16gemm)                                                           \
    PA_FAMILY_KERNELS(avx512),                                                            \
    .gemm_bf16 = {PA_NAMED(bf16gemm), 12, 32, PA_GEMM_KC_BF16, 96, 2048},                 \
    .attn_bq = {96, 48},                                                                  \
    .fma_probe = pa_fma_probe_avx512, .fma_lanes = 16,                                    \
    .bf16_pack_p = pa_bf16_pack_p_avx512,                                                 \
    .bf16_narrow = pa_bf16_narrow_avx512
const pa_family pa_family_avx512 = {
    PA_AVX512_TABLE(pa_gemm_bf16_avx512),
};

/* where the CPU has AVX512_BF16 (dispatch.c): vdpbf16ps, the same bits */
const pa_family pa_family_avx512bf16 = {
    PA_AVX512_TABLE(pa_gemm_bf16_avx512bf16),
    .bf16_probe = pa_bf16_probe_avx512bf16,
};

/* where the CPU has AVX512_VNNI (dispatch.c): q8rowdot on vpdpbusd, the
 * same bits (kernels/x86/q8dot_vnni.c); the one field the family's own
 * kernel is overridden in */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
#endif
const pa_family pa_family_avx512vnni = {
    PA_AVX512_TABLE(pa_gemm_bf16_avx512),
    .q8rowdot = {PA_NAMED(pa_q8rowdot_avx512vnni)},
};
const pa_family pa_family_avx512bf16vnni = {
    PA_AVX512_TABLE(pa_gemm_bf16_avx512bf16),
    .bf16_probe = pa_bf16_probe_avx512bf16,
    .q8rowdot = {PA_NAMED(pa_q8rowdot_avx512vnni)},
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64
#endif
