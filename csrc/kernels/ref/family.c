/* family.c -- the generic family: the portable kernels of ref.c (every
 * kernel kind of PA_KERNEL_KINDS as pa_<kind>_<sfx>_ref), no FMA probe. */
#include "kernels/kernels.h"

#define PA_TILE_gemm_f32 4, 16, PA_GEMM_KC, 64, 2048
#define PA_TILE_gemm_f64 4, 8, PA_GEMM_KC, 64, 1024
const pa_family pa_family_generic = {
    PA_FAMILY_KERNELS(ref),
    .gemm_bf16 = {PA_NAMED(pa_gemm_bf16_ref), 4, 16, PA_GEMM_KC_BF16, 64, 2048},
    .attn_bq = {48, 48},
    .fma_probe = NULL, .fma_lanes = 0,
    .bf16_narrow = pa_bf16_narrow_ref,
};

/* precision "int8" on the generic family (ops/attn_flash.c): the SIMD
 * families' float32 rowsm and softcap bits (kernels/ref/vecbits_ref.c), the
 * two fields overridden */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
#endif
const pa_family pa_family_generic_vecbits = {
    PA_FAMILY_KERNELS(ref),
    .gemm_bf16 = {PA_NAMED(pa_gemm_bf16_ref), 4, 16, PA_GEMM_KC_BF16, 64, 2048},
    .attn_bq = {48, 48},
    .fma_probe = NULL, .fma_lanes = 0,
    .bf16_narrow = pa_bf16_narrow_ref,
    .rowsm = {[PA_F32] = {PA_NAMED(pa_rowsm_f32_vecbits_ref)}, [PA_F64] = {PA_NAMED(pa_rowsm_f64_ref)}},
    .softcap = {[PA_F32] = {PA_NAMED(pa_softcap_f32_vecbits_ref)}, [PA_F64] = {PA_NAMED(pa_softcap_f64_ref)}},
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64

int pa_dec_read_mode = PA_READ_GATHER;   /* set at import (family.h, pa_dec_read) */
