/* family.c -- the generic family: the portable kernels of ref.c. */
#include "kernels/kernels.h"

const pa_family pa_family_generic = {
    .name = "generic", .isa = PA_ISA_GENERIC,
    .gemm = {{pa_gemm_f32_ref, 4, 16, PA_GEMM_KC, 64, 2048, "pyattn_gemm_f32_ref_4x16"},
             {pa_gemm_f64_ref, 4, 8, PA_GEMM_KC, 64, 1024, "pyattn_gemm_f64_ref_4x8"}},
    .gemm_bf16 = {pa_gemm_bf16_ref, 4, 16, PA_GEMM_KC_BF16, 64, 2048, "pyattn_gemm_bf16_emul_4x16"},
    .tilesm = {{pa_tilesm_f32_ref, "pyattn_tilesm_f32_ref"}, {pa_tilesm_f64_ref, "pyattn_tilesm_f64_ref"}},
    .tilep = {{pa_tilep_f32_ref, "pyattn_tilep_f32_ref"}, {pa_tilep_f64_ref, "pyattn_tilep_f64_ref"}},
    .tileds = {{pa_tileds_f32_ref, "pyattn_tileds_f32_ref"}, {pa_tileds_f64_ref, "pyattn_tileds_f64_ref"}},
    .softmax = {{pa_softmax_f32_ref, "pyattn_softmax_f32_ref"}, {pa_softmax_f64_ref, "pyattn_softmax_f64_ref"}},
    .decode = {{{pa_rowdot_f32_ref, pa_rowdot_f16_f32_ref, pa_rowdot_bf16_f32_ref}, pa_rowsm_f32_ref,
                 {pa_rowpv_f32_ref, pa_rowpv_f16_f32_ref, pa_rowpv_bf16_f32_ref}, "pyattn_decode_f32_ref"},
               {{pa_rowdot_f64_ref, NULL, NULL}, pa_rowsm_f64_ref, {pa_rowpv_f64_ref, NULL, NULL}, "pyattn_decode_f64_ref"}},
    .softcap = {{pa_softcap_f32_ref, "pyattn_softcap_f32_ref"}, {pa_softcap_f64_ref, "pyattn_softcap_f64_ref"}},
    .attn_bq = {48, 48},
    .attn_name = {"pyattn_attn_f32_flash_48x60", "pyattn_attn_f64_flash_48x60"},
    .widen = {{pa_widen_f16_f32_ref, "pyattn_widen_f16_ref"}, {pa_widen_bf16_f32_ref, "pyattn_widen_bf16_ref"}},
    .fma_probe = NULL, .fma_lanes = 0, .read_probe = pa_read_probe_ref,
};
