/*
 * simd_avx512.h -- the vector vocabulary (kernels/vec/family_vec.inc) on
 * AVX-512F: 16 floats / 8 doubles per vector; lane masks are mask
 * registers, and dead lanes are zeroed by a masked move. The same IEEE
 * operation per lane as simd_avx2.h, so the bodies give the same bits.
 */
#ifndef PYATTN_SIMD_AVX512_H
#define PYATTN_SIMD_AVX512_H

#include <immintrin.h>

#define PA_AVX512_FN __attribute__((target("avx512f,fma"))) static inline

typedef __m512 pa_avx512_v_f32;
typedef __mmask16 pa_avx512_m_f32;
typedef __m512d pa_avx512_v_f64;
typedef __mmask8 pa_avx512_m_f64;
enum { pa_avx512_lanes_f32 = 16, pa_avx512_lanes_f64 = 8 };

PA_AVX512_FN __m512 pa_avx512_load_f32(const float *p) { return _mm512_loadu_ps(p); }
PA_AVX512_FN void pa_avx512_store_f32(float *p, __m512 x) { _mm512_storeu_ps(p, x); }
PA_AVX512_FN __m512 pa_avx512_set1_f32(float x) { return _mm512_set1_ps(x); }
PA_AVX512_FN __m512 pa_avx512_zero_f32(void) { return _mm512_setzero_ps(); }
PA_AVX512_FN __m512 pa_avx512_bcast_f32(const float *p) { return _mm512_set1_ps(*p); }
/* The 16-partial sum of the decode kernels (vocab.h, vhsum16): p[l] +
 * p[l + 8], then + 4, + 2, + 1 (the tails of simd_avx2.h) */
PA_AVX512_FN float pa_avx512_hsum16_f32(const __m512 *a)
{
    const __m256 lo = _mm512_castps512_ps256(a[0]);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
PA_AVX512_FN double pa_avx512_hsum16_f64(const __m512d *a)
{
    const __m512d s8 = _mm512_add_pd(a[0], a[1]);
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

/* Softmax piece sums (kernels/vec/softmax_vec.inc, PA_WITH_SOFTMAX 2): a
 * vector holds two 32-byte pieces; vpadd adds them to the piece sums in
 * order, the low piece first, as a family with 32-byte vectors does. */
typedef __m256 pa_avx512_p_f32;
typedef __m256d pa_avx512_p_f64;
PA_AVX512_FN __m256 pa_avx512_pzero_f32(void) { return _mm256_setzero_ps(); }
PA_AVX512_FN __m256 pa_avx512_padd_f32(__m256 s, __m512 e)
{
    s = _mm256_add_ps(s, _mm512_castps512_ps256(e));
    return _mm256_add_ps(s, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
}
PA_AVX512_FN void pa_avx512_pstore_f32(float *p, __m256 s) { _mm256_storeu_ps(p, s); }
PA_AVX512_FN __m256d pa_avx512_pzero_f64(void) { return _mm256_setzero_pd(); }
PA_AVX512_FN __m256d pa_avx512_padd_f64(__m256d s, __m512d e)
{
    s = _mm256_add_pd(s, _mm512_castpd512_pd256(e));
    return _mm256_add_pd(s, _mm512_extractf64x4_pd(e, 1));
}
PA_AVX512_FN void pa_avx512_pstore_f64(double *p, __m256d s) { _mm256_storeu_pd(p, s); }

/* 16 float16 / bfloat16 values to floats, exactly */
PA_AVX512_FN __m512 pa_avx512_widen_f16_f32(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
PA_AVX512_FN __m512 pa_avx512_widen_bf16_f32(const uint16_t *p)
{
    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
/* 16 int8 / int4 values as floats, exactly (as simd_avx2.h's) */
PA_AVX512_FN __m512 pa_avx512_widen_i8_f32(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
PA_AVX512_FN __m512 pa_avx512_widen_i4_f32(const uint8_t *p)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    const __m512i x = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    const __m512i sh = _mm512_set4_epi32(24, 28, 24, 28);      /* lanes 28, 24, 28, 24, ... */
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(x, sh), 28));
}
/* 16 fp8 bytes at p as floats, exactly: kernels/ref/quant_ref.h's
 * pa_fp8_value, step by step (bits of normals, subnormals as u * 2^-k, the
 * NaN / inf codes, the sign ORed in): pa_avx512_fp8_f32's lanes that are
 * not plain normals */
__attribute__((always_inline)) PA_AVX512_FN __m512 pa_avx512_fp8s_f32(const uint8_t *p, int e4)
{
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i u = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    const __m512i nrm = e4 ? _mm512_add_epi32(_mm512_slli_epi32(u, 20), _mm512_set1_epi32(120 << 23))
                           : _mm512_add_epi32(_mm512_slli_epi32(u, 21), _mm512_set1_epi32(112 << 23));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(u), _mm512_set1_ps(e4 ? 0x1p-9f : 0x1p-16f));
    __m512i r = _mm512_mask_mov_epi32(_mm512_castps_si512(sub),
                                      _mm512_cmpge_epi32_mask(u, _mm512_set1_epi32(e4 ? 8 : 4)), nrm);
    if (e4) {
        r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(u, _mm512_set1_epi32(0x7f)),
                                  _mm512_set1_epi32(0x7fc00000));
    } else {
        r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epi32_mask(u, _mm512_set1_epi32(0x7c)),
                                  _mm512_set1_epi32(0x7fc00000));
        r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(u, _mm512_set1_epi32(0x7c)),
                                  _mm512_set1_epi32(0x7f800000));
    }
    return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}
