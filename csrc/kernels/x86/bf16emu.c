/*
 * bf16emu.c -- precision="bf16" on x86 CPUs without AVX512_BF16: the
 * products of vdpbf16ps (the gemm_bf16 contract, csrc/README.md) on float32
 * FMAs, the same bits as kernels/ref/ref.c's exact emulation, at float32
 * speed. Exports pa_gemm_bf16_avx2 (4 x 16, the avx2 and avx512emu
 * families) and pa_gemm_bf16_avx512 (12 x 32, the avx512 family where the
 * CPU lacks AVX512_BF16).
 *
 * Why plain FMAs are exact: a bfloat16 value widens to float32 exactly (its
 * bits << 16), the product of two has at most 16 significant bits, so
 * fma(a, b, acc) rounds once, as the instruction does. The instruction's
 * only other rules are DAZ (a subnormal input reads as 0) and FTZ (a
 * subnormal result becomes a zero of its sign), and where no input and no
 * result is subnormal both are the identity. So the kernel runs the FMAs in
 * the contract's order (per pair q: the odd element's product, then the
 * even one's, one accumulator per output) with MXCSR's DE and UE flags
 * cleared, and reads them afterwards: DE (a subnormal operand: an input, or
 * an exact subnormal sum fed to the next FMA), UE (a tiny inexact result)
 * or a subnormal among the final sums means a flush could have mattered,
 * and the tile is recomputed by the scalar loop below (DAZ and FTZ per
 * operation, ref.c's formula). MXCSR is put back as it was, flags included.
 * Where the caller runs with MXCSR's DAZ / FTZ set, the hardware flushes as
 * the contract does (FTZ still raises UE), and the scalar loop runs under
 * the same MXCSR. Finite bfloat16 data of normal range (all data a model
 * holds, in practice) never takes the scalar loop.
 *
 * A is unpacked to float32 once per call (a vector shift per 8 / 16
 * elements), so the loop body is a broadcast from memory and two FMAs per
 * row and pair; B's pairs are split per q (odd: the high halves, masked;
 * even: the low halves, shifted up).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>

#define PA_MXCSR_DE 0x0002u      /* denormal operand */
#define PA_MXCSR_UE 0x0010u      /* underflow (tiny and inexact) */

static inline float pa_emu_daz(uint16_t h)
{
    return (h & 0x7f80u) ? pa_bf16_to_f32(h) : pa_bits_f32((uint32_t)(h & 0x8000u) << 16);
}
static inline float pa_emu_ftz(float x)
{
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}

/* The contract on pair panels of MR rows and NR columns, one scalar
 * operation at a time (ref.c's pa_gemm_bf16_ref for any tile): acc (MR x NR). */
static void pa_emu_exact(pa_ssize kc, const uint16_t *A, const uint16_t *B, int MR, int NR, float *acc)
{
    for (int i = 0; i < MR * NR; i++) acc[i] = 0;
    for (pa_ssize q = 0; q < kc / 2; q++) {
        const uint16_t *a = A + q * MR * 2, *b = B + q * NR * 2;
        for (int i = 0; i < MR; i++) {
            const float a1 = pa_emu_daz(a[2 * i + 1]), a0 = pa_emu_daz(a[2 * i]);
            for (int j = 0; j < NR; j++) {
                const float t = pa_emu_ftz(fmaf(a1, pa_emu_daz(b[2 * j + 1]), acc[i * NR + j]));
                acc[i * NR + j] = pa_emu_ftz(fmaf(a0, pa_emu_daz(b[2 * j]), t));
            }
        }
    }
}

/* C (m x n corner, strides rs, cs) = acc or += acc (acc: MR x NR, row stride NR) */
static void pa_emu_store(const float *acc, int NR, float *C, pa_ssize rs, pa_ssize cs, int m, int n,
                         int accumulate)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *c = C + i * rs + j * cs;
            *c = accumulate ? *c + acc[i * NR + j] : acc[i * NR + j];
        }
}

/* ---- AVX2: 4 rows x 16 columns (8 accumulators) ---------------------------- */
#define PA_EMU2_MR 4
#define PA_EMU2_NR 16

