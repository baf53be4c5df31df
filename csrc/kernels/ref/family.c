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
};
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64
