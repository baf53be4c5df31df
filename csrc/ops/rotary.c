/*
 * rotary.c -- RoPE of one row (rotary.h). A portable loop: rows are short
 * (E <= a few hundred) and the work is a few operations per element, so it
 * is bound by the loads of the row and of its cos / sin row; the pairs are
 * done in blocks of PA_ROPE_BLK through double buffers, each loop simple
 * enough for the compiler to vectorise at the baseline ISA.
 */
#include <stdint.h>
#include <string.h>

#include "pyattn.h"
#include "rotary.h"

#define PA_ROPE_BLK 64

uint16_t pa_f32_to_f16(float f)
{
    union { float f; uint32_t u; } c;
    c.f = f;
    const uint16_t sign = (uint16_t)((c.u >> 16) & 0x8000u);
    const uint32_t a = c.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  /* NaN: quiet */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* >= 65520: rounds to inf (ties to even) */
    if (a < 0x38800000u) {              /* below 2^-14: a subnormal (or zero, or 0x400 = 2^-14) */
        c.u = a;
        const float t = c.f * 16777216.0f;          /* x 2^24, exact; < 1024 */
        const float r = (t + 8388608.0f) - 8388608.0f;   /* to an integer, nearest even */
        return (uint16_t)(sign | (uint16_t)(int)r);
    }
    uint32_t r = a - 0x38000000u;       /* exponent rebiased 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);     /* 23 -> 10 mantissa bits, nearest even (a carry is right) */
    return (uint16_t)(sign | (uint16_t)(r >> 13));
}

/* d rounded to float32 to odd (an inexact result gets an odd last bit):
 * rounding that to nearest even at <= 22 bits (float16, bfloat16) is the
 * exactly rounded d (Boldo & Melquiond), where float32 first would round
 * twice. Branch-free: one step toward d where the float32 value is inexact,
 * even, and not 0, inf or NaN (f - f == 0 only for finite f); the step is
 * -1 where |f| > |d| (f above d and positive, or below it and negative). */
