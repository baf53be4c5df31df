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

__attribute__((target("avx2,fma")))
float pa_exprow_f32_avx2(float *s, pa_ssize n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    pa_ssize j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = pa_exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) {                      /* tail through a padded buffer */
        float buf[8];
        int t = (int)(n - j);
        for (int i = 0; i < 8; i++) buf[i] = i < t ? s[j + i] : -INFINITY;
        __m256 e = pa_exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(buf), vm));
        _mm256_storeu_ps(buf, e);
        acc = _mm256_add_ps(acc, e);
        for (int i = 0; i < t; i++) s[j + i] = buf[i];
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* max ignoring NaN: _mm256_max_ps returns its second operand when either
 * is NaN, so a NaN input never replaces the running max */
__attribute__((target("avx2,fma")))
float pa_rowmax_f32_avx2(const float *s, pa_ssize n)
{
    __m256 acc = _mm256_set1_ps(-INFINITY);
    pa_ssize j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_max_ps(_mm256_loadu_ps(s + j), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float m = -INFINITY;
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

#else
float pa_rowmax_f32_avx2(const float *s, pa_ssize n) { return pa_rowmax_f32_ref(s, n); }
float pa_exprow_f32_avx2(float *s, pa_ssize n, float m) { return pa_exprow_f32_ref(s, n, m); }
#endif
