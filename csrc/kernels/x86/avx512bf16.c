/*
 * avx512bf16.c -- the bfloat16 GEMM micro-kernel on AVX512_BF16's
 * vdpbf16ps (precision="bf16"): 12 rows x 32 columns, two products per
 * float32 lane and instruction. Operands are pair panels (family.h,
 * pa_gemm_kernel gemm_bf16); kernels/ref/ref.c's pa_gemm_bf16_ref is its
 * exact emulation (the same bits). Exports pa_gemm_bf16_avx512bf16.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include <immintrin.h>
#include <string.h>

#define PA_BF16_MR 12

__attribute__((target("avx512f,avx512bf16")))
void pa_gemm_bf16_avx512bf16(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs,
                             const void *B_, pa_ssize b_rs, void *C_, pa_ssize rs, pa_ssize cs,
                             int m, int n, int accumulate)
{
    const uint32_t *A = (const uint32_t *)A_;   /* one 32-bit pair per row and q */
    const uint16_t *B = (const uint16_t *)B_;   /* 64 bfloat16 (32 pairs) per q */
    float *C = (float *)C_;
    __m512 c[PA_BF16_MR][2];
    for (int i = 0; i < PA_BF16_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    const pa_ssize nq = kc / 2;
    for (pa_ssize q = 0; q < nq; q++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(B + q * 64));
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(B + q * 64 + 32));
        const uint32_t *a = A + q * PA_BF16_MR;
        for (int i = 0; i < PA_BF16_MR; i++) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, b1);
        }
    }
    if (m == PA_BF16_MR && n == 32 && cs == 1) {
        for (int i = 0; i < PA_BF16_MR; i++) {
            float *ci = C + i * rs;
            if (accumulate) {
                c[i][0] = _mm512_add_ps(c[i][0], _mm512_loadu_ps(ci));
                c[i][1] = _mm512_add_ps(c[i][1], _mm512_loadu_ps(ci + 16));
            }
            _mm512_storeu_ps(ci, c[i][0]);
            _mm512_storeu_ps(ci + 16, c[i][1]);
        }
        return;
    }
    float t[32];
    for (int i = 0; i < m; i++) {
        _mm512_storeu_ps(t, c[i][0]);
        _mm512_storeu_ps(t + 16, c[i][1]);
        for (int j = 0; j < n; j++) {
            float *cij = C + i * rs + j * cs;
            *cij = accumulate ? *cij + t[j] : t[j];
        }
    }
}
#endif

#ifdef PA_HAVE_X86_KERNELS
/* The bfloat16 peak probe (the benchmark's): iters rounds of 12 independent
 * vdpbf16ps chains; each instruction is 16 lanes x 2 multiply-adds = 64
 * flops. Returns the flops done. */
__attribute__((target("avx512f,avx512bf16")))
double pa_bf16_probe_avx512bf16(long long iters, float *sink)
{
    __m512 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm512_set1_ps((float)i);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);      /* (1, 1) */
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33003300);      /* tiny: no overflow */
    for (long long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b);
    __m512 s = c[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, c[i]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * 12.0 * 64.0;
}
#endif
