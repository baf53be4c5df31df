/*
 * avx512emu.c -- the avx512 family's bodies at its widths (16 floats /
 * 8 doubles) over pairs of AVX2 registers (simd_avx512emu.h): bit for bit
 * the arithmetic of avx512.c, so CPUs without AVX-512 test it
 * (PYATTN_ISA=avx512emu; slow). Defines every kernel kind of
 * PA_KERNEL_KINDS (registry.h) as pa_<kind>_<sfx>_avx512emu, and the
 * family's table, pa_family_avx512emu, with avx512's tiles; its FMA probe
 * is avx2's (the emulation's own, pa_fma_probe_avx512emu, is not used).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512emu.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD emu
#define PA_ISA avx512emu
#define PA_VFN __attribute__((target("avx2,fma,f16c")))
#define PA_MR 12
#define PA_WITH_SOFTMAX 2
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX

#define PA_TILE_gemm_f32 12, 32, PA_GEMM_KC, 96, 2048
#define PA_TILE_gemm_f64 12, 16, PA_GEMM_KC, 96, 1024
const pa_family pa_family_avx512emu = {
    PA_FAMILY_KERNELS(avx512emu),
    .gemm_bf16 = {PA_NAMED(pa_gemm_bf16_avx2), 6, 16, PA_GEMM_KC_BF16, 96, 2048},
    .attn_bq = {96, 48},
    .fma_probe = pa_fma_probe_avx2, .fma_lanes = 8,
    .bf16_pack_p = pa_bf16_pack_p_avx2,
    .bf16_narrow = pa_bf16_narrow_avx2,
};
#undef PA_TILE_gemm_f32
#undef PA_TILE_gemm_f64
#endif
