/* vecbits_ref.c -- the SIMD families' float32 rowsm and softcap
 * (kernels/vec/decode_vec.inc, softcap_vec.inc) in portable C, operation by
 * operation on the shared vector exp (kernels/vec/exp_vec.inc; its
 * constants repeated here): the same bits as every SIMD family, where the
 * generic family's own kernels use the C library's exp. Precision "int8"
 * promises the same bits on every family: its calls on the generic family
 * run these (ops/attn_flash.c, pa_flash_run). Exports pa_vexp_f32_ref,
 * pa_rowsm_f32_vecbits_ref, pa_softcap_f32_vecbits_ref. */
#include <math.h>
#include <string.h>
#include "kernels/kernels.h"

/* the vocabulary's vmax (x86 max_ps): a where a > b, else b (NaN: b) */
static inline float vb_max(float a, float b) { return a > b ? a : b; }

/* exp_vec.inc's float32 vexp, step by step (fused where it fuses) */
float pa_vexp_f32_ref(float x)
{
    const float lo = -88.0f, magic = 12583039.0f, log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    static const float poly[] = {1.4061277e-3f, 8.379021e-3f, 4.1664775e-2f, 1.6666365e-1f, 5.0000006e-1f, 1.0f};
    const float xc = vb_max(lo, x);
    const float t = fmaf(xc, log2e, magic);
    const float n = t - magic;
    float r = fmaf(-n, ln2_hi, xc);
    r = fmaf(-n, ln2_lo, r);
    float y = poly[0];
    for (int i = 1; i < (int)(sizeof poly / sizeof poly[0]); i++) y = fmaf(y, r, poly[i]);
    y = fmaf(y, r, 1.0f);
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    u <<= 23;                                        /* vpow2i: t's low bits are the exponent */
    float p2;
    memcpy(&p2, &u, sizeof p2);
    return y * p2;
}

/* decode_vec.inc's rowsm at 16 partial sums (lane j % 16), its order */
void pa_rowsm_f32_vecbits_ref(void *s_, pa_ssize nj, void *m_, void *l_, void *alpha_)
{
    float *s = (float *)s_, *mp = (float *)m_, *lp = (float *)l_, *ap = (float *)alpha_;
    const pa_ssize n16 = nj / 16 * 16;
    float lanes[16];
    for (int t = 0; t < 16; t++) lanes[t] = -INFINITY;
    for (pa_ssize j = 0; j < n16; j++) lanes[j % 16] = vb_max(s[j], lanes[j % 16]);
    float mt = -INFINITY;
    for (int t = 0; t < 16; t++) if (lanes[t] > mt) mt = lanes[t];   /* any width: the same max */
    for (pa_ssize j = n16; j < nj; j++) if (s[j] > mt) mt = s[j];
    const float mold = *mp;
    const float mnew = mt > mold ? mt : mold;
    const float msafe = mnew == -INFINITY ? 0.0f : mnew;
    const float al = pa_vexp_f32_ref(mold - msafe);
    float acc[16] = {0};
    for (pa_ssize j = 0; j < nj; j++) {
        const float e = pa_vexp_f32_ref(s[j] - msafe);
        s[j] = e;
        acc[j % 16] = acc[j % 16] + e;
    }
    if (n16 < nj)                                    /* the padded tail's -inf lanes: + exp = +0 */
        for (pa_ssize t = nj - n16; t < 16; t++) acc[t] = acc[t] + pa_vexp_f32_ref(-INFINITY - msafe);
    for (int w = 8; w >= 1; w /= 2)
        for (int t = 0; t < w; t++) acc[t] = acc[t] + acc[t + w];
    *ap = al;
    *lp = *lp * al + acc[0];
    *mp = mnew;
}

/* softcap_vec.inc's softcap1, lane by lane */
void pa_softcap_f32_vecbits_ref(void *x_, pa_ssize n, double cap)
{
    static const float k[] = {0.0035921280f, -0.0088632355f, 0.021869489f, -0.053968254f,
                              0.13333334f, -0.33333334f, 1.0f};
    float *x = (float *)x_;
    const float c = (float)cap, ic = (float)(1.0 / cap);
    for (pa_ssize i = 0; i < n; i++) {
        const float y = x[i] * ic;
        const float a = vb_max(y, 0.0f - y);
        const int small = a < 0.25f;
        const float as = 0.0f - vb_max(0.0f - a, 0.0f - 0.25f);
        const float a2 = as * as;
        float p = k[0];
        for (int j = 1; j < (int)(sizeof k / sizeof k[0]); j++) p = fmaf(p, a2, k[j]);
        p = p * as;
        const float e = pa_vexp_f32_ref(-2.0f * a);
        const float big = (1.0f - e) / (1.0f + e);
        const float th = (small ? 0.0f : big) + (p - (small ? 0.0f : p));
        const float pos = y < 0.0f ? 0.0f : th;
        x[i] = c * (pos + (pos - th));
    }
}
