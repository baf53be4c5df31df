/*
 * family.c -- the aarch64 family. Blocking: KC = PA_GEMM_KC (the
 * contract); MC 96 / NC 2048 sized for 64 KiB L1d and >= 1 MiB L2 (Apple
 * M-series, Neoverse N1/V1/V2), not tuned on one: none was at hand.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_NEON_KERNELS
const pa_family pa_family_neon = {
    .name = "neon", .isa = PA_ISA_NEON,
    .gemm = {{pa_gemm_f32_neon, 12, 8, PA_GEMM_KC, 96, 2048, "pyattn_gemm_f32_neon_12x8"},
             {pa_gemm_f64_neon, 12, 4, PA_GEMM_KC, 96, 1024, "pyattn_gemm_f64_neon_12x4"}},
    .gemm_bf16 = {pa_gemm_bf16_ref, 4, 16, PA_GEMM_KC_BF16, 64, 2048, "pyattn_gemm_bf16_emul_4x16"},
    .tilesm = {{pa_tilesm_f32_neon, "pyattn_tilesm_f32_neon"}, {pa_tilesm_f64_neon, "pyattn_tilesm_f64_neon"}},
    .tilep = {{pa_tilep_f32_neon, "pyattn_tilep_f32_neon"}, {pa_tilep_f64_neon, "pyattn_tilep_f64_neon"}},
    .tileds = {{pa_tileds_f32_neon, "pyattn_tileds_f32_neon"}, {pa_tileds_f64_neon, "pyattn_tileds_f64_neon"}},
    .softmax = {{pa_softmax_f32_neon, "pyattn_softmax_f32_neon"}, {pa_softmax_f64_neon, "pyattn_softmax_f64_neon"}},
    .decode = {{{pa_rowdot_f32_neon, pa_rowdot_f16_f32_neon, pa_rowdot_bf16_f32_neon}, pa_rowsm_f32_neon,
                 {pa_rowpv_f32_neon, pa_rowpv_f16_f32_neon, pa_rowpv_bf16_f32_neon}, "pyattn_decode_f32_neon"},
               {{pa_rowdot_f64_neon, NULL, NULL}, pa_rowsm_f64_neon, {pa_rowpv_f64_neon, NULL, NULL}, "pyattn_decode_f64_neon"}},
    .softcap = {{pa_softcap_f32_neon, "pyattn_softcap_f32_neon"}, {pa_softcap_f64_neon, "pyattn_softcap_f64_neon"}},
    .attn_bq = {48, 48},
    .attn_name = {"pyattn_attn_f32_flash_48x60", "pyattn_attn_f64_flash_48x60"},
    .widen = {{pa_widen_f16_f32_neon, "pyattn_widen_f16_neon"}, {pa_widen_bf16_f32_neon, "pyattn_widen_bf16_neon"}},
    .fma_probe = pa_fma_probe_neon, .fma_lanes = 4, .read_probe = pa_read_probe_neon,
};
#endif
