/*
 * simd_avx512emu.h -- the AVX-512 vocabulary's widths (16 floats / 8
 * doubles) over pairs of AVX2 registers, for testing the AVX-512 bodies on
 * CPUs without AVX-512 (PYATTN_ISA=avx512emu). Every operation is the
 * simd_avx2.h operation on each half, lane for lane, with the same
 * single-rounding FMA: this build computes exactly what the real one
 * computes, bit for bit. Slow (the 48 live halves of the 12x32 GEMM tile
 * spill); tests only.
 */
#ifndef PYATTN_SIMD_AVX512EMU_H
#define PYATTN_SIMD_AVX512EMU_H

#include "simd_avx2.h"

typedef struct { __m256 lo, hi; } pa_emu_v_f32, pa_emu_m_f32;
typedef struct { __m256d lo, hi; } pa_emu_v_f64, pa_emu_m_f64;
enum { pa_emu_lanes_f32 = 16, pa_emu_lanes_f64 = 8 };

/* pa_emu_<op>_<DT>: pa_avx2_<op>_<DT> on each half (V: the pair type) */
#define PA_EMU1(op, DT, V) \
    PA_AVX2_FN V pa_emu_##op##_##DT(V a) { return (V){pa_avx2_##op##_##DT(a.lo), pa_avx2_##op##_##DT(a.hi)}; }
#define PA_EMU2(op, DT, V) \
    PA_AVX2_FN V pa_emu_##op##_##DT(V a, V b) \
    { return (V){pa_avx2_##op##_##DT(a.lo, b.lo), pa_avx2_##op##_##DT(a.hi, b.hi)}; }
#define PA_EMU3(op, DT, V) \
    PA_AVX2_FN V pa_emu_##op##_##DT(V a, V b, V c) \
    { return (V){pa_avx2_##op##_##DT(a.lo, b.lo, c.lo), pa_avx2_##op##_##DT(a.hi, b.hi, c.hi)}; }
#define PA_EMU_OPS(DT, T, V, HL)                                                                 \
    PA_AVX2_FN V pa_emu_load_##DT(const T *p) { return (V){pa_avx2_load_##DT(p), pa_avx2_load_##DT(p + HL)}; } \
    PA_AVX2_FN void pa_emu_store_##DT(T *p, V x) { pa_avx2_store_##DT(p, x.lo); pa_avx2_store_##DT(p + HL, x.hi); } \
    PA_AVX2_FN V pa_emu_set1_##DT(T x) { return (V){pa_avx2_set1_##DT(x), pa_avx2_set1_##DT(x)}; } \
    PA_AVX2_FN V pa_emu_zero_##DT(void) { return (V){pa_avx2_zero_##DT(), pa_avx2_zero_##DT()}; } \
    PA_AVX2_FN V pa_emu_bcast_##DT(const T *p) { return pa_emu_set1_##DT(*p); }                \
    PA_EMU2(add, DT, V) PA_EMU2(sub, DT, V) PA_EMU2(mul, DT, V) PA_EMU2(max, DT, V)              \
    PA_EMU2(div, DT, V)                                                                          \
    PA_EMU3(fma, DT, V) PA_EMU3(fnma, DT, V) PA_EMU2(lt, DT, V) PA_EMU2(eq, DT, V)               \
    PA_EMU2(zero_where, DT, V) PA_EMU1(pow2i, DT, V)

PA_EMU_OPS(f32, float, pa_emu_v_f32, 8)
PA_AVX2_FN float pa_emu_hsum16_f32(const pa_emu_v_f32 *a)
{
    return pa_avx2_hsum8_tail_f32(_mm256_add_ps(a[0].lo, a[0].hi));
}
PA_AVX2_FN double pa_emu_hsum16_f64(const pa_emu_v_f64 *a)
{
    const __m256d s8lo = _mm256_add_pd(a[0].lo, a[1].lo), s8hi = _mm256_add_pd(a[0].hi, a[1].hi);
    return pa_avx2_hsum4_tail_f64(_mm256_add_pd(s8lo, s8hi));
}
PA_AVX2_FN pa_emu_v_f32 pa_emu_widen_f16_f32(const uint16_t *p)
{
    return (pa_emu_v_f32){pa_avx2_widen_f16_f32(p), pa_avx2_widen_f16_f32(p + 8)};
}
PA_AVX2_FN pa_emu_v_f32 pa_emu_widen_bf16_f32(const uint16_t *p)
{
    return (pa_emu_v_f32){pa_avx2_widen_bf16_f32(p), pa_avx2_widen_bf16_f32(p + 8)};
}
PA_AVX2_FN pa_emu_v_f32 pa_emu_widen_i8_f32(const int8_t *p)
{
    return (pa_emu_v_f32){pa_avx2_widen_i8_f32(p), pa_avx2_widen_i8_f32(p + 8)};
}
PA_AVX2_FN pa_emu_v_f32 pa_emu_widen_i4_f32(const uint8_t *p)
{
    return (pa_emu_v_f32){pa_avx2_widen_i4_f32(p), pa_avx2_widen_i4_f32(p + 4)};
}
PA_EMU_OPS(f64, double, pa_emu_v_f64, 4)
/* softmax piece sums: the two halves, low first (simd_avx512.h) */
typedef __m256 pa_emu_p_f32;
typedef __m256d pa_emu_p_f64;
PA_AVX2_FN __m256 pa_emu_pzero_f32(void) { return _mm256_setzero_ps(); }
PA_AVX2_FN __m256 pa_emu_padd_f32(__m256 s, pa_emu_v_f32 e) { return _mm256_add_ps(_mm256_add_ps(s, e.lo), e.hi); }
PA_AVX2_FN void pa_emu_pstore_f32(float *p, __m256 s) { _mm256_storeu_ps(p, s); }
PA_AVX2_FN __m256d pa_emu_pzero_f64(void) { return _mm256_setzero_pd(); }
PA_AVX2_FN __m256d pa_emu_padd_f64(__m256d s, pa_emu_v_f64 e) { return _mm256_add_pd(_mm256_add_pd(s, e.lo), e.hi); }
PA_AVX2_FN void pa_emu_pstore_f64(double *p, __m256d s) { _mm256_storeu_pd(p, s); }
#undef PA_EMU1
#undef PA_EMU2
#undef PA_EMU3
#undef PA_EMU_OPS

#endif
