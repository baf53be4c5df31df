/*
 * rotary.h -- rotary position embedding (RoPE) of one row (rotary.c), as
 * attention_with_kvcache applies it (issue 29): to each new key row while
 * it is written into a cache (bind_append.c's pa_kv_append, bind_paged.c's paged
 * append) and to the query rows (bind_rotary.c's _C.rotary, into a scratch
 * of the queries; never a copy of a cache).
 *
 * Row x (E features) at position p: the first 2 * half features rotate in
 * pairs (x1, x2) = (x[i], x[i + half]) (GPT-NeoX / Llama) or (x[2i],
 * x[2i + 1]) (interleaved, GPT-J), c = cos[p, i], s = sin[p, i]:
 *     y1 = x1 c - x2 s,   y2 = x1 s + x2 c,
 * the other features are copied. Rounding: for a float32 computation
 * (float32 / float16 / bfloat16 storage; x, cos, sin float32 values) y is the
 * exactly rounded value of the true result in the storage dtype: the
 * products are exact in double, their sum is rounded to odd (TwoSum), and
 * rounding a round-to-odd value to a format at least 2 bits narrower is
 * the correct rounding (one rounding in effect: a plain double sum, then
 * float32, then 16 bits would round up to three times). For float64 each
 * product and the sum round once in float64: NumPy's `x1 * c - x2 * s` in
 * float64 bit for bit (no FMA: -ffp-contract=off).
 */
#ifndef PYATTN_OPS_ROTARY_H
#define PYATTN_OPS_ROTARY_H

#include "ops.h"

typedef struct {
    const char *cos, *sin;          /* (R, half) tables stored as dt */
    pa_ssize R, half;
    pa_ssize cst[2], sst[2];        /* element strides: row, column */
    int dt;                         /* PA_F32 or PA_F64: the tables' and the computation's */
    int interleaved;
} pa_rope;

/* y (E features, stored as ydt, element stride ys) = the rotation of x
 * (stored as xdt, stride xs) at position pos, 0 <= pos < r->R and
 * 2 * r->half <= E (the caller checked both). With r->dt == PA_F64, x and y
 * are float64; with PA_F32, each of them float32, float16 or bfloat16. x and
 * y must not overlap. */
void pa_rope_row(const pa_rope *r, pa_ssize pos, const void *x, int xdt, pa_ssize xs, void *y, int ydt,
                 pa_ssize ys, pa_ssize E);

/* float32 -> float16 bits, rounded to nearest even (NumPy's astype). */
uint16_t pa_f32_to_f16(float f);

#endif
