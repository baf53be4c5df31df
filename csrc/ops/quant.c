/* quant.c -- symmetric per-group quantization and its inverse (quant.h):
 * portable C over rows, threaded over fixed blocks of rows (each value's
 * arithmetic depends on its own group only, so any thread count gives the
 * same bits). */
#include <math.h>
#include "quant.h"
#include "../threads.h"

#define PA_QUANT_ROWS 64          /* rows per task */

int pa_quant_finite(const float *x, pa_ssize xcs, pa_ssize E)
{
    int ok = 1;
    for (pa_ssize e = 0; e < E; e++) ok &= isfinite(x[e * xcs]) != 0;
    return ok;
}

int pa_quant_rows_finite(const float *rows, const pa_ssize st[4], const pa_ssize shape[3], pa_ssize D,
                         const pa_rope *rope, const int64_t *pos, pa_ssize at[3])
{
    float tmp[PA_QROT_MAXD];
    for (pa_ssize b = 0; b < shape[0]; b++)
        for (pa_ssize h = 0; h < shape[1]; h++)
            for (pa_ssize t = 0; t < shape[2]; t++) {
                const float *src = rows + (b * st[0] + h * st[1] + t * st[2]);
                if (rope) pa_rope_row(rope, (pa_ssize)pos[b] + t, src, PA_F32, st[3], tmp, PA_F32, 1, D);
                if (!pa_quant_finite(rope ? tmp : src, rope ? 1 : st[3], D)) {
                    at[0] = b; at[1] = h; at[2] = t;
                    return 0;
                }
            }
    return 1;
}

int pa_quant_row(int bits, const float *x, pa_ssize xcs, pa_ssize E, pa_ssize G, void *q,
                 pa_ssize qcs, float *s, pa_ssize scs)
{
    if (!pa_quant_finite(x, xcs, E)) return 1;
    if (pa_qfp8(bits)) {                       /* fp8: q = the rounded x / scale */
        const float fmax = pa_fp8_max(bits);
        uint8_t *q8 = (uint8_t *)q;
        for (pa_ssize g0 = 0; g0 < E; g0 += G) {
            const float scale = pa_quant_scale(x + g0 * xcs, xcs, G, fmax);
            s[(g0 / G) * scs] = scale;
            for (pa_ssize e = g0; e < g0 + G; e++)
                q8[e * qcs] = scale == 0 ? 0 : pa_fp8_round(x[e * xcs] / scale, bits);
        }
        return 0;
    }
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    int8_t *q8 = (int8_t *)q;
    uint8_t *q4 = (uint8_t *)q;
    for (pa_ssize g0 = 0; g0 < E; g0 += G) {
        const float scale = pa_quant_scale(x + g0 * xcs, xcs, G, qmax);
        s[(g0 / G) * scs] = scale;
        for (pa_ssize e = g0; e < g0 + G; e++) {
            const int v = scale == 0 ? 0 : pa_quant_value(x[e * xcs], scale, qmax);
            if (bits == 8) {
                q8[e * qcs] = (int8_t)v;
            } else {
                uint8_t *byte = q4 + (e >> 1) * qcs;
                const unsigned nib = (unsigned)v & 0xfu;
                *byte = (e & 1) ? (uint8_t)((*byte & 0x0fu) | (nib << 4)) : (uint8_t)((*byte & 0xf0u) | nib);
            }
        }
    }
    return 0;
}

/* value e of a row of q (int8, int4 packed two per byte, or fp8: exact in
 * a float) */
static inline float pa_dequant_value(int bits, const void *q, pa_ssize qcs, pa_ssize e)
{
    if (pa_qfp8(bits)) return pa_fp8_value(((const uint8_t *)q)[e * qcs], bits);
    if (bits == 8) return ((const int8_t *)q)[e * qcs];
    const uint8_t byte = ((const uint8_t *)q)[(e >> 1) * qcs];
    const unsigned nib = (e & 1) ? (unsigned)byte >> 4 : (unsigned)byte & 0xfu;
    return (float)((int)nib - (int)((nib & 8u) << 1));
}

/* one row of q, s -> x: (float)q * scale into float32 (rounded once), or
 * (double)q * scale into float64 (exact) when x64 */
static void pa_dequant_row(int bits, const void *q, pa_ssize qcs, const float *s, pa_ssize scs,
                           pa_ssize E, pa_ssize G, void *x, pa_ssize xcs, int x64)
{
    if (x64) {
        double *xd = (double *)x;
        for (pa_ssize e = 0; e < E; e++)
            xd[e * xcs] = (double)pa_dequant_value(bits, q, qcs, e) * (double)s[(e / G) * scs];
    } else {
        float *xf = (float *)x;
        for (pa_ssize e = 0; e < E; e++)
            xf[e * xcs] = pa_dequant_value(bits, q, qcs, e) * s[(e / G) * scs];
    }
}

typedef struct {
    const pa_quant_call *c;
    int dequant;
    pa_ssize bad[PA_MAX_THREADS];   /* per thread: a failing row it met, or -1 */
} quant_ctx;

static void quant_task(void *ctx_, pa_ssize task, int tid)
{
    quant_ctx *ctx = (quant_ctx *)ctx_;
    const pa_quant_call *c = ctx->c;
    const pa_ssize r1 = pa_min((task + 1) * PA_QUANT_ROWS, c->bt.count);
    for (pa_ssize r = task * PA_QUANT_ROWS; r < r1; r++) {
        /* x: float32, or float64 (a dequantize with x64); offsets in elements */
        char *x = (char *)c->x.p + pa_batch_offset(&c->bt, c->x.bs, r) * (c->x64 ? 8 : 4);
        char *q = (char *)c->q.p + pa_batch_offset(&c->bt, c->q.bs, r);
        const float *s = (const float *)c->s.p + pa_batch_offset(&c->bt, c->s.bs, r);
        if (ctx->dequant)
            pa_dequant_row(c->bits, q, c->q.cs, s, c->s.cs, c->E, c->G, x, c->x.cs, c->x64);
        else if (pa_quant_row(c->bits, (const float *)x, c->x.cs, c->E, c->G, q, c->q.cs, (float *)s, c->s.cs))
            ctx->bad[tid] = r;  /* any failing row will do: the call fails */
    }
}

static int quant_run(const pa_quant_call *c, int dequant, int nthreads, pa_ssize *bad)
{
    static const int cap = PA_MAX_THREADS;
    quant_ctx *ctx = pa_alloc64(sizeof *ctx);
    if (!ctx) return -1;
    ctx->c = c;
    ctx->dequant = dequant;
    for (int t = 0; t < cap; t++) ctx->bad[t] = -1;
    const pa_ssize ntasks = (c->bt.count + PA_QUANT_ROWS - 1) / PA_QUANT_ROWS;
    if (ntasks > 0 && c->E > 0) pa_parallel_for(ntasks, quant_task, ctx, nthreads < cap ? nthreads : cap);
    pa_ssize b = -1;
    for (int t = 0; t < cap; t++) b = ctx->bad[t] >= 0 ? ctx->bad[t] : b;
    pa_free64(ctx);
    if (bad) *bad = b;
    return b >= 0;
}

int pa_quantize(const pa_quant_call *c, int nthreads, pa_ssize *bad)
{
    return quant_run(c, 0, nthreads, bad);
}

int pa_dequantize(const pa_quant_call *c, int nthreads)
{
    return quant_run(c, 1, nthreads, NULL);
}
