/*
 * quant.h -- symmetric per-group quantization (pyattn.quantize / dequantize,
 * and the rows a quantized KV cache is written with). No Python here.
 *
 * THE rule (API.md, "Quantized KV caches"), per group of G consecutive
 * values x_g of a row (float32):
 *   amax  = max |x_g|                         (exact)
 *   scale = amax / QMAX                       (float32 division, rounded to
 *                                              nearest; QMAX 127 int8, 7 int4)
 *   q     = scale == 0 ? 0
 *         : clamp(rint(x / scale), -QMAX, QMAX)   (x / scale: one float32
 *                                              division, rounded to nearest;
 *                                              rint: ties to even)
 * int8: one int8 per value. int4: two per byte along the row, value 2i in
 * the low nibble of byte i, value 2i + 1 in the high one, two's complement.
 * Dequantized: (float)q * scale, one float32 multiply (or, into float64,
 * (double)q * scale: exact).
 *
 * fp8 (API.md "Decode precision and FP8 caches"): the same groups, with
 * QMAX the format's largest finite value (448 float8_e4m3fn, 57344
 * float8_e5m2) and q = the float32 x / scale rounded to the fp8 format to
 * nearest even, saturating to +-QMAX (pa_fp8_round), subnormals kept; 0
 * where scale == 0. One byte per value (ml_dtypes' encodings); its value is
 * exact in a float (pa_fp8_value), dequantized as value * scale (one
 * float32 multiply; exact in float64).
 */
#ifndef PYATTN_OPS_QUANT_H
#define PYATTN_OPS_QUANT_H

#include <math.h>
#include <stdint.h>
#include "ops.h"
#include "rotary.h"
#include "kernels/ref/quant_ref.h"   /* PA_QF8E4 / PA_QF8E5, pa_qfp8, pa_fp8_value */

/* One call: rows over the batch bt (all axes but the quantized one),
 * E values per row, groups of G (E % G == 0; int4: E even). Strides in
 * elements: x float32 (row: cs), q int8 / uint8 bytes (int4: E / 2 bytes per
 * row, stride cs between bytes), s float32 (E / G per row, stride cs). */
typedef struct {
    int bits;                 /* 8, 4, or PA_QF8E4 / PA_QF8E5 (fp8) */
    int x64;                  /* dequantize only: x is float64, q * s exact in it */
    pa_batch bt;
    pa_ssize E, G;
    pa_operand x, q, s;
} pa_quant_call;

/* A quantized KV cache's scales: pa_cache (ops.h), its ks, vs, kG, vG. */

/* bits of a storage dtype: 8 (PA_I8), 4 (PA_I4), PA_QF8E4 / PA_QF8E5 (the
 * fp8 formats), 0 (not quantized) */
static inline int pa_qbits(int dt)
{
    return dt == PA_I8 ? 8 : dt == PA_I4 ? 4 : dt == PA_F8E4 ? PA_QF8E4 : dt == PA_F8E5 ? PA_QF8E5 : 0;
}
/* the largest finite value of an fp8 format (QMAX) */
static inline float pa_fp8_max(int bits) { return bits == PA_QF8E4 ? 448.0f : 57344.0f; }

/* THE fp8 rounding: finite float32 y -> the byte of fp8 format bits, to
 * nearest even, saturating to +-QMAX (e4m3fn has no infinity; e5m2's is not
 * written), the sign kept (-0 is 0x80). Below the smallest normal 2^(1 -
 * bias) the steps are 2^(1 - bias - mantissa bits): y times the power of
 * two (exact) rounded by rintf (ties to even); a result of 2^mb there is
 * the smallest normal's code itself. Above, the float32 bits rounded at the
 * format's mantissa (a carry into the exponent is right). */
static inline uint8_t pa_fp8_round(float y, int bits)
{
    const int mb = bits == PA_QF8E4 ? 3 : 2, bias = bits == PA_QF8E4 ? 7 : 15;
    const uint32_t maxc = bits == PA_QF8E4 ? 0x7eu : 0x7bu;
    const uint32_t u = pa_f32_bits(y), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    uint32_t c;
    if ((int)(a >> 23) - 127 < 1 - bias) {
        const float up = bits == PA_QF8E4 ? 512.0f : 65536.0f;      /* 2^(mb + bias - 1) */
        c = (uint32_t)rintf(pa_bits_f32(a) * up);
    } else {
        const int sh = 23 - mb;
        const uint32_t r = a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u);
        const uint32_t ex = (r >> 23) - 127u + (uint32_t)bias;    /* >= 1 here */
        c = ex > 31u ? maxc + 1u : (ex << mb) | ((r >> sh) & ((1u << mb) - 1u));
        if (c > maxc) c = maxc;
    }
    return (uint8_t)(sign | c);
}

/* THE rule's two steps (pa_quant_row, and precision "int8"'s query rows in
 * the attention frame): the scale of a group of G finite values at x
 * (stride xcs), and value x of a group with scale > 0 as an integer in
 * [-qmax, qmax] */
static inline float pa_quant_scale(const float *x, pa_ssize xcs, pa_ssize G, float qmax)
{
    float amax = 0;
    for (pa_ssize e = 0; e < G; e++) {
        const float a = fabsf(x[e * xcs]);
        amax = a > amax ? a : amax;
    }
    return amax / qmax;
}
static inline int pa_quant_value(float x, float scale, float qmax)
{
    const float r = rintf(x / scale);
    return (int)(r > qmax ? qmax : r < -qmax ? -qmax : r);
}

/* quantize: returns 0, 1 when x holds a NaN or an infinity (the outputs
 * are then incomplete: the caller discards them; *bad = the flat row index
 * of one such row), -1 when its workspace cannot be allocated. */
int pa_quantize(const pa_quant_call *c, int nthreads, pa_ssize *bad);
/* dequantize: x = q * s (float32: one rounded multiply; x64: the exact
 * product, which a double holds: <= 8 + 24 significant bits); returns 0,
 * or -1 (no workspace). */
int pa_dequantize(const pa_quant_call *c, int nthreads);

/* One row: E float32 values at x (stride xcs) -> q, s (strides qcs, scs).
 * Returns 1 (writing nothing) when the row holds a NaN or an infinity. The
 * KV cache's append calls it row by row (bind_append.c). */
int pa_quant_row(int bits, const float *x, pa_ssize xcs, pa_ssize E, pa_ssize G, void *q,
                 pa_ssize qcs, float *s, pa_ssize scs);
/* 1 when the E values at x (stride xcs) are all finite */
int pa_quant_finite(const float *x, pa_ssize xcs, pa_ssize E);

/* rotary on a quantized cache's appends: head dims up to this (the rows
 * are rotated into a stack buffer of this size before they are quantized) */
#define PA_QROT_MAXD 512
/* The new rows of a quantized append, rows (B, H, T, D) float32 at element
 * strides st, shape = {B, H, T}: 1 when every row is finite as it will be
 * written -- rotated first when rope != NULL (row t of sequence b at position
 * pos[b] + t; D <= PA_QROT_MAXD) -- else 0 with the first bad (b, h, t) in
 * at. The contiguous (bind_append.c) and paged (bind_paged.c) appends call it
 * before anything is written. */
int pa_quant_rows_finite(const float *rows, const pa_ssize st[4], const pa_ssize shape[3], pa_ssize D,
                         const pa_rope *rope, const int64_t *pos, pa_ssize at[3]);

#endif
