/*
 * family.c -- the x86-64 families: which kernels, tiles and names each one
 * has. Blocking: KC = PA_GEMM_KC for all (the contract); MC and NC from the
 * L1/L2 of the CPUs each targets (AVX-512: sized for Xeons and Zen 4/5).
 * The flash query block is the smallest multiple of lcm(MR, NR) >= 48.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
const pa_family pa_family_avx2 = {
    .name = "avx2", .isa = PA_ISA_AVX2,
    .gemm = {{pa_gemm_f32_avx2, 6, 16, PA_GEMM_KC, 96, 2048, "pyattn_gemm_f32_avx2_6x16"},
             {pa_gemm_f64_avx2, 6, 8, PA_GEMM_KC, 72, 1024, "pyattn_gemm_f64_avx2_6x8"}},
    .gemm_bf16 = {pa_gemm_bf16_ref, 4, 16, PA_GEMM_KC_BF16, 64, 2048, "pyattn_gemm_bf16_emul_4x16"},
    .tilesm = {{pa_tilesm_f32_avx2, "pyattn_tilesm_f32_avx2"}, {pa_tilesm_f64_avx2, "pyattn_tilesm_f64_avx2"}},
    .tilep = {{pa_tilep_f32_avx2, "pyattn_tilep_f32_avx2"}, {pa_tilep_f64_avx2, "pyattn_tilep_f64_avx2"}},
    .tileds = {{pa_tileds_f32_avx2, "pyattn_tileds_f32_avx2"}, {pa_tileds_f64_avx2, "pyattn_tileds_f64_avx2"}},
    .softmax = {{pa_softmax_f32_avx2, "pyattn_softmax_f32_avx2"}, {pa_softmax_f64_avx2, "pyattn_softmax_f64_avx2"}},
    .decode = {{{pa_rowdot_f32_avx2, pa_rowdot_f16_f32_avx2, pa_rowdot_bf16_f32_avx2}, pa_rowsm_f32_avx2,
                 {pa_rowpv_f32_avx2, pa_rowpv_f16_f32_avx2, pa_rowpv_bf16_f32_avx2}, "pyattn_decode_f32_avx2"},
               {{pa_rowdot_f64_avx2, NULL, NULL}, pa_rowsm_f64_avx2, {pa_rowpv_f64_avx2, NULL, NULL}, "pyattn_decode_f64_avx2"}},
    .softcap = {{pa_softcap_f32_avx2, "pyattn_softcap_f32_avx2"}, {pa_softcap_f64_avx2, "pyattn_softcap_f64_avx2"}},
    .attn_bq = {48, 48},
    .attn_name = {"pyattn_attn_f32_flash_48x60", "pyattn_attn_f64_flash_48x60"},
    .widen = {{pa_widen_f16_f32_avx2, "pyattn_widen_f16_avx2"}, {pa_widen_bf16_f32_avx2, "pyattn_widen_bf16_avx2"}},
    .fma_probe = pa_fma_probe_avx2, .fma_lanes = 8, .read_probe = pa_read_probe_avx2,
};

/* the avx512 family's fields; its two variants differ in their bfloat16 products */
#define PA_AVX512_FIELDS \
    .name = "avx512", .isa = PA_ISA_AVX512, \
    .gemm = {{pa_gemm_f32_avx512, 12, 32, PA_GEMM_KC, 96, 2048, "pyattn_gemm_f32_avx512_12x32"}, \
             {pa_gemm_f64_avx512, 12, 16, PA_GEMM_KC, 96, 1024, "pyattn_gemm_f64_avx512_12x16"}}, \
    .tilesm = {{pa_tilesm_f32_avx512, "pyattn_tilesm_f32_avx512"}, {pa_tilesm_f64_avx512, "pyattn_tilesm_f64_avx512"}}, \
    .tilep = {{pa_tilep_f32_avx512, "pyattn_tilep_f32_avx512"}, {pa_tilep_f64_avx512, "pyattn_tilep_f64_avx512"}}, \
    .tileds = {{pa_tileds_f32_avx512, "pyattn_tileds_f32_avx512"}, {pa_tileds_f64_avx512, "pyattn_tileds_f64_avx512"}}, \
    .softmax = {{pa_softmax_f32_avx512, "pyattn_softmax_f32_avx512"}, {pa_softmax_f64_avx512, "pyattn_softmax_f64_avx512"}}, \
    .decode = {{{pa_rowdot_f32_avx512, pa_rowdot_f16_f32_avx512, pa_rowdot_bf16_f32_avx512}, pa_rowsm_f32_avx512, \
                 {pa_rowpv_f32_avx512, pa_rowpv_f16_f32_avx512, pa_rowpv_bf16_f32_avx512}, "pyattn_decode_f32_avx512"}, \
               {{pa_rowdot_f64_avx512, NULL, NULL}, pa_rowsm_f64_avx512, {pa_rowpv_f64_avx512, NULL, NULL}, "pyattn_decode_f64_avx512"}}, \
    .softcap = {{pa_softcap_f32_avx512, "pyattn_softcap_f32_avx512"}, {pa_softcap_f64_avx512, "pyattn_softcap_f64_avx512"}}, \
    .attn_bq = {96, 48}, \
    .attn_name = {"pyattn_attn_f32_flash_96x60", "pyattn_attn_f64_flash_48x60"}, \
    .widen = {{pa_widen_f16_f32_avx512, "pyattn_widen_f16_avx512"}, {pa_widen_bf16_f32_avx512, "pyattn_widen_bf16_avx512"}}, \
    .fma_probe = pa_fma_probe_avx512, .fma_lanes = 16, .read_probe = pa_read_probe_avx512,

