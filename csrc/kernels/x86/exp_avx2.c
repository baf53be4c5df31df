/*
 * exp_avx2.c -- the online-softmax tile steps of the flash kernel (AVX2+FMA),
 * float32 (8 query columns per vector) and float64 (4), on the vectorised
 * exp of exp_avx2.h.
 */
#include <math.h>
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "exp_avx2.h"

/* The online-softmax tile step (pa_tilesm_float in dispatch.h), 8 query
 * columns per vector: everything is vertical, no horizontal reductions.
 * _mm256_max_ps returns its second operand when either is NaN, so a NaN
 * score never becomes the max (as the scalar `if (x > m) m = x`). */
PA_AVX2_FN
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

/* the same step on doubles, 4 query columns per vector */
PA_AVX2_FN
void pa_tilesm_f64_avx2(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        double *m, double *l, double *alpha)
{
    const __m256d ninf = _mm256_set1_pd(-INFINITY);
    pa_ssize c = 0;
    for (; c + 4 <= ncols; c += 4) {
        __m256d mt = ninf;
        for (pa_ssize j = 0; j < nj; j++) mt = _mm256_max_pd(_mm256_loadu_pd(St + j * ld + c), mt);
        const __m256d mold = _mm256_loadu_pd(m + c);
        const __m256d mnew = _mm256_max_pd(mt, mold);
        const __m256d msafe = _mm256_andnot_pd(_mm256_cmp_pd(mnew, ninf, _CMP_EQ_OQ), mnew);
        const __m256d al = pa_exp4_nonpos(_mm256_sub_pd(mold, msafe));
        __m256d sum = _mm256_setzero_pd();
        for (pa_ssize j = 0; j < nj; j++) {
            double *x = St + j * ld + c;
            const __m256d e = pa_exp4_nonpos(_mm256_sub_pd(_mm256_loadu_pd(x), msafe));
            _mm256_storeu_pd(x, e);
            sum = _mm256_add_pd(sum, e);
        }
        _mm256_storeu_pd(alpha + c, al);
        _mm256_storeu_pd(l + c, _mm256_fmadd_pd(_mm256_loadu_pd(l + c), al, sum));
        _mm256_storeu_pd(m + c, mnew);
    }
    if (c < ncols) pa_tilesm_f64_ref(St + c, nj, ncols - c, ld, m + c, l + c, alpha + c);
}

#else
void pa_tilesm_f32_avx2(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        float *m, float *l, float *alpha)
{
    pa_tilesm_f32_ref(St, nj, ncols, ld, m, l, alpha);
}

void pa_tilesm_f64_avx2(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        double *m, double *l, double *alpha)
{
    pa_tilesm_f64_ref(St, nj, ncols, ld, m, l, alpha);
}
#endif