/* 16 fp8 bytes at p as floats, exactly (pa_fp8_value's values): the byte
 * sign-extended, shifted so that its exponent and mantissa sit at the top of
 * float32's (e4m3fn: << 20, e5m2: << 21) and the sign at bit 31, then the
 * difference of the exponent biases added -- a normal's bits; a vector with
 * an exponent field of 0 (zero, subnormals) or all ones (e5m2's inf / NaN,
 * e4m3fn's 0x7f NaN: checked on the whole code) takes the step-by-step
 * conversion (pa_avx512_fp8s_f32) */
PA_AVX512_FN __m512 pa_avx512_fp8_f32(const uint8_t *p, int e4)
{
    const __m512i sx = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i y = e4 ? _mm512_and_si512(_mm512_slli_epi32(sx, 20), _mm512_set1_epi32((int)0x87f00000u))
                         : _mm512_and_si512(_mm512_slli_epi32(sx, 21), _mm512_set1_epi32((int)0x8fe00000u));
    const __m512i ex = _mm512_set1_epi32(e4 ? 0x07800000 : 0x0f800000);        /* the exponent field */
    const __m512i sp = _mm512_set1_epi32(e4 ? 0x07f00000 : 0x0f800000);        /* the special codes */
    const __mmask16 odd = _mm512_kor(_mm512_testn_epi32_mask(y, ex),
                                     _mm512_cmpeq_epi32_mask(_mm512_and_si512(y, sp), sp));
    if (odd) return pa_avx512_fp8s_f32(p, e4);
    return _mm512_castsi512_ps(_mm512_add_epi32(y, _mm512_set1_epi32(e4 ? 120 << 23 : 112 << 23)));
}
/* 16 fp8 bytes at p that are all normals (no zero, subnormal, inf or NaN:
 * quant_vec.inc's qwiden checks a row first) as floats: their bits */
PA_AVX512_FN __m512 pa_avx512_fp8n_f32(const uint8_t *p, int e4)
{
    const __m512i sx = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i y = e4 ? _mm512_and_si512(_mm512_slli_epi32(sx, 20), _mm512_set1_epi32((int)0x87f00000u))
                         : _mm512_and_si512(_mm512_slli_epi32(sx, 21), _mm512_set1_epi32((int)0x8fe00000u));
    return _mm512_castsi512_ps(_mm512_add_epi32(y, _mm512_set1_epi32(e4 ? 120 << 23 : 112 << 23)));
}
#define PA_FP8_avx512 1    /* quant_vec.inc: this vocabulary has vfp8 */
PA_AVX512_FN __m512 pa_avx512_add_f32(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
PA_AVX512_FN __m512 pa_avx512_sub_f32(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
PA_AVX512_FN __m512 pa_avx512_mul_f32(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
PA_AVX512_FN __m512 pa_avx512_div_f32(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
PA_AVX512_FN __m512 pa_avx512_max_f32(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
PA_AVX512_FN __m512 pa_avx512_fma_f32(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
PA_AVX512_FN __m512 pa_avx512_fnma_f32(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
PA_AVX512_FN __mmask16 pa_avx512_lt_f32(__m512 a, __m512 b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
PA_AVX512_FN __mmask16 pa_avx512_eq_f32(__m512 a, __m512 b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
PA_AVX512_FN __m512 pa_avx512_zero_where_f32(__mmask16 m, __m512 y) { return _mm512_maskz_mov_ps((__mmask16)~m, y); }
PA_AVX512_FN __m512 pa_avx512_pow2i_f32(__m512 t)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(t), 23));
}

PA_AVX512_FN __m512d pa_avx512_load_f64(const double *p) { return _mm512_loadu_pd(p); }
PA_AVX512_FN void pa_avx512_store_f64(double *p, __m512d x) { _mm512_storeu_pd(p, x); }
PA_AVX512_FN __m512d pa_avx512_set1_f64(double x) { return _mm512_set1_pd(x); }
PA_AVX512_FN __m512d pa_avx512_zero_f64(void) { return _mm512_setzero_pd(); }
PA_AVX512_FN __m512d pa_avx512_bcast_f64(const double *p) { return _mm512_set1_pd(*p); }
PA_AVX512_FN __m512d pa_avx512_add_f64(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
PA_AVX512_FN __m512d pa_avx512_sub_f64(__m512d a, __m512d b) { return _mm512_sub_pd(a, b); }
PA_AVX512_FN __m512d pa_avx512_mul_f64(__m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
PA_AVX512_FN __m512d pa_avx512_div_f64(__m512d a, __m512d b) { return _mm512_div_pd(a, b); }
PA_AVX512_FN __m512d pa_avx512_max_f64(__m512d a, __m512d b) { return _mm512_max_pd(a, b); }
PA_AVX512_FN __m512d pa_avx512_fma_f64(__m512d a, __m512d b, __m512d c) { return _mm512_fmadd_pd(a, b, c); }
PA_AVX512_FN __m512d pa_avx512_fnma_f64(__m512d a, __m512d b, __m512d c) { return _mm512_fnmadd_pd(a, b, c); }
PA_AVX512_FN __mmask8 pa_avx512_lt_f64(__m512d a, __m512d b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
PA_AVX512_FN __mmask8 pa_avx512_eq_f64(__m512d a, __m512d b) { return _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ); }
PA_AVX512_FN __m512d pa_avx512_zero_where_f64(__mmask8 m, __m512d y) { return _mm512_maskz_mov_pd((__mmask8)~m, y); }
PA_AVX512_FN __m512d pa_avx512_pow2i_f64(__m512d t)
{
    return _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_castpd_si512(t), 52));
}

#endif
