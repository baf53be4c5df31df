/*
 * gemm_avx2.c -- AVX2+FMA GEMM micro-kernels (BLIS-style register blocking):
 * 6x16 for float32 and 6x8 for float64, both from the body in gemm_avx2.inc.
 *   A: 6 rows, element (i, p) at A[i*a_rs + p*a_cs] (a packed panel, or the
 *   rows of a row-major tile); B (kc, NR) at B[p*b_rs + j] (a packed panel or
 *   columns of a row-major matrix); C (m, n) strided (elements).
 * Compiled for AVX2+FMA via target attributes only; chosen at run time.
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define PA_AVX2 __attribute__((target("avx2,fma")))

#define T float
#define VT __m256
#define VL 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, x) _mm256_storeu_ps((p), (x))
#define VBCAST(p) _mm256_broadcast_ss(p)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define PA_NAME pa_gemm_ukr_f32_avx2_6x16
#include "gemm_avx2.inc"         /* (it #undefs the macros it takes) */

#define T double
#define VT __m256d
#define VL 4
#define VZERO() _mm256_setzero_pd()
#define VLOAD(p) _mm256_loadu_pd(p)
#define VSTORE(p, x) _mm256_storeu_pd((p), (x))
#define VBCAST(p) _mm256_broadcast_sd(p)
#define VFMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define VADD(a, b) _mm256_add_pd((a), (b))
#define PA_NAME pa_gemm_ukr_f64_avx2_6x8
#include "gemm_avx2.inc"

int pa_have_avx2_kernels(void) { return 1; }

#else
int pa_have_avx2_kernels(void) { return 0; }
#endif
