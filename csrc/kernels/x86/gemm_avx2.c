/*
 * gemm_avx2.c -- AVX2+FMA GEMM micro-kernels (BLIS-style register blocking).
 *
 *   A: MR rows, element (i, p) at A[i*a_rs + p*a_cs] (a packed panel, or the
 *   rows of a row-major tile); B (kc, NR) at B[p*b_rs + j] (a packed panel or
 *   columns of a row-major matrix); C (m, n) strided (elements).
 * pyattn_gemm_f32_avx2_6x16: 12 ymm accumulators (6 rows x 2 vectors of 8),
 * per k: 2 loads of B, 6 broadcasts of A, 12 FMAs.
 * pyattn_gemm_f64_avx2_6x8: the same shape with 4 doubles per vector.
 * The k-loop runs in order with one FMA per term, the same for edge tiles
 * (zero-padded panels; only the m x n corner is written), so a C element's
 * value never depends on where its tile sits.
 * Compiled for AVX2+FMA via target attributes only; chosen at run time.
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define PA_AVX2 __attribute__((target("avx2,fma")))

/* C (m x n corner) = / += tile held in a row-major MR x NR buffer */
#define PA_WRITEBACK(NR)                                                         \
    if (accumulate) {                                                            \
        for (int i = 0; i < m; i++)                                              \
            for (int j = 0; j < n; j++) C[i * rs + j * cs] += buf[i * NR + j];   \
    } else {                                                                     \
        for (int i = 0; i < m; i++)                                              \
            for (int j = 0; j < n; j++) C[i * rs + j * cs] = buf[i * NR + j];    \
    }

PA_AVX2 void pa_gemm_ukr_f32_avx2_6x16(pa_ssize kc, const void *Ap_, pa_ssize a_rs, pa_ssize a_cs,
                                       const void *Bp_, pa_ssize b_rs, void *C_,
                                       pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    const float *A = (const float *)Ap_, *B = (const float *)Bp_;
    const float *A3 = A + 3 * a_rs;
    float *C = (float *)C_;
    if (accumulate && cs == 1)        /* C is read at the end: start fetching it now */
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(C + i * rs), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * rs + 15), _MM_HINT_T0);
        }
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (pa_ssize p = 0; p < kc; p++) {
        __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8);
        __m256 a;
        a = _mm256_broadcast_ss(A); c00 = _mm256_fmadd_ps(a, b0, c00); c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(A + a_rs); c10 = _mm256_fmadd_ps(a, b0, c10); c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(A + 2 * a_rs); c20 = _mm256_fmadd_ps(a, b0, c20); c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(A3); c30 = _mm256_fmadd_ps(a, b0, c30); c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(A3 + a_rs); c40 = _mm256_fmadd_ps(a, b0, c40); c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(A3 + 2 * a_rs); c50 = _mm256_fmadd_ps(a, b0, c50); c51 = _mm256_fmadd_ps(a, b1, c51);
        A += a_cs;
        A3 += a_cs;
        B += b_rs;
    }
    if (m == 6 && n == 16 && cs == 1) {
        float *r = C;
#define ROW(x0, x1)                                                                       \
        if (accumulate) { x0 = _mm256_add_ps(_mm256_loadu_ps(r), x0);                     \
                          x1 = _mm256_add_ps(_mm256_loadu_ps(r + 8), x1); }               \
        _mm256_storeu_ps(r, x0); _mm256_storeu_ps(r + 8, x1); r += rs;
        ROW(c00, c01) ROW(c10, c11) ROW(c20, c21) ROW(c30, c31) ROW(c40, c41) ROW(c50, c51)
#undef ROW
        return;
    }
    float buf[6 * 16];
    _mm256_storeu_ps(buf + 0, c00);  _mm256_storeu_ps(buf + 8, c01);
    _mm256_storeu_ps(buf + 16, c10); _mm256_storeu_ps(buf + 24, c11);
    _mm256_storeu_ps(buf + 32, c20); _mm256_storeu_ps(buf + 40, c21);
    _mm256_storeu_ps(buf + 48, c30); _mm256_storeu_ps(buf + 56, c31);
    _mm256_storeu_ps(buf + 64, c40); _mm256_storeu_ps(buf + 72, c41);
    _mm256_storeu_ps(buf + 80, c50); _mm256_storeu_ps(buf + 88, c51);
    PA_WRITEBACK(16)
}

