/*
 * exp_avx2.c -- vectorised exp for the softmax rows (AVX2+FMA, float32).
 *
 * exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 split in a
 * high part exact in float and a low correction), p a degree-6 polynomial
 * (Cephes expf coefficients), within a few ULP of expf on [-87.3, 0].
 * Inputs here are s - max <= 0: below -87.3 (including -inf) the result is
 * exactly 0 (it would be at most a subnormal); NaN stays NaN. No fast-math.
 */
#include <math.h>
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

__attribute__((target("avx2,fma")))
static inline __m256 pa_exp8_nonpos(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654475f);
    __m256 dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);        /* false for NaN */
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(dead, y);
    return _mm256_blendv_ps(y, x, nan);
}

/* The online-softmax tile step (pa_tilesm_float in dispatch.h), 8 query
 * columns per vector: everything is vertical, no horizontal reductions.
 * _mm256_max_ps returns its second operand when either is NaN, so a NaN
 * score never becomes the max (as the scalar `if (x > m) m = x`). */
__attribute__((target("avx2,fma")))
void pa_tilesm_f32_avx2(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        float *m, float *l, float *alpha)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    pa_ssize c = 0;
    for (; c + 8 <= ncols; c += 8) {
        __m256 mt = ninf;
        for (pa_ssize j = 0; j < nj; j++) mt = _mm256_max_ps(_mm256_loadu_ps(St + j * ld + c), mt);
        const __m256 mold = _mm256_loadu_ps(m + c);
        const __m256 mnew = _mm256_max_ps(mt, mold);
        const __m256 msafe = _mm256_andnot_ps(_mm256_cmp_ps(mnew, ninf, _CMP_EQ_OQ), mnew);
        const __m256 al = pa_exp8_nonpos(_mm256_sub_ps(mold, msafe));
        __m256 sum = _mm256_setzero_ps();
        for (pa_ssize j = 0; j < nj; j++) {
            float *x = St + j * ld + c;
            const __m256 e = pa_exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x), msafe));
            _mm256_storeu_ps(x, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_storeu_ps(alpha + c, al);
        _mm256_storeu_ps(l + c, _mm256_fmadd_ps(_mm256_loadu_ps(l + c), al, sum));
        _mm256_storeu_ps(m + c, mnew);
    }
    if (c < ncols) pa_tilesm_f32_ref(St + c, nj, ncols - c, ld, m + c, l + c, alpha + c);
}

#else
void pa_tilesm_f32_avx2(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        float *m, float *l, float *alpha)
{
    pa_tilesm_f32_ref(St, nj, ncols, ld, m, l, alpha);
}
#endif
