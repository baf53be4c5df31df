/* quant_ref.c -- the portable kernels of the quantized KV cache (int8 /
 * int4 rows with float32 scales per group of G values; registry.h: qrowdot,
 * qrowpv, qwiden; the contract in family.h and csrc/README.md). Unlike the
 * other portable kernels they fuse their products (fmaf): a quantized
 * cache gives the same bits on every family, the generic one included, and
 * the SIMD families call these for group sizes that are not a multiple of 16. */
#include <math.h>
#include "kernels/kernels.h"
#include "quant_ref.h"

void pa_qrowdot_ref(const float *Q, pa_ssize qrs, pa_ssize R, const void *K, pa_ssize krs,
                    const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G, int bits,
                    float *s, pa_ssize ss)
{
    for (pa_ssize r = 0; r < R; r++)
        for (pa_ssize j = 0; j < nj; j++) {
            const float *q = Q + r * qrs;
            const char *k = (const char *)K + j * krs;
            const float *sc = ks + j * ksrs;
            float p[16] = {0};
            for (pa_ssize g0 = 0; g0 < E; g0 += G) {
                float gp[16] = {0};
                for (pa_ssize e = g0; e < g0 + G; e++)
                    gp[e % 16] = fmaf(q[e], (float)pa_qval(k, e, bits), gp[e % 16]);
                const float scale = sc[g0 / G];
                for (int t = 0; t < 16; t++) p[t] = fmaf(gp[t], scale, p[t]);
            }
            for (int w = 8; w >= 1; w /= 2)
                for (int t = 0; t < w; t++) p[t] = p[t] + p[t + w];
            s[r * ss + j] = p[0];
        }
}

void pa_qrowpv_ref(const float *P, pa_ssize ps, pa_ssize R, const void *V, pa_ssize vrs,
                   const float *vs, pa_ssize vsrs, pa_ssize nj, pa_ssize Ev, pa_ssize G, int bits,
                   float *acc, pa_ssize ald)
{
    for (pa_ssize r = 0; r < R; r++) {
        float *ar = acc + r * ald;
        for (pa_ssize j = 0; j < nj; j++) {
            const float pj = P[r * ps + j];
            if (pj == 0) continue;
            const char *v = (const char *)V + j * vrs;
            for (pa_ssize g0 = 0; g0 < Ev; g0 += G) {
                const float w = pj * vs[j * vsrs + g0 / G];
                for (pa_ssize d = g0; d < g0 + G; d++) ar[d] = fmaf(w, (float)pa_qval(v, d, bits), ar[d]);
            }
        }
    }
}

void pa_qwiden_ref(float *dst, const void *src, const float *scale, pa_ssize n, pa_ssize G, int bits)
{
    if (pa_qfp8(bits)) {                 /* fp8: the byte's exact value */
        const uint8_t *b = (const uint8_t *)src;
        for (pa_ssize e = 0; e < n; e++) dst[e] = pa_fp8_value(b[e], bits) * scale[e / G];
        return;
    }
    for (pa_ssize e = 0; e < n; e++) dst[e] = (float)pa_qval(src, e, bits) * scale[e / G];
}

/* precision "int8" (q8rowdot): Q (R, E) int8 query rows (row stride qrs),
 * qs (R, E / G) their float32 scales (row stride qsrs); per row r and key j,
 * per group g in order: the exact integer sum of the group's products, then
 * acc = fmaf((float)isum, qs[g] * ks[g], acc) from +0 (the scales' product
 * rounded once); s = acc * scale. Every family gives these bits (the integer
 * sums are exact in any order; the float steps are these, in this order). */
void pa_q8rowdot_ref(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R,
                     const void *K, pa_ssize krs, const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E,
                     pa_ssize G, int bits, float scale, float *s, pa_ssize ss)
{
    for (pa_ssize r = 0; r < R; r++)
        for (pa_ssize j = 0; j < nj; j++) {
            const int8_t *q = Q + r * qrs;
            const char *k = (const char *)K + j * krs;
            const float *sc = ks + j * ksrs, *qsc = qs + r * qsrs;
            float acc = 0.0f;
            for (pa_ssize g0 = 0, g = 0; g0 < E; g0 += G, g++) {
                int32_t isum = 0;
                for (pa_ssize e = g0; e < g0 + G; e++) isum += (int32_t)q[e] * pa_qval(k, e, bits);
                const float t = qsc[g] * sc[g];
                acc = fmaf((float)isum, t, acc);
            }
            s[r * ss + j] = acc * scale;
        }
}
