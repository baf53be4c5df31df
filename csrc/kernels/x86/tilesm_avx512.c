/*
 * tilesm_avx512.c -- the online-softmax tile steps of the flash kernel on
 * AVX-512F: 16 query columns per vector (float32), 8 (float64), on the exp of
 * exp_avx512.h; the body is tilesm_vec.inc. Each column's result has the same
 * bits as the AVX2 step's (same operations per lane, all vertical).
 * Compiled via target attributes only; installed by dispatch.c with the
 * AVX-512 micro-kernels.
 */
#include <math.h>
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "exp_avx512.h"

#define PA_FN PA_AVX512_FN

#define T float
#define VT __m512
#define VL 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VSUB _mm512_sub_ps
#define VADD _mm512_add_ps
#define VMAX _mm512_max_ps
#define VFMA _mm512_fmadd_ps
#define VZERO _mm512_setzero_ps
#define VNINF0(x) _mm512_maskz_mov_ps((__mmask16)~_mm512_cmp_ps_mask((x), VSET1(-INFINITY), _CMP_EQ_OQ), (x))
#define VEXP pa_exp16_nonpos
#define PA_NAME pa_tilesm_f32_avx512
#define PA_REF_NAME pa_tilesm_f32_ref
#include "tilesm_vec.inc"         /* (it #undefs the macros it takes) */

#define T double
#define VT __m512d
#define VL 8
#define VLOAD _mm512_loadu_pd
#define VSTORE _mm512_storeu_pd
#define VSET1 _mm512_set1_pd
#define VSUB _mm512_sub_pd
#define VADD _mm512_add_pd
#define VMAX _mm512_max_pd
#define VFMA _mm512_fmadd_pd
#define VZERO _mm512_setzero_pd
#define VNINF0(x) _mm512_maskz_mov_pd((__mmask8)~_mm512_cmp_pd_mask((x), VSET1(-INFINITY), _CMP_EQ_OQ), (x))
#define VEXP pa_exp8d_nonpos
#define PA_NAME pa_tilesm_f64_avx512
#define PA_REF_NAME pa_tilesm_f64_ref
#include "tilesm_vec.inc"

#else
void pa_tilesm_f32_avx512(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                          float *m, float *l, float *alpha)
{
    pa_tilesm_f32_ref(St, nj, ncols, ld, m, l, alpha);
}

void pa_tilesm_f64_avx512(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                          double *m, double *l, double *alpha)
{
    pa_tilesm_f64_ref(St, nj, ncols, ld, m, l, alpha);
}
#endif
