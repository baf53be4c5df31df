/*
 * exp_avx2.h -- vectorised exp of non-positive arguments (AVX2+FMA), for the
 * softmax kernels: the arguments there are s - max <= 0.
 *
 * exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 with ln 2 split in
 * a high part (few significant bits, so n * high is exact) and a low
 * correction; |r| <= ln(2) / 2.
 *   float32: p = 1 + r + r^2 q(r), q of degree 5 (the Cephes expf
 *            coefficients): within a few ULP of expf.
 *   float64: p = the degree-13 Taylor polynomial of e^r (coefficients 1/k!),
 *            truncation below 5e-18 on |r| <= 0.347: within a few ULP of exp.
 * Below the smallest normal result (x < -87.34 for float, -708.39 for double,
 * -inf included) the result is exactly 0, at most a subnormal away from
 * exp(x). NaN stays NaN. No fast-math: each operation is IEEE.
 */
#ifndef PYATTN_EXP_AVX2_H
#define PYATTN_EXP_AVX2_H

#include <immintrin.h>

#define PA_AVX2_FN __attribute__((target("avx2,fma")))

PA_AVX2_FN static inline __m256 pa_exp8_nonpos(__m256 x)
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

PA_AVX2_FN static inline __m256d pa_exp4_nonpos(__m256d x)
{
    const __m256d lo = _mm256_set1_pd(-708.3964185322641);   /* ln(DBL_MIN) */
    __m256d dead = _mm256_cmp_pd(x, lo, _CMP_LT_OQ);         /* false for NaN */
    __m256d nan = _mm256_cmp_pd(x, x, _CMP_UNORD_Q);
    __m256d xc = _mm256_max_pd(x, lo);
    __m256d n = _mm256_round_pd(_mm256_mul_pd(xc, _mm256_set1_pd(1.4426950408889634074)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln 2 = 0.693145751953125 (exact, 18 bits) + 1.428606820309417232e-6 */
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0.693145751953125), xc);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.428606820309417232e-6), r);
    __m256d y = _mm256_set1_pd(1.0 / 6227020800.0);                 /* 1/13! */
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 479001600.0));   /* 1/12! */
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 39916800.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 3628800.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 362880.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 40320.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 5040.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 720.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 120.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 24.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(1.0 / 6.0));
    y = _mm256_fmadd_pd(y, r, _mm256_set1_pd(0.5));
    y = _mm256_fmadd_pd(y, _mm256_mul_pd(r, r), _mm256_add_pd(r, _mm256_set1_pd(1.0)));
    /* 2^n: n is integral in [-1022, 0]; adding 1.5 * 2^52 puts it, as a
     * 64-bit integer, in the low bits of the sum */
    const __m256d magic = _mm256_set1_pd(6755399441055744.0);
    __m256i ni = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(n, magic)),
                                  _mm256_castpd_si256(magic));
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52);
    y = _mm256_mul_pd(y, _mm256_castsi256_pd(e));
    y = _mm256_andnot_pd(dead, y);
    return _mm256_blendv_pd(y, x, nan);
}

#endif