/* 1 in the lanes of v holding a nonzero subnormal (|bits| in [1, 0x7fffff]) */
__attribute__((target("avx2,fma"))) static inline __m256i pa_emu2_sub(__m256 v)
{
    const __m256i mag = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    const __m256i t = _mm256_sub_epi32(mag, _mm256_set1_epi32(1));
    return _mm256_cmpeq_epi32(_mm256_min_epu32(t, _mm256_set1_epi32(0x7ffffe)), t);
}

__attribute__((target("avx2,fma")))
void pa_gemm_bf16_avx2(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs, const void *B_, pa_ssize b_rs,
                       void *C_, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    enum { MR = PA_EMU2_MR, NR = PA_EMU2_NR };
    const uint16_t *A = (const uint16_t *)A_, *B = (const uint16_t *)B_;
    float *C = (float *)C_;
    float Af[PA_GEMM_KC_BF16 * MR] __attribute__((aligned(32)));
    float acc[MR * NR] __attribute__((aligned(32)));
    (void)a_rs; (void)a_cs; (void)b_rs;
    const pa_ssize nq = kc / 2, na = nq * 2 * MR;           /* kc <= PA_GEMM_KC_BF16, even */
    pa_ssize t = 0;
    for (; t + 8 <= na; t += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(A + t)));
        _mm256_store_ps(Af + t, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; t < na; t++) Af[t] = pa_bf16_to_f32(A[t]);
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr & ~(PA_MXCSR_DE | PA_MXCSR_UE));
    __asm__ volatile("" ::: "memory");
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    for (pa_ssize q = 0; q < nq; q++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(B + q * NR * 2));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(B + q * NR * 2 + 16));
        const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, hi));
        const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
        const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
        const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
        const float *a = Af + q * MR * 2;
#define PA_EMU2_ROW(i, x0, x1)                                  \
        {                                                       \
            const __m256 a1 = _mm256_broadcast_ss(a + 2 * i + 1); \
            x0 = _mm256_fmadd_ps(a1, o0, x0);                   \
            x1 = _mm256_fmadd_ps(a1, o1, x1);                   \
            const __m256 a0 = _mm256_broadcast_ss(a + 2 * i);   \
            x0 = _mm256_fmadd_ps(a0, e0, x0);                   \
            x1 = _mm256_fmadd_ps(a0, e1, x1);                   \
        }
        PA_EMU2_ROW(0, c00, c01)
        PA_EMU2_ROW(1, c10, c11)
        PA_EMU2_ROW(2, c20, c21)
        PA_EMU2_ROW(3, c30, c31)
#undef PA_EMU2_ROW
    }
    /* the sums exist before the flags are read (no FMA moves past this) */
    __asm__ volatile("" : "+x"(c00), "+x"(c01), "+x"(c10), "+x"(c11), "+x"(c20), "+x"(c21), "+x"(c30), "+x"(c31));
    const unsigned int flags = _mm_getcsr();
    _mm_setcsr(csr);
    __m256i sub = _mm256_or_si256(_mm256_or_si256(pa_emu2_sub(c00), pa_emu2_sub(c01)),
                                  _mm256_or_si256(pa_emu2_sub(c10), pa_emu2_sub(c11)));
    sub = _mm256_or_si256(sub, _mm256_or_si256(_mm256_or_si256(pa_emu2_sub(c20), pa_emu2_sub(c21)),
                                               _mm256_or_si256(pa_emu2_sub(c30), pa_emu2_sub(c31))));
    if ((flags & (PA_MXCSR_DE | PA_MXCSR_UE)) || !_mm256_testz_si256(sub, sub)) {
        pa_emu_exact(kc, A, B, MR, NR, acc);                /* a flush may matter: the contract, op by op */
        pa_emu_store(acc, NR, C, rs, cs, m, n, accumulate);
        return;
    }
    if (m == MR && n == NR && cs == 1) {
        __m256 *r[MR][2] = {{&c00, &c01}, {&c10, &c11}, {&c20, &c21}, {&c30, &c31}};
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * rs;
            __m256 x0 = *r[i][0], x1 = *r[i][1];
            if (accumulate) {
                x0 = _mm256_add_ps(_mm256_loadu_ps(ci), x0);
                x1 = _mm256_add_ps(_mm256_loadu_ps(ci + 8), x1);
            }
            _mm256_storeu_ps(ci, x0);
            _mm256_storeu_ps(ci + 8, x1);
        }
        return;
    }
    _mm256_store_ps(acc + 0, c00), _mm256_store_ps(acc + 8, c01);
    _mm256_store_ps(acc + 16, c10), _mm256_store_ps(acc + 24, c11);
    _mm256_store_ps(acc + 32, c20), _mm256_store_ps(acc + 40, c21);
    _mm256_store_ps(acc + 48, c30), _mm256_store_ps(acc + 56, c31);
    pa_emu_store(acc, NR, C, rs, cs, m, n, accumulate);
}
#undef PA_EMU2_MR
#undef PA_EMU2_NR

