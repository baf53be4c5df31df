/* quant_ref.h -- one value of a quantized row (ops/quant.h's storage): int8,
 * or int4 two per byte (value e in byte e / 2, the even one in the low
 * nibble, two's complement), or fp8 (float8_e4m3fn / float8_e5m2 bytes:
 * pa_fp8_value). Shared by the portable quantized kernels, the SIMD
 * bodies' scalar ends and the frame (ops/quant.h). */
#ifndef PYATTN_QUANT_REF_H
#define PYATTN_QUANT_REF_H

#include "pyattn.h"

static inline int pa_qval(const void *row, pa_ssize e, int bits)
{
    if (bits == 8) return ((const int8_t *)row)[e];
    const unsigned b = ((const uint8_t *)row)[e >> 1];
    const unsigned nib = (e & 1) ? b >> 4 : b & 0xfu;
    return (int)nib - (int)((nib & 8u) << 1);
}

/* the fp8 formats' codes where "bits" are passed (pa_qbits) */
enum { PA_QF8E4 = 1, PA_QF8E5 = 2 };
/* 1 for the fp8 codes (of the quantized kernels only qwiden takes them:
 * the frame widens fp8 tiles, then the float32 kernels read them) */
static inline int pa_qfp8(int bits) { return bits == PA_QF8E4 || bits == PA_QF8E5; }
/* The value of fp8 byte b (format bits), exactly, with integer operations,
 * one int -> float conversion and selects by masks, so that loops over it
 * vectorise (a table would be a gather). e4m3fn: exponent
 * field e = u >> 3 and mantissa m of u = b & 0x7f; a normal's float32 bits
 * are (u << 20) + (120 << 23) (e - 7 + 127, m at the top), a subnormal is
 * u * 2^-9, 0x7f NaN. e5m2 (the high byte of a float16): (u << 21) +
 * (112 << 23), subnormals u * 2^-16, exponent field 31 inf / NaN. The NaNs
 * as ml_dtypes widens them (0x7fc00000, signed). tests/test_fp8.py checks
 * every byte against ml_dtypes. */
static inline float pa_fp8_value(uint32_t b, int bits)
{
    const uint32_t sign = (b & 0x80u) << 24, u = b & 0x7fu;
    const int e4 = bits == PA_QF8E4;
    const uint32_t nrm = e4 ? (u << 20) + (120u << 23) : (u << 21) + (112u << 23);
    const uint32_t sub = pa_f32_bits((float)(int32_t)u * (e4 ? 0x1p-9f : 0x1p-16f));
    const uint32_t mn = 0u - (uint32_t)(u >= (e4 ? 8u : 4u));            /* all ones: a normal */
    const uint32_t spec = e4 ? 0x7fc00000u : u == 0x7cu ? 0x7f800000u : 0x7fc00000u;
    const uint32_t ms = 0u - (uint32_t)(e4 ? u == 0x7fu : u >= 0x7cu);   /* all ones: NaN / inf */
    const uint32_t r = (((nrm & mn) | (sub & ~mn)) & ~ms) | (spec & ms);
    return pa_bits_f32(r | sign);
}

#endif