PA_AVX2 void pa_gemm_ukr_f64_avx2_6x8(pa_ssize kc, const void *Ap_, pa_ssize a_rs, pa_ssize a_cs,
                                      const void *Bp_, pa_ssize b_rs, void *C_,
                                      pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    const double *A = (const double *)Ap_, *B = (const double *)Bp_;
    const double *A3 = A + 3 * a_rs;
    double *C = (double *)C_;
    if (accumulate && cs == 1)        /* C is read at the end: start fetching it now */
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(C + i * rs), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * rs + 7), _MM_HINT_T0);
        }
    __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
    __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
    __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
    __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
    __m256d c40 = _mm256_setzero_pd(), c41 = _mm256_setzero_pd();
    __m256d c50 = _mm256_setzero_pd(), c51 = _mm256_setzero_pd();
    for (pa_ssize p = 0; p < kc; p++) {
        __m256d b0 = _mm256_loadu_pd(B), b1 = _mm256_loadu_pd(B + 4);
        __m256d a;
        a = _mm256_broadcast_sd(A); c00 = _mm256_fmadd_pd(a, b0, c00); c01 = _mm256_fmadd_pd(a, b1, c01);
        a = _mm256_broadcast_sd(A + a_rs); c10 = _mm256_fmadd_pd(a, b0, c10); c11 = _mm256_fmadd_pd(a, b1, c11);
        a = _mm256_broadcast_sd(A + 2 * a_rs); c20 = _mm256_fmadd_pd(a, b0, c20); c21 = _mm256_fmadd_pd(a, b1, c21);
        a = _mm256_broadcast_sd(A3); c30 = _mm256_fmadd_pd(a, b0, c30); c31 = _mm256_fmadd_pd(a, b1, c31);
        a = _mm256_broadcast_sd(A3 + a_rs); c40 = _mm256_fmadd_pd(a, b0, c40); c41 = _mm256_fmadd_pd(a, b1, c41);
        a = _mm256_broadcast_sd(A3 + 2 * a_rs); c50 = _mm256_fmadd_pd(a, b0, c50); c51 = _mm256_fmadd_pd(a, b1, c51);
        A += a_cs;
        A3 += a_cs;
        B += b_rs;
    }
    if (m == 6 && n == 8 && cs == 1) {
        double *r = C;
#define ROW(x0, x1)                                                                       \
        if (accumulate) { x0 = _mm256_add_pd(_mm256_loadu_pd(r), x0);                     \
                          x1 = _mm256_add_pd(_mm256_loadu_pd(r + 4), x1); }               \
        _mm256_storeu_pd(r, x0); _mm256_storeu_pd(r + 4, x1); r += rs;
        ROW(c00, c01) ROW(c10, c11) ROW(c20, c21) ROW(c30, c31) ROW(c40, c41) ROW(c50, c51)
#undef ROW
        return;
    }
    double buf[6 * 8];
    _mm256_storeu_pd(buf + 0, c00);  _mm256_storeu_pd(buf + 4, c01);
    _mm256_storeu_pd(buf + 8, c10);  _mm256_storeu_pd(buf + 12, c11);
    _mm256_storeu_pd(buf + 16, c20); _mm256_storeu_pd(buf + 20, c21);
    _mm256_storeu_pd(buf + 24, c30); _mm256_storeu_pd(buf + 28, c31);
    _mm256_storeu_pd(buf + 32, c40); _mm256_storeu_pd(buf + 36, c41);
    _mm256_storeu_pd(buf + 40, c50); _mm256_storeu_pd(buf + 44, c51);
    PA_WRITEBACK(8)
}

int pa_have_avx2_kernels(void) { return 1; }

#else
int pa_have_avx2_kernels(void) { return 0; }
#endif