/* ---- AVX-512: 12 rows x 32 columns (24 accumulators) ---------------------- */
#define PA_EMU5_MR 12
#define PA_EMU5_NR 32

__attribute__((target("avx512f")))
void pa_gemm_bf16_avx512(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs, const void *B_, pa_ssize b_rs,
                         void *C_, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    enum { MR = PA_EMU5_MR, NR = PA_EMU5_NR };
    const uint16_t *A = (const uint16_t *)A_, *B = (const uint16_t *)B_;
    float *C = (float *)C_;
    float Af[PA_GEMM_KC_BF16 * MR] __attribute__((aligned(64)));
    float acc[MR * NR] __attribute__((aligned(64)));
    (void)a_rs; (void)a_cs; (void)b_rs;
    const pa_ssize nq = kc / 2, na = nq * 2 * MR;
    pa_ssize t = 0;
    for (; t + 16 <= na; t += 16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(A + t)));
        _mm512_store_ps(Af + t, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    for (; t < na; t++) Af[t] = pa_bf16_to_f32(A[t]);
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr & ~(PA_MXCSR_DE | PA_MXCSR_UE));
    __asm__ volatile("" ::: "memory");
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 c[MR][2];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (pa_ssize q = 0; q < nq; q++) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(B + q * NR * 2));
        const __m512i w1 = _mm512_loadu_si512((const void *)(B + q * NR * 2 + 32));
        const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
        const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
        const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
        const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
        const float *a = Af + q * MR * 2;
        for (int i = 0; i < MR; i++) {
            const __m512 a1 = _mm512_set1_ps(a[2 * i + 1]);
            c[i][0] = _mm512_fmadd_ps(a1, o0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a1, o1, c[i][1]);
            const __m512 a0 = _mm512_set1_ps(a[2 * i]);
            c[i][0] = _mm512_fmadd_ps(a0, e0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a0, e1, c[i][1]);
        }
    }
    for (int i = 0; i < MR; i++) __asm__ volatile("" : "+v"(c[i][0]), "+v"(c[i][1]));
    const unsigned int flags = _mm_getcsr();
    _mm_setcsr(csr);
    __mmask16 sub = 0;
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(0x7ffffe);
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++) {
            const __m512i x = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(c[i][h]), mag), one);
            sub |= _mm512_cmple_epu32_mask(x, top);
        }
    if ((flags & (PA_MXCSR_DE | PA_MXCSR_UE)) || sub) {
        pa_emu_exact(kc, A, B, MR, NR, acc);
        pa_emu_store(acc, NR, C, rs, cs, m, n, accumulate);
        return;
    }
    if (m == MR && n == NR && cs == 1) {
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * rs;
            __m512 x0 = c[i][0], x1 = c[i][1];
            if (accumulate) {
                x0 = _mm512_add_ps(_mm512_loadu_ps(ci), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps(ci + 16), x1);
            }
            _mm512_storeu_ps(ci, x0);
            _mm512_storeu_ps(ci + 16, x1);
        }
        return;
    }
    for (int i = 0; i < MR; i++) {
        _mm512_store_ps(acc + i * NR, c[i][0]);
        _mm512_store_ps(acc + i * NR + 16, c[i][1]);
    }
    pa_emu_store(acc, NR, C, rs, cs, m, n, accumulate);
}
#undef PA_EMU5_MR
#undef PA_EMU5_NR
#undef PA_MXCSR_DE
#undef PA_MXCSR_UE
#endif
