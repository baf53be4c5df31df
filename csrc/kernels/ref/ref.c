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