static inline float f32_odd(double d)
{
    const float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t move = (uint32_t)(((double)f != d) & (f != 0.0f) & (f - f == 0.0f)) & ~u & 1u;
    const uint32_t down = (uint32_t)(((double)f > d) == (f > 0.0f));
    u += move - 2u * (move & down);
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* sum = a + b rounded to nearest, err = a + b - sum exactly (TwoSum): a + b
 * rounded to odd (the nearest double when exact, else the neighbour of the
 * two with an odd last bit); rounding that to float32 (or, through
 * f32_odd, to 16 bits) to nearest even is the exactly rounded a + b */
static inline double to_odd(double sum, double err)
{
    uint64_t u;
    memcpy(&u, &sum, sizeof u);
    if (!(err > 0.0 || err < 0.0) || (u & 1u)) return sum;    /* exact (or inf / NaN: err NaN), or odd */
    u += ((err > 0.0) == (sum > 0.0)) ? 1u : ~(uint64_t)0;    /* one step toward a + b */
    memcpy(&sum, &u, sizeof u);
    return sum;
}

/* a loop over n elements with stride s, written out for s = 1 and s = 2
 * (contiguous rows, interleaved pairs) so the compiler vectorises them */
#define PA_ROPE_LOOP(s, body)                                                                         \
    do {                                                                                              \
        if ((s) == 1) { for (pa_ssize i = 0; i < n; i++) { const pa_ssize j = i; body; } }          \
        else if ((s) == 2) { for (pa_ssize i = 0; i < n; i++) { const pa_ssize j = 2 * i; body; } } \
        else { for (pa_ssize i = 0; i < n; i++) { const pa_ssize j = i * (s); body; } }              \
    } while (0)

/* n elements of x (stored as dt, stride xs) from element i0, every step-th, into d */
static void load_block(const void *x, int dt, pa_ssize xs, pa_ssize i0, pa_ssize step, pa_ssize n, double *d)
{
    const pa_ssize s = xs * step;
    if (dt == PA_F64) {
        const double *p = (const double *)x + i0 * xs;
        PA_ROPE_LOOP(s, d[i] = p[j]);
    } else if (dt == PA_F32) {
        const float *p = (const float *)x + i0 * xs;
        PA_ROPE_LOOP(s, d[i] = (double)p[j]);
    } else if (dt == PA_F16) {
        const uint16_t *p = (const uint16_t *)x + i0 * xs;
        PA_ROPE_LOOP(s, d[i] = (double)pa_f16_to_f32(p[j]));
    } else {
        const uint16_t *p = (const uint16_t *)x + i0 * xs;
        PA_ROPE_LOOP(s, d[i] = (double)pa_bf16_to_f32(p[j]));
    }
}

/* n values d into y (stored as dt, stride ys) from element i0, every
 * step-th: float64 as they are, else rounded to float32 (16 bits: through
 * f32_odd, one rounding in effect) */
static void store_block(void *y, int dt, pa_ssize ys, pa_ssize i0, pa_ssize step, pa_ssize n, const double *d)
{
    const pa_ssize s = ys * step;
    if (dt == PA_F64) {
        double *p = (double *)y + i0 * ys;
        PA_ROPE_LOOP(s, p[j] = d[i]);
    } else if (dt == PA_F32) {
        float *p = (float *)y + i0 * ys;
        PA_ROPE_LOOP(s, p[j] = (float)d[i]);
    } else if (dt == PA_F16) {
        uint16_t *p = (uint16_t *)y + i0 * ys;
        PA_ROPE_LOOP(s, p[j] = pa_f32_to_f16(f32_odd(d[i])));
    } else {
        uint16_t *p = (uint16_t *)y + i0 * ys;
        PA_ROPE_LOOP(s, p[j] = pa_f32_to_bf16(f32_odd(d[i])));
    }
}

void pa_rope_row(const pa_rope *r, pa_ssize pos, const void *x, int xdt, pa_ssize xs, void *y, int ydt,
                 pa_ssize ys, pa_ssize E)
{
    double x1[PA_ROPE_BLK], x2[PA_ROPE_BLK], c[PA_ROPE_BLK], s[PA_ROPE_BLK], y1[PA_ROPE_BLK], y2[PA_ROPE_BLK];
    const pa_ssize half = r->half;
    /* pair i: features (a(i), b(i)) = (i, i + half), or (2i, 2i + 1) interleaved */
    const pa_ssize step = r->interleaved ? 2 : 1, second = r->interleaved ? 1 : half;
    const char *crow = r->cos + pos * r->cst[0] * (pa_ssize)pa_elsize(r->dt);
    const char *srow = r->sin + pos * r->sst[0] * (pa_ssize)pa_elsize(r->dt);
    for (pa_ssize i0 = 0; i0 < half; i0 += PA_ROPE_BLK) {
        const pa_ssize n = pa_min(PA_ROPE_BLK, half - i0);
        load_block(x, xdt, xs, i0 * step, step, n, x1);
        load_block(x, xdt, xs, i0 * step + second, step, n, x2);
        load_block(crow, r->dt, r->cst[1], i0, 1, n, c);
        load_block(srow, r->dt, r->sst[1], i0, 1, n, s);
        if (r->dt == PA_F64)            /* NumPy's float64 x1 * c - x2 * s, each step rounded */
            for (pa_ssize i = 0; i < n; i++) {
                y1[i] = x1[i] * c[i] - x2[i] * s[i];
                y2[i] = x1[i] * s[i] + x2[i] * c[i];
            }
        else {                          /* exact products of float32 values, their sum to odd */
            double e1[PA_ROPE_BLK], e2[PA_ROPE_BLK];
            for (pa_ssize i = 0; i < n; i++) {      /* the sums and their errors (TwoSum), vectorised */
                const double a1 = x1[i] * c[i], b1 = -(x2[i] * s[i]), a2 = x1[i] * s[i], b2 = x2[i] * c[i];
                const double s1 = a1 + b1, s2 = a2 + b2, v1 = s1 - a1, v2 = s2 - a2;
                y1[i] = s1;
                y2[i] = s2;
                e1[i] = (a1 - (s1 - v1)) + (b1 - v1);
                e2[i] = (a2 - (s2 - v2)) + (b2 - v2);
            }
            for (pa_ssize i = 0; i < n; i++)    /* err != 0 is the exception: the products have 48
                                                   bits, their sum is exact unless their exponents are far apart */
                if (e1[i] != 0.0 || e2[i] != 0.0) {
                    y1[i] = to_odd(y1[i], e1[i]);
                    y2[i] = to_odd(y2[i], e2[i]);
                }
        }
        store_block(y, ydt, ys, i0 * step, step, n, y1);
        store_block(y, ydt, ys, i0 * step + second, step, n, y2);
    }
    for (pa_ssize e0 = 2 * half; e0 < E; e0 += PA_ROPE_BLK) {   /* the features past rotary_dim */
        const pa_ssize n = pa_min(PA_ROPE_BLK, E - e0);
        load_block(x, xdt, xs, e0, 1, n, x1);
        store_block(y, ydt, ys, e0, 1, n, x1);
    }
}
