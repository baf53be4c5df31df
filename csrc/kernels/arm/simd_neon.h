/*
 * simd_neon.h -- the vector vocabulary (kernels/vec/family_vec.inc) on
 * AArch64 NEON (Advanced SIMD, baseline on every aarch64 CPU): 4 floats /
 * 2 doubles per vector; lane masks are all-ones lanes. Each operation is
 * the IEEE operation of simd_avx2.h lane for lane -- fused FMA, x86's
 * max rule spelled as a select -- so the bodies give the x86 families' bits.
 */
#ifndef PYATTN_SIMD_NEON_H
#define PYATTN_SIMD_NEON_H

#include <arm_neon.h>

#define PA_NEON_FN static inline

typedef float32x4_t pa_neon_v_f32;
typedef uint32x4_t pa_neon_m_f32;
typedef float64x2_t pa_neon_v_f64;
typedef uint64x2_t pa_neon_m_f64;
enum { pa_neon_lanes_f32 = 4, pa_neon_lanes_f64 = 2 };

PA_NEON_FN float32x4_t pa_neon_load_f32(const float *p) { return vld1q_f32(p); }
PA_NEON_FN void pa_neon_store_f32(float *p, float32x4_t x) { vst1q_f32(p, x); }
PA_NEON_FN float32x4_t pa_neon_set1_f32(float x) { return vdupq_n_f32(x); }
PA_NEON_FN float32x4_t pa_neon_zero_f32(void) { return vdupq_n_f32(0.0f); }
PA_NEON_FN float32x4_t pa_neon_bcast_f32(const float *p) { return vld1q_dup_f32(p); }
PA_NEON_FN float32x4_t pa_neon_add_f32(float32x4_t a, float32x4_t b) { return vaddq_f32(a, b); }
PA_NEON_FN float32x4_t pa_neon_sub_f32(float32x4_t a, float32x4_t b) { return vsubq_f32(a, b); }
PA_NEON_FN float32x4_t pa_neon_mul_f32(float32x4_t a, float32x4_t b) { return vmulq_f32(a, b); }
PA_NEON_FN float32x4_t pa_neon_div_f32(float32x4_t a, float32x4_t b) { return vdivq_f32(a, b); }
/* a > b ? a : b (x86 maxps: b when either is NaN; NEON's fmax would give NaN) */
PA_NEON_FN float32x4_t pa_neon_max_f32(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
PA_NEON_FN float32x4_t pa_neon_fma_f32(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }
PA_NEON_FN float32x4_t pa_neon_fnma_f32(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmsq_f32(c, a, b); }
PA_NEON_FN uint32x4_t pa_neon_lt_f32(float32x4_t a, float32x4_t b) { return vcltq_f32(a, b); }
PA_NEON_FN uint32x4_t pa_neon_eq_f32(float32x4_t a, float32x4_t b) { return vceqq_f32(a, b); }
PA_NEON_FN float32x4_t pa_neon_zero_where_f32(uint32x4_t m, float32x4_t y)
{
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), m));
}
PA_NEON_FN float32x4_t pa_neon_pow2i_f32(float32x4_t t)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vreinterpretq_s32_f32(t), 23));
}

/* 4 float16 / bfloat16 values to floats, exactly (fcvtl; a 16-bit shift) */
PA_NEON_FN float32x4_t pa_neon_widen_f16_f32(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
PA_NEON_FN float32x4_t pa_neon_widen_bf16_f32(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
/* 4 int8 / int4 values (a quantized cache's) as floats, exactly */
PA_NEON_FN float32x4_t pa_neon_widen_i8_f32(const int8_t *p)
{
    const int32_t v[4] = {p[0], p[1], p[2], p[3]};
    return vcvtq_f32_s32(vld1q_s32(v));
}
PA_NEON_FN float32x4_t pa_neon_widen_i4_f32(const uint8_t *p)
{
    const int32_t v[4] = {(int32_t)((uint32_t)p[0] << 28) >> 28, (int32_t)((uint32_t)p[0] << 24) >> 28,
                          (int32_t)((uint32_t)p[1] << 28) >> 28, (int32_t)((uint32_t)p[1] << 24) >> 28};
    return vcvtq_f32_s32(vld1q_s32(v));
}

/* The 16-partial sum of the decode kernels (vocab.h, vhsum16): p[l] +
 * p[l + 8], then + 4, + 2, + 1 */
PA_NEON_FN float pa_neon_hsum16_f32(const float32x4_t *a)
{
    const float32x4_t s4 = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
PA_NEON_FN double pa_neon_hsum16_f64(const float64x2_t *a)
{
    const float64x2_t b0 = vaddq_f64(a[0], a[4]), b1 = vaddq_f64(a[1], a[5]);
    const float64x2_t b2 = vaddq_f64(a[2], a[6]), b3 = vaddq_f64(a[3], a[7]);
    const float64x2_t d = vaddq_f64(vaddq_f64(b0, b2), vaddq_f64(b1, b3));
    return vgetq_lane_f64(d, 0) + vgetq_lane_f64(d, 1);
}

PA_NEON_FN float64x2_t pa_neon_load_f64(const double *p) { return vld1q_f64(p); }
PA_NEON_FN void pa_neon_store_f64(double *p, float64x2_t x) { vst1q_f64(p, x); }
PA_NEON_FN float64x2_t pa_neon_set1_f64(double x) { return vdupq_n_f64(x); }
PA_NEON_FN float64x2_t pa_neon_zero_f64(void) { return vdupq_n_f64(0.0); }
PA_NEON_FN float64x2_t pa_neon_bcast_f64(const double *p) { return vld1q_dup_f64(p); }
PA_NEON_FN float64x2_t pa_neon_add_f64(float64x2_t a, float64x2_t b) { return vaddq_f64(a, b); }
PA_NEON_FN float64x2_t pa_neon_sub_f64(float64x2_t a, float64x2_t b) { return vsubq_f64(a, b); }
PA_NEON_FN float64x2_t pa_neon_mul_f64(float64x2_t a, float64x2_t b) { return vmulq_f64(a, b); }
PA_NEON_FN float64x2_t pa_neon_div_f64(float64x2_t a, float64x2_t b) { return vdivq_f64(a, b); }
PA_NEON_FN float64x2_t pa_neon_max_f64(float64x2_t a, float64x2_t b) { return vbslq_f64(vcgtq_f64(a, b), a, b); }
PA_NEON_FN float64x2_t pa_neon_fma_f64(float64x2_t a, float64x2_t b, float64x2_t c) { return vfmaq_f64(c, a, b); }
PA_NEON_FN float64x2_t pa_neon_fnma_f64(float64x2_t a, float64x2_t b, float64x2_t c) { return vfmsq_f64(c, a, b); }
PA_NEON_FN uint64x2_t pa_neon_lt_f64(float64x2_t a, float64x2_t b) { return vcltq_f64(a, b); }
PA_NEON_FN uint64x2_t pa_neon_eq_f64(float64x2_t a, float64x2_t b) { return vceqq_f64(a, b); }
PA_NEON_FN float64x2_t pa_neon_zero_where_f64(uint64x2_t m, float64x2_t y)
{
    return vreinterpretq_f64_u64(vbicq_u64(vreinterpretq_u64_f64(y), m));
}
PA_NEON_FN float64x2_t pa_neon_pow2i_f64(float64x2_t t)
{
    return vreinterpretq_f64_s64(vshlq_n_s64(vreinterpretq_s64_f64(t), 52));
}

#endif
