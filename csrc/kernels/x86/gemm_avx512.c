/*
 * gemm_avx512.c -- AVX-512 GEMM micro-kernels: 12x32 for float32 and 12x16
 * for float64 (the body is gemm_avx512.inc). Compiled for AVX-512F via
 * target attributes only; chosen at run time when CPUID and XGETBV say the
 * CPU and the OS support AVX-512 (dispatch.c).
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define PA_ATTR __attribute__((target("avx512f,fma")))
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

#define T float
#define VT __m512
#define VL 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, x) _mm512_storeu_ps((p), (x))
#define VBCAST(p) _mm512_set1_ps(*(p))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define PA_NAME pa_gemm_ukr_f32_avx512_12x32
#include "gemm_avx512.inc"         /* (it #undefs the macros it takes) */

#define T double
#define VT __m512d
#define VL 8
#define VZERO() _mm512_setzero_pd()
#define VLOAD(p) _mm512_loadu_pd(p)
#define VSTORE(p, x) _mm512_storeu_pd((p), (x))
#define VBCAST(p) _mm512_set1_pd(*(p))
#define VFMA(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define VADD(a, b) _mm512_add_pd((a), (b))
#define PA_NAME pa_gemm_ukr_f64_avx512_12x16
#include "gemm_avx512.inc"

int pa_have_avx512_kernels(void) { return 1; }

#else
int pa_have_avx512_kernels(void) { return 0; }
#endif
