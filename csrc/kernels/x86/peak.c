/*
 * peak.c -- the FMA peak probes used by the benchmark, one per vector width.
 *
 * Each runs `iters` rounds of 12 independent float32 FMA chains (enough to
 * cover the FMA latency on two ports) and returns the flop count, so the
 * caller's timing gives this core's float32 FMA throughput at that width:
 * 8 lanes (AVX2) or 16 (AVX-512, the peak the AVX-512 kernels are held to).
 * Each function carries its own target attribute; nothing else here does.
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define PA_PROBE_BODY(VT, VL, SET1, FMA, ADD, STORE)                        \
    VT a[12];                                                               \
    const VT x = SET1(0.999999f), y = SET1(1e-7f);                          \
    for (int i = 0; i < 12; i++) a[i] = SET1((float)i);                     \
    for (long long it = 0; it < iters; it++) {                              \
        _Pragma("GCC unroll 12")                                            \
        for (int i = 0; i < 12; i++) a[i] = FMA(a[i], x, y);                \
    }                                                                       \
    VT s = a[0];                                                            \
    for (int i = 1; i < 12; i++) s = ADD(s, a[i]);                          \
    float buf[VL];                                                          \
    STORE(buf, s);                                                          \
    *sink = buf[0];                                                         \
    return (double)iters * 12 * VL * 2;

__attribute__((target("avx2,fma")))
double pa_fma_probe_avx2(long long iters, float *sink)
{
    PA_PROBE_BODY(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps)
}

__attribute__((target("avx512f")))
double pa_fma_probe_avx512(long long iters, float *sink)
{
    PA_PROBE_BODY(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps)
}
#else
double pa_fma_probe_avx2(long long iters, float *sink) { (void)iters; *sink = 0; return 0; }
double pa_fma_probe_avx512(long long iters, float *sink) { (void)iters; *sink = 0; return 0; }
#endif
