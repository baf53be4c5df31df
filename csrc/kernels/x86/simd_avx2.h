/*
 * simd_avx2.h -- the vector vocabulary (kernels/vec/family_vec.inc) on
 * AVX2+FMA: 8 floats / 4 doubles per vector; lane masks are vectors whose
 * true lanes are all ones. Every function carries the AVX2+FMA(+F16C) target, so
 * this file (like every x86 kernel file) builds with the baseline flags.
 */
#ifndef PYATTN_SIMD_AVX2_H
#define PYATTN_SIMD_AVX2_H

#include <immintrin.h>

#define PA_AVX2_FN __attribute__((target("avx2,fma,f16c"))) static inline

typedef __m256 pa_avx2_v_f32, pa_avx2_m_f32;
typedef __m256d pa_avx2_v_f64, pa_avx2_m_f64;
enum { pa_avx2_lanes_f32 = 8, pa_avx2_lanes_f64 = 4 };

PA_AVX2_FN __m256 pa_avx2_load_f32(const float *p) { return _mm256_loadu_ps(p); }
PA_AVX2_FN void pa_avx2_store_f32(float *p, __m256 x) { _mm256_storeu_ps(p, x); }
PA_AVX2_FN __m256 pa_avx2_set1_f32(float x) { return _mm256_set1_ps(x); }
PA_AVX2_FN __m256 pa_avx2_zero_f32(void) { return _mm256_setzero_ps(); }
PA_AVX2_FN __m256 pa_avx2_bcast_f32(const float *p) { return _mm256_broadcast_ss(p); }
PA_AVX2_FN __m256 pa_avx2_add_f32(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
PA_AVX2_FN __m256 pa_avx2_sub_f32(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
PA_AVX2_FN __m256 pa_avx2_mul_f32(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
PA_AVX2_FN __m256 pa_avx2_div_f32(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
PA_AVX2_FN __m256 pa_avx2_max_f32(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
PA_AVX2_FN __m256 pa_avx2_fma_f32(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
PA_AVX2_FN __m256 pa_avx2_fnma_f32(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
PA_AVX2_FN __m256 pa_avx2_lt_f32(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
PA_AVX2_FN __m256 pa_avx2_eq_f32(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
PA_AVX2_FN __m256 pa_avx2_zero_where_f32(__m256 m, __m256 y) { return _mm256_andnot_ps(m, y); }
PA_AVX2_FN __m256 pa_avx2_pow2i_f32(__m256 t)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
}

/* 8 float16 / bfloat16 values to floats, exactly (F16C vcvtph2ps; a 16-bit shift) */
PA_AVX2_FN __m256 pa_avx2_widen_f16_f32(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
PA_AVX2_FN __m256 pa_avx2_widen_bf16_f32(const uint16_t *p)
{
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
/* 8 int8 / int4 values (a quantized cache's, kernels/ref/quant_ref.h) as
 * floats, exactly: int4 from 4 bytes, each byte twice, shifted so that its
 * nibble is the top one, then an arithmetic shift back (sign extension) */
PA_AVX2_FN __m256 pa_avx2_widen_i8_f32(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* 8 fp8 bytes at p as floats, exactly: kernels/ref/quant_ref.h's
 * pa_fp8_value, step by step (as simd_avx512.h's pa_avx512_fp8s_f32): the
 * vectors pa_avx2_fp8_f32 does not take */
__attribute__((always_inline)) PA_AVX2_FN __m256 pa_avx2_fp8s_f32(const uint8_t *p, int e4)
{
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i u = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    const __m256i nrm = e4 ? _mm256_add_epi32(_mm256_slli_epi32(u, 20), _mm256_set1_epi32(120 << 23))
                           : _mm256_add_epi32(_mm256_slli_epi32(u, 21), _mm256_set1_epi32(112 << 23));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(u), _mm256_set1_ps(e4 ? 0x1p-9f : 0x1p-16f));
    const __m256i isn = _mm256_cmpgt_epi32(u, _mm256_set1_epi32(e4 ? 7 : 3));
    __m256i r = _mm256_blendv_epi8(_mm256_castps_si256(sub), nrm, isn);
    if (e4) {
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(u, _mm256_set1_epi32(0x7f)));
    } else {
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), _mm256_cmpgt_epi32(u, _mm256_set1_epi32(0x7b)));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7f800000), _mm256_cmpeq_epi32(u, _mm256_set1_epi32(0x7c)));
    }
    return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}
/* 8 fp8 bytes at p as floats, exactly: normals by their bits, other
 * vectors step by step (as simd_avx512.h's pa_avx512_fp8_f32) */
PA_AVX2_FN __m256 pa_avx2_fp8_f32(const uint8_t *p, int e4)
{
    const __m256i sx = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i y = e4 ? _mm256_and_si256(_mm256_slli_epi32(sx, 20), _mm256_set1_epi32((int)0x87f00000u))
                         : _mm256_and_si256(_mm256_slli_epi32(sx, 21), _mm256_set1_epi32((int)0x8fe00000u));
    const __m256i ex = _mm256_set1_epi32(e4 ? 0x07800000 : 0x0f800000);
    const __m256i sp = _mm256_set1_epi32(e4 ? 0x07f00000 : 0x0f800000);
    const __m256i odd = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(y, ex), _mm256_setzero_si256()),
                                        _mm256_cmpeq_epi32(_mm256_and_si256(y, sp), sp));
    if (!_mm256_testz_si256(odd, odd)) return pa_avx2_fp8s_f32(p, e4);
    return _mm256_castsi256_ps(_mm256_add_epi32(y, _mm256_set1_epi32(e4 ? 120 << 23 : 112 << 23)));
}
/* 8 fp8 bytes at p that are all normals as floats (as simd_avx512.h's
 * pa_avx512_fp8n_f32) */
PA_AVX2_FN __m256 pa_avx2_fp8n_f32(const uint8_t *p, int e4)
{
    const __m256i sx = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i y = e4 ? _mm256_and_si256(_mm256_slli_epi32(sx, 20), _mm256_set1_epi32((int)0x87f00000u))
                         : _mm256_and_si256(_mm256_slli_epi32(sx, 21), _mm256_set1_epi32((int)0x8fe00000u));
    return _mm256_castsi256_ps(_mm256_add_epi32(y, _mm256_set1_epi32(e4 ? 120 << 23 : 112 << 23)));
}
#define PA_FP8_avx2 1      /* quant_vec.inc: this vocabulary has vfp8 */
PA_AVX2_FN __m256 pa_avx2_widen_i4_f32(const uint8_t *p)
{
    int32_t w;
    __builtin_memcpy(&w, p, 4);
    const __m128i b = _mm_cvtsi32_si128(w);
    const __m256i x = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    const __m256i sh = _mm256_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24);
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sllv_epi32(x, sh), 28));
}

/* The 16-partial sum of the decode kernels (vocab.h, vhsum16): a[0..NV)
 * hold partials p[0..15]; p[l] + p[l + 8], then + 4, + 2, + 1. */
PA_AVX2_FN float pa_avx2_hsum8_tail_f32(__m256 s8)     /* from the p[l] + p[l + 8] step */
{
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
PA_AVX2_FN float pa_avx2_hsum16_f32(const __m256 *a) { return pa_avx2_hsum8_tail_f32(_mm256_add_ps(a[0], a[1])); }
PA_AVX2_FN double pa_avx2_hsum4_tail_f64(__m256d s4)   /* from the p[l] + p[l + 4] step */
{
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}
PA_AVX2_FN double pa_avx2_hsum16_f64(const __m256d *a)
{
    return pa_avx2_hsum4_tail_f64(_mm256_add_pd(_mm256_add_pd(a[0], a[2]), _mm256_add_pd(a[1], a[3])));
}

PA_AVX2_FN __m256d pa_avx2_load_f64(const double *p) { return _mm256_loadu_pd(p); }
PA_AVX2_FN void pa_avx2_store_f64(double *p, __m256d x) { _mm256_storeu_pd(p, x); }
PA_AVX2_FN __m256d pa_avx2_set1_f64(double x) { return _mm256_set1_pd(x); }
PA_AVX2_FN __m256d pa_avx2_zero_f64(void) { return _mm256_setzero_pd(); }
PA_AVX2_FN __m256d pa_avx2_bcast_f64(const double *p) { return _mm256_broadcast_sd(p); }
PA_AVX2_FN __m256d pa_avx2_add_f64(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
PA_AVX2_FN __m256d pa_avx2_sub_f64(__m256d a, __m256d b) { return _mm256_sub_pd(a, b); }
PA_AVX2_FN __m256d pa_avx2_mul_f64(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
PA_AVX2_FN __m256d pa_avx2_div_f64(__m256d a, __m256d b) { return _mm256_div_pd(a, b); }
PA_AVX2_FN __m256d pa_avx2_max_f64(__m256d a, __m256d b) { return _mm256_max_pd(a, b); }
PA_AVX2_FN __m256d pa_avx2_fma_f64(__m256d a, __m256d b, __m256d c) { return _mm256_fmadd_pd(a, b, c); }
PA_AVX2_FN __m256d pa_avx2_fnma_f64(__m256d a, __m256d b, __m256d c) { return _mm256_fnmadd_pd(a, b, c); }
PA_AVX2_FN __m256d pa_avx2_lt_f64(__m256d a, __m256d b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
PA_AVX2_FN __m256d pa_avx2_eq_f64(__m256d a, __m256d b) { return _mm256_cmp_pd(a, b, _CMP_EQ_OQ); }
PA_AVX2_FN __m256d pa_avx2_zero_where_f64(__m256d m, __m256d y) { return _mm256_andnot_pd(m, y); }
PA_AVX2_FN __m256d pa_avx2_pow2i_f64(__m256d t)
{
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_castpd_si256(t), 52));
}

#endif
