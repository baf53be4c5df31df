/*
 * ref.c -- the portable kernels, any CPU: the generic family, and the
 * reference twin every SIMD kernel falls back to. Each body is included
 * once per dtype (dtypes.inc).
 */
#include <math.h>
#include "kernels/kernels.h"

#define PA_REF(op) PA_CAT(PA_CAT(pa_##op##_, PA_DT), _ref)

#define PA_TEMPLATE "kernels/ref/gemm_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/tilesm_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/tilep_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/softmax_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/decode_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/softcap_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/rescale_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_REF

/* 16-bit storage to float32, portable (pyattn.h's exact conversions) */
void pa_widen_f16_f32_ref(float *dst, const uint16_t *src, pa_ssize n)
{
    for (pa_ssize i = 0; i < n; i++) dst[i] = pa_f16_to_f32(src[i]);
}
void pa_widen_bf16_f32_ref(float *dst, const uint16_t *src, pa_ssize n)
{
    for (pa_ssize i = 0; i < n; i++) dst[i] = pa_bf16_to_f32(src[i]);
}

/* The read-bandwidth probe in portable C: 8 independent sums. */
/* precision "bf16"'s row narrower (family.h's bf16_narrow): pa_bf16_round's rule */
void pa_bf16_narrow_ref(uint16_t *dst, const void *src, pa_ssize n, int f16)
{
    for (pa_ssize e = 0; e < n; e++) dst[e] = pa_f32_to_bf16(pa_load_f32(src, e, f16 ? PA_F16 : PA_F32));
}

float pa_read_probe_ref(const float *p, size_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) s[u] += p[i + u];
    for (int u = 0; u < 8; u++) t += s[u];
    for (; i < n; i++) t += p[i];
    return t;
}

/* ---- bfloat16 products (precision="bf16"): the portable micro-kernel ------
 * The exact emulation of AVX512_BF16's vdpbf16ps, measured bit for bit
 * against the instruction on an AMD Zen 4 (tests/test_bf16.py; a NaN's sign
 * and payload aside): for each pair of K
 * elements (2q, 2q+1), in order of q, the odd one first,
 *   acc = ftz(fma(daz(a[2q+1]), daz(b[2q+1]), acc))
 *   acc = ftz(fma(daz(a[2q]),   daz(b[2q]),   acc))
 * with bfloat16 subnormal inputs read as zero (daz) and subnormal results
 * flushed to a zero of their sign (ftz); the product of two bfloat16
 * values is exact in float32 (8-bit significands), so in the normal range
 * this is a float32 add of an exact product. Then C = acc, or C += acc (an
 * IEEE add). Operands are packed pair panels (family.h: pa_gemm_kernel
 * gemm_bf16): A[(q * MR + i) * 2 + t], B[(q * NR + j) * 2 + t] hold element
 * 2q + t of row i / column j. */
#define PA_BF16_REF_MR 4
#define PA_BF16_REF_NR 16

static inline float pa_daz_bf16(uint16_t h)
{
    return (h & 0x7f80u) ? pa_bf16_to_f32(h) : pa_bits_f32((uint32_t)(h & 0x8000u) << 16);
}
static inline float pa_ftz(float x)
{
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}

void pa_gemm_bf16_ref(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs, const void *B_,
                      pa_ssize b_rs, void *C_, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    const uint16_t *A = (const uint16_t *)A_, *B = (const uint16_t *)B_;
    float *C = (float *)C_;
    float acc[PA_BF16_REF_MR][PA_BF16_REF_NR];
    for (int i = 0; i < PA_BF16_REF_MR; i++)
        for (int j = 0; j < PA_BF16_REF_NR; j++) acc[i][j] = 0;
    for (pa_ssize q = 0; q < kc / 2; q++) {
        const uint16_t *a = A + q * PA_BF16_REF_MR * 2, *b = B + q * PA_BF16_REF_NR * 2;
        for (int i = 0; i < PA_BF16_REF_MR; i++) {
            const float a1 = pa_daz_bf16(a[2 * i + 1]), a0 = pa_daz_bf16(a[2 * i]);
            for (int j = 0; j < PA_BF16_REF_NR; j++) {
                float t = pa_ftz(fmaf(a1, pa_daz_bf16(b[2 * j + 1]), acc[i][j]));
                acc[i][j] = pa_ftz(fmaf(a0, pa_daz_bf16(b[2 * j]), t));
            }
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *c = C + i * rs + j * cs;
            *c = accumulate ? *c + acc[i][j] : acc[i][j];
        }
}
