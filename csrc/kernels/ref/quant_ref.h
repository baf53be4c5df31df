/* quant_ref.h -- one value of a quantized row (ops/quant.h's storage): int8,
 * or int4 two per byte (value e in byte e / 2, the even one in the low
 * nibble, two's complement). Shared by the portable quantized kernels and
 * the SIMD bodies' scalar ends. */
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

#endif