const pa_family pa_family_avx512 = {
    PA_AVX512_FIELDS
    .gemm_bf16 = {pa_gemm_bf16_ref, 4, 16, PA_GEMM_KC_BF16, 64, 2048, "pyattn_gemm_bf16_emul_4x16"},
};

/* where the CPU has AVX512_BF16 (dispatch.c): vdpbf16ps, the same bits */
const pa_family pa_family_avx512bf16 = {
    PA_AVX512_FIELDS
    .gemm_bf16 = {pa_gemm_bf16_avx512bf16, 12, 32, PA_GEMM_KC_BF16, 96, 2048, "pyattn_gemm_bf16_avx512bf16_12x32"},
    .bf16_probe = pa_bf16_probe_avx512bf16,
};
#undef PA_AVX512_FIELDS

/* the avx512 family, bit for bit, on AVX2 hardware (tests) */
const pa_family pa_family_avx512emu = {
    .name = "avx512emu", .isa = PA_ISA_AVX512_EMU,
    .gemm = {{pa_gemm_f32_avx512emu, 12, 32, PA_GEMM_KC, 96, 2048, "pyattn_gemm_f32_avx512emu_12x32"},
             {pa_gemm_f64_avx512emu, 12, 16, PA_GEMM_KC, 96, 1024, "pyattn_gemm_f64_avx512emu_12x16"}},
    .gemm_bf16 = {pa_gemm_bf16_ref, 4, 16, PA_GEMM_KC_BF16, 64, 2048, "pyattn_gemm_bf16_emul_4x16"},
    .tilesm = {{pa_tilesm_f32_avx512emu, "pyattn_tilesm_f32_avx512emu"},
               {pa_tilesm_f64_avx512emu, "pyattn_tilesm_f64_avx512emu"}},
    .tilep = {{pa_tilep_f32_avx512emu, "pyattn_tilep_f32_avx512emu"}, {pa_tilep_f64_avx512emu, "pyattn_tilep_f64_avx512emu"}},
    .tileds = {{pa_tileds_f32_avx512emu, "pyattn_tileds_f32_avx512emu"}, {pa_tileds_f64_avx512emu, "pyattn_tileds_f64_avx512emu"}},
    .softmax = {{pa_softmax_f32_avx512emu, "pyattn_softmax_f32_avx512emu"}, {pa_softmax_f64_avx512emu, "pyattn_softmax_f64_avx512emu"}},
    .decode = {{{pa_rowdot_f32_avx512emu, pa_rowdot_f16_f32_avx512emu, pa_rowdot_bf16_f32_avx512emu}, pa_rowsm_f32_avx512emu,
                 {pa_rowpv_f32_avx512emu, pa_rowpv_f16_f32_avx512emu, pa_rowpv_bf16_f32_avx512emu}, "pyattn_decode_f32_avx512emu"},
               {{pa_rowdot_f64_avx512emu, NULL, NULL}, pa_rowsm_f64_avx512emu, {pa_rowpv_f64_avx512emu, NULL, NULL}, "pyattn_decode_f64_avx512emu"}},
    .softcap = {{pa_softcap_f32_avx512emu, "pyattn_softcap_f32_avx512emu"}, {pa_softcap_f64_avx512emu, "pyattn_softcap_f64_avx512emu"}},
    .attn_bq = {96, 48},
    .attn_name = {"pyattn_attn_f32_flash_96x60", "pyattn_attn_f64_flash_48x60"},
    .widen = {{pa_widen_f16_f32_avx512emu, "pyattn_widen_f16_avx512emu"}, {pa_widen_bf16_f32_avx512emu, "pyattn_widen_bf16_avx512emu"}},
    .fma_probe = pa_fma_probe_avx2, .fma_lanes = 8, .read_probe = pa_read_probe_avx512emu,
};
#endif
