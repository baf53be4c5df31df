/*
 * exp_avx512.h -- the vectorised exp of exp_avx2.h at 16 floats
 * (pa_exp16_nonpos) / 8 doubles (pa_exp8d_nonpos) per vector (AVX-512F),
 * for the AVX-512 tile step. The same body (exp_vec.inc): the same IEEE
 * operations on each lane in the same order, so every lane has the AVX2
 * version's bits. Only the lane masks differ in form: a compare gives a mask
 * register, and dead lanes are zeroed by a masked move.
 */
#ifndef PYATTN_EXP_AVX512_H
#define PYATTN_EXP_AVX512_H

#include <immintrin.h>

#define PA_AVX512_FN __attribute__((target("avx512f")))

#define PA_EXP_FN PA_AVX512_FN
#define PA_EXP_DOUBLE 0
#define PA_EXP_NAME pa_exp16_nonpos
#define VT __m512
#define DEAD_T __mmask16
#define VSET1 _mm512_set1_ps
#define VFMADD _mm512_fmadd_ps
#define VFNMADD _mm512_fnmadd_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VADD _mm512_add_ps
#define VMAX _mm512_max_ps
#define VCMPLT(x, y) _mm512_cmp_ps_mask((x), (y), _CMP_LT_OQ)
#define VZERO_DEAD(d, y) _mm512_maskz_mov_ps((__mmask16)~(d), (y))
#define VPOW2(t) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(t), 23))
#include "exp_vec.inc"         /* (it #undefs the macros it takes) */

#define PA_EXP_DOUBLE 1
#define PA_EXP_NAME pa_exp8d_nonpos
#define VT __m512d
#define DEAD_T __mmask8
#define VSET1 _mm512_set1_pd
#define VFMADD _mm512_fmadd_pd
#define VFNMADD _mm512_fnmadd_pd
#define VSUB _mm512_sub_pd
#define VMUL _mm512_mul_pd
#define VADD _mm512_add_pd
#define VMAX _mm512_max_pd
#define VCMPLT(x, y) _mm512_cmp_pd_mask((x), (y), _CMP_LT_OQ)
#define VZERO_DEAD(d, y) _mm512_maskz_mov_pd((__mmask8)~(d), (y))
#define VPOW2(t) _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_castpd_si512(t), 52))
#include "exp_vec.inc"
#undef PA_EXP_FN

#endif
