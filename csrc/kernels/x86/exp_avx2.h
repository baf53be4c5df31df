/*
 * exp_avx2.h -- vectorised exp of non-positive arguments (AVX2+FMA), for the
 * softmax kernels: the arguments there are s - max <= 0. 8 floats
 * (pa_exp8_nonpos) or 4 doubles (pa_exp4_nonpos) per vector; the method,
 * constants and accuracy are in exp_vec.inc, shared with exp_avx512.h.
 */
#ifndef PYATTN_EXP_AVX2_H
#define PYATTN_EXP_AVX2_H

#include <immintrin.h>

#define PA_AVX2_FN __attribute__((target("avx2,fma")))

#define PA_EXP_FN PA_AVX2_FN
#define PA_EXP_DOUBLE 0
#define PA_EXP_NAME pa_exp8_nonpos
#define VT __m256
#define DEAD_T __m256
#define VSET1 _mm256_set1_ps
#define VFMADD _mm256_fmadd_ps
#define VFNMADD _mm256_fnmadd_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VADD _mm256_add_ps
#define VMAX _mm256_max_ps
#define VCMPLT(x, y) _mm256_cmp_ps((x), (y), _CMP_LT_OQ)
#define VZERO_DEAD(d, y) _mm256_andnot_ps((d), (y))
#define VPOW2(t) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23))
#include "exp_vec.inc"         /* (it #undefs the macros it takes) */

#define PA_EXP_DOUBLE 1
#define PA_EXP_NAME pa_exp4_nonpos
#define VT __m256d
#define DEAD_T __m256d
#define VSET1 _mm256_set1_pd
#define VFMADD _mm256_fmadd_pd
#define VFNMADD _mm256_fnmadd_pd
#define VSUB _mm256_sub_pd
#define VMUL _mm256_mul_pd
#define VADD _mm256_add_pd
#define VMAX _mm256_max_pd
#define VCMPLT(x, y) _mm256_cmp_pd((x), (y), _CMP_LT_OQ)
#define VZERO_DEAD(d, y) _mm256_andnot_pd((d), (y))
#define VPOW2(t) _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_castpd_si256(t), 52))
#include "exp_vec.inc"
#undef PA_EXP_FN

#endif
