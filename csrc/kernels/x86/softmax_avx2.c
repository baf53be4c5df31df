/*
 * softmax_avx2.c -- masked softmax rows with the vectorised exp (AVX2+FMA),
 * float32 and float64 (the body is softmax_avx2.inc).
 */
#include <math.h>
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "exp_avx2.h"

#define T float
#define VT __m256
#define VL 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VSUB _mm256_sub_ps
#define VADD _mm256_add_ps
#define VMUL _mm256_mul_ps
#define VZERO _mm256_setzero_ps
#define VEXP pa_exp8_nonpos
#define PA_NAME pa_softmax_f32_avx2
#include "softmax_avx2.inc"         /* (it #undefs the macros it takes) */

#define T double
#define VT __m256d
#define VL 4
#define VLOAD _mm256_loadu_pd
#define VSTORE _mm256_storeu_pd
#define VSET1 _mm256_set1_pd
#define VSUB _mm256_sub_pd
#define VADD _mm256_add_pd
#define VMUL _mm256_mul_pd
#define VZERO _mm256_setzero_pd
#define VEXP pa_exp4_nonpos
#define PA_NAME pa_softmax_f64_avx2
#include "softmax_avx2.inc"

#else
void pa_softmax_f32_avx2(const pa_softmax_row *r) { pa_softmax_f32_ref(r); }
void pa_softmax_f64_avx2(const pa_softmax_row *r) { pa_softmax_f64_ref(r); }
#endif
