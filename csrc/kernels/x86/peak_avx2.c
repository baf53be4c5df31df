/*
 * peak_avx2.c -- the FMA peak probe used by the benchmark.
 *
 * Runs `iters` rounds of 12 independent 8-wide float32 FMA chains (enough
 * to cover the FMA latency on two ports) and returns the flop count, so the
 * caller's timing gives this core's float32 FMA throughput.
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

__attribute__((target("avx2,fma")))
double pa_fma_probe_avx2(long long iters, float *sink)
{
    __m256 a[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float buf[8];
    _mm256_storeu_ps(buf, s);
    *sink = buf[0];
    return (double)iters * 12 * 8 * 2;
}
#else
double pa_fma_probe_avx2(long long iters, float *sink) { (void)iters; *sink = 0; return 0; }
#endif
