/*
 * exp_avx2.c -- the online-softmax tile steps of the flash kernel (AVX2+FMA),
 * float32 (8 query columns per vector) and float64 (4), on the vectorised
 * exp of exp_avx2.h; the body is tilesm_vec.inc.
 */
#include <math.h>
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "exp_avx2.h"

#define PA_FN PA_AVX2_FN

#define T float
#define VT __m256
#define VL 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VSUB _mm256_sub_ps
#define VADD _mm256_add_ps
#define VMAX _mm256_max_ps
#define VFMA _mm256_fmadd_ps
#define VZERO _mm256_setzero_ps
#define VNINF0(x) _mm256_andnot_ps(_mm256_cmp_ps((x), VSET1(-INFINITY), _CMP_EQ_OQ), (x))
#define VEXP pa_exp8_nonpos
#define PA_NAME pa_tilesm_f32_avx2
#define PA_REF_NAME pa_tilesm_f32_ref
#include "tilesm_vec.inc"         /* (it #undefs the macros it takes) */

#define T double
#define VT __m256d
#define VL 4
#define VLOAD _mm256_loadu_pd
#define VSTORE _mm256_storeu_pd
#define VSET1 _mm256_set1_pd
#define VSUB _mm256_sub_pd
#define VADD _mm256_add_pd
#define VMAX _mm256_max_pd
#define VFMA _mm256_fmadd_pd
#define VZERO _mm256_setzero_pd
#define VNINF0(x) _mm256_andnot_pd(_mm256_cmp_pd((x), VSET1(-INFINITY), _CMP_EQ_OQ), (x))
#define VEXP pa_exp4_nonpos
#define PA_NAME pa_tilesm_f64_avx2
#define PA_REF_NAME pa_tilesm_f64_ref
#include "tilesm_vec.inc"

#else
void pa_tilesm_f32_avx2(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        float *m, float *l, float *alpha)
{
    pa_tilesm_f32_ref(St, nj, ncols, ld, m, l, alpha);
}

void pa_tilesm_f64_avx2(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                        double *m, double *l, double *alpha)
{
    pa_tilesm_f64_ref(St, nj, ncols, ld, m, l, alpha);
}
#endif
