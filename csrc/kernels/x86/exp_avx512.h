/*
 * exp_avx512.h -- the vectorised exp of exp_avx2.h at 16 floats / 8 doubles
 * per vector (AVX-512F), for the AVX-512 tile step.
 *
 * Operation for operation the same as pa_exp8_nonpos / pa_exp4_nonpos (the
 * method, the constants and the rounding are described there): the same IEEE
 * operations on each lane in the same order, so every lane's result has the
 * same bits as the AVX2 version's. Only the lane masks differ in form: a
 * compare gives a mask register, and the zeroing of dead lanes is a masked
 * move instead of an and-not.
 */
#ifndef PYATTN_EXP_AVX512_H
#define PYATTN_EXP_AVX512_H

#include <immintrin.h>

#define PA_AVX512_FN __attribute__((target("avx512f")))

PA_AVX512_FN static inline __m512 pa_exp16_nonpos(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.33654475f);            /* ln(FLT_MIN) */
    const __mmask16 dead = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ); /* false for NaN */
    const __m512 xc = _mm512_max_ps(lo, x);                      /* NaN flows through */
    const __m512 magic = _mm512_set1_ps(12583039.0f);
    const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~dead, y);
}

PA_AVX512_FN static inline __m512d pa_exp8d_nonpos(__m512d x)
{
    const __m512d lo = _mm512_set1_pd(-708.3964185322641);       /* ln(DBL_MIN) */
    const __mmask8 dead = _mm512_cmp_pd_mask(x, lo, _CMP_LT_OQ);  /* false for NaN */
    const __m512d xc = _mm512_max_pd(lo, x);                     /* NaN flows through */
    const __m512d magic = _mm512_set1_pd(6755399441056767.0);
    const __m512d t = _mm512_fmadd_pd(xc, _mm512_set1_pd(1.4426950408889634074), magic);
    const __m512d n = _mm512_sub_pd(t, magic);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0.693145751953125), xc);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.428606820309417232e-6), r);
    __m512d y = _mm512_set1_pd(1.0 / 6227020800.0);                 /* 1/13! */
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 479001600.0));   /* 1/12! */
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 39916800.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 3628800.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 362880.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 40320.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 5040.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 720.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 120.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 24.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(1.0 / 6.0));
    y = _mm512_fmadd_pd(y, r, _mm512_set1_pd(0.5));
    y = _mm512_fmadd_pd(y, _mm512_mul_pd(r, r), _mm512_add_pd(r, _mm512_set1_pd(1.0)));
    const __m512i e = _mm512_slli_epi64(_mm512_castpd_si512(t), 52);
    y = _mm512_mul_pd(y, _mm512_castsi512_pd(e));
    return _mm512_maskz_mov_pd((__mmask8)~dead, y);
}

#endif
