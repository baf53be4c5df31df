/* tpack.h -- four float32 rows of unit column stride written as four
 * adjacent columns of a panel (element p of row i at dst[p * ld + i]),
 * optionally times a scale: the query-side packs of the tiled forward
 * (flash_init, Qs^T) and backward (bwd_panels, Qs^T and dO^T).
 *
 * On x86-64 (SSE2 is its baseline; the frame is built without -mavx) each
 * 4 x 4 block is one transpose: 4 vector loads and 4 vector stores where
 * the element loop does 16 strided stores. The multiply is the IEEE one
 * (mulps rounds each lane as mulss does), so the panel holds the bits of
 * the element loop; the k tail (n % 4) runs the element loop. Elsewhere
 * (aarch64, 32-bit x86 without SSE2) PA_TPACK_SIMD is 0 and the callers
 * keep their element loops. */
#ifndef PA_TPACK_H
#define PA_TPACK_H

#include "ops.h"

#if defined(__SSE2__) || defined(_M_X64)
#define PA_TPACK_SIMD 1
#include <emmintrin.h>

/* rows r0..r3 (n elements each) -> dst[p * ld + i], i = 0..3; scaled != 0:
 * each element times s (scaled a constant where it is called) */
static inline void pa_tpack4_f32(const float *r0, const float *r1, const float *r2, const float *r3,
                                 pa_ssize n, pa_ssize ld, float *dst, float s, const int scaled)
{
    const __m128 vs = _mm_set1_ps(s);
    pa_ssize p = 0;
    for (; p + 4 <= n; p += 4) {
        __m128 x0 = _mm_loadu_ps(r0 + p), x1 = _mm_loadu_ps(r1 + p);
        __m128 x2 = _mm_loadu_ps(r2 + p), x3 = _mm_loadu_ps(r3 + p);
        _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
        if (scaled) {
            x0 = _mm_mul_ps(x0, vs); x1 = _mm_mul_ps(x1, vs);
            x2 = _mm_mul_ps(x2, vs); x3 = _mm_mul_ps(x3, vs);
        }
        float *d = dst + p * ld;
        _mm_storeu_ps(d, x0);
        _mm_storeu_ps(d + ld, x1);
        _mm_storeu_ps(d + 2 * ld, x2);
        _mm_storeu_ps(d + 3 * ld, x3);
    }
    for (; p < n; p++) {
        float *d = dst + p * ld;
        if (scaled) {
            d[0] = r0[p] * s; d[1] = r1[p] * s; d[2] = r2[p] * s; d[3] = r3[p] * s;
        } else {
            d[0] = r0[p]; d[1] = r1[p]; d[2] = r2[p]; d[3] = r3[p];
        }
    }
}
#else
#define PA_TPACK_SIMD 0
#endif

#endif /* PA_TPACK_H */
