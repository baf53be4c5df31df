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
    const __m256 lo = _mm256_set1_ps(-87.33654475f);      /* ln(FLT_MIN) */
    const __m256 dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  /* false for NaN */
    /* max returns its second operand when one is NaN: NaN flows through
     * every step below and comes out NaN */
    const __m256 xc = _mm256_max_ps(lo, x);
    /* t = x log2(e) + (1.5 * 2^23 + 127), rounded once: n = t - that is
     * round(x log2 e), and t's low mantissa bits hold n + 127, the biased
     * exponent of 2^n (n in [-126, 0]) */
    const __m256 magic = _mm256_set1_ps(12583039.0f);
    const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(dead, y);
}

PA_AVX2_FN static inline __m256d pa_exp4_nonpos(__m256d x)
{
    const __m256d lo = _mm256_set1_pd(-708.3964185322641);   /* ln(DBL_MIN) */
    const __m256d dead = _mm256_cmp_pd(x, lo, _CMP_LT_OQ);   /* false for NaN */
    const __m256d xc = _mm256_max_pd(lo, x);                 /* NaN flows through */
    /* t = x log2(e) + (1.5 * 2^52 + 1023), rounded once: n = t - that, and
     * t's low mantissa bits hold n + 1023 (n in [-1022, 0]) */
    const __m256d magic = _mm256_set1_pd(6755399441056767.0);
    const __m256d t = _mm256_fmadd_pd(xc, _mm256_set1_pd(1.4426950408889634074), magic);
    const __m256d n = _mm256_sub_pd(t, magic);
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
    const __m256i e = _mm256_slli_epi64(_mm256_castpd_si256(t), 52);
    y = _mm256_mul_pd(y, _mm256_castsi256_pd(e));
    return _mm256_andnot_pd(dead, y);
}

#endif
