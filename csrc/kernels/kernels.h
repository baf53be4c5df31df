/*
 * kernels.h -- the symbols of every leaf kernel, by family, generated from
 * registry.h: for each family row <isa> and each kernel kind,
 *   pa_<kind>_<sfx>_<isa>   for each dtype the kind's shape is indexed by
 *                           (sfx: f32, f64; f16_f32, bf16_f32 for 16-bit
 *                           storage read as float32), e.g. pa_gemm_f32_avx2,
 *                           pa_rowdot_bf16_f32_neon, pa_widen_f16_f32_ref
 *   pa_<kind>_<isa>         for a kind of shape F, e.g. pa_read_probe_avx512
 * (the generic family's word in symbols is `ref`). Their contract is in
 * family.h and csrc/README.md; each family's file puts them into its table
 * (PA_FAMILY_KERNELS). Declared for every family; only the families of the
 * build's architecture define theirs. Below the list: the kernels a family
 * picks as parameters (bfloat16 products, peak probes).
 */
#ifndef PYATTN_KERNELS_H
#define PYATTN_KERNELS_H

#include "family.h"

#define PA_DECL_FAMILY(CODE, word, isa, arch, ...) PA_KERNEL_KINDS(PA_DECL_KIND, isa)
#define PA_DECL_KIND(kind, shape, ret, params, isa) PA_REG_CAT(PA_DECL_, shape)(kind, isa)
#define PA_DECL_G(kind, isa) PA_DTYPES(PA_DECL_DT_C, kind, isa)
#define PA_DECL_C(kind, isa) PA_DTYPES(PA_DECL_DT_C, kind, isa)
#define PA_DECL_S(kind, isa) PA_DTYPES(PA_DECL_DT_S, kind, isa)
#define PA_DECL_W(kind, isa) PA_DTYPES(PA_DECL_DT_W, kind, isa)
#define PA_DECL_F(kind, isa) pa_##kind##_sig pa_##kind##_##isa;
#define PA_DECL_DT_C(CODE, sfx, name, size, compute, c, s, w, kind, isa) \
    PA_WHEN(c)(pa_##kind##_sig pa_##kind##_##sfx##_##isa;)
#define PA_DECL_DT_S(CODE, sfx, name, size, compute, c, s, w, kind, isa) \
    PA_WHEN(s)(pa_##kind##_sig pa_##kind##_##sfx##_##isa;)
#define PA_DECL_DT_W(CODE, sfx, name, size, compute, c, s, w, kind, isa) \
    PA_WHEN(w)(pa_##kind##_sig pa_##kind##_##sfx##_##isa;)
PA_FAMILIES(PA_DECL_FAMILY, _)
#undef PA_DECL_FAMILY
#undef PA_DECL_KIND
#undef PA_DECL_G
#undef PA_DECL_C
#undef PA_DECL_S
#undef PA_DECL_W
#undef PA_DECL_F
#undef PA_DECL_DT_C
#undef PA_DECL_DT_S
#undef PA_DECL_DT_W

/* the SIMD families' float32 rowsm and softcap bits (the shared vector exp)
 * in portable C (kernels/ref/vecbits_ref.c): precision "int8" on the
 * generic family */
float pa_vexp_f32_ref(float x);

/* bfloat16 products (gemm_bf16): the exact emulation, and AVX512_BF16's vdpbf16ps */
pa_gemm_sig pa_gemm_bf16_ref;
/* precision "bf16"'s row narrower (pa_bf16_narrow_fn), portable (ref.c) */
void pa_bf16_narrow_ref(uint16_t *dst, const void *src, pa_ssize n, int f16);
#ifdef PA_HAVE_X86_KERNELS
pa_gemm_sig pa_gemm_bf16_avx512bf16;
/* the same products on float32 FMAs (kernels/x86/bf16emu.c), where AVX512_BF16 is missing */
pa_gemm_sig pa_gemm_bf16_avx2;
pa_gemm_sig pa_gemm_bf16_avx512;
/* precision "bf16"'s P packer (pa_bf16_pack_fn) on AVX2 / AVX-512 integer vectors (bf16emu.c) */
void pa_bf16_pack_p_avx2(const float *St, pa_ssize ld, pa_ssize qc, pa_ssize nj2, int mr, uint32_t *Pp);
void pa_bf16_pack_p_avx512(const float *St, pa_ssize ld, pa_ssize qc, pa_ssize nj2, int mr, uint32_t *Pp);
/* precision "bf16"'s row narrower (pa_bf16_narrow_fn), the same vectors (bf16emu.c) */
void pa_bf16_narrow_avx2(uint16_t *dst, const void *src, pa_ssize n, int f16);
void pa_bf16_narrow_avx512(uint16_t *dst, const void *src, pa_ssize n, int f16);
double pa_bf16_probe_avx512bf16(long long iters, float *sink);
/* the FMA peak probe of the avx2 family (kernels/vec/probe_vec.inc), which
 * avx512emu borrows */
double pa_fma_probe_avx2(long long iters, float *sink);
/* precision "int8"'s key products (the q8rowdot contract) on AVX2 integer
 * vectors (kernels/x86/q8dot_avx2.c), for the x86 families; other group
 * sizes and head dims over PA_Q8_MAXE go portable (the same bits) */
#define PA_Q8_MAXE 512
pa_q8rowdot_sig pa_q8dot_i16_avx2;
/* ... and on AVX512_VNNI's vpdpbusd (kernels/x86/q8dot_vnni.c): the
 * q8rowdot of the avx512 family's tables for CPUs with it */
pa_q8rowdot_sig pa_q8rowdot_avx512vnni;
/* the avx512 family's other float32 GEMM shape (kernels/x86/avx512_ukr.c),
 * which ukr_select.c may give a copy of the family's table */
pa_gemm_sig pa_gemm_f32_avx512_6x48;
#endif
#ifdef PA_HAVE_NEON_KERNELS
pa_gemm_sig pa_gemm_bf16_neon;             /* the same on NEON FMAs (kernels/arm/bf16emu_neon.c) */
#endif

#endif
