/*
 * bf16emu.c -- precision="bf16" on x86 CPUs without AVX512_BF16: the
 * products of vdpbf16ps (the gemm_bf16 contract, csrc/README.md) on float32
 * FMAs, the same bits as kernels/ref/ref.c's exact emulation, at float32
 * speed. Exports pa_gemm_bf16_avx2 (6 x 16, the avx2 and avx512emu
 * families) and pa_gemm_bf16_avx512 (12 x 32, the avx512 family where the
 * CPU lacks AVX512_BF16); and the attention's P packer on integer vectors,
 * pa_bf16_pack_p_avx2 / _avx512 (family.h's bf16_pack_p; also used where
 * the CPU has AVX512_BF16), and the rows path's narrower on the same
 * vectors, pa_bf16_narrow_avx2 / _avx512 (bf16_narrow).
 *
 * Why plain FMAs are exact: a bfloat16 value widens to float32 exactly (its
 * bits << 16), the product of two has at most 16 significant bits, so
 * fma(a, b, acc) rounds once, as the instruction does. The instruction's
 * only other rules are DAZ (a subnormal input reads as 0) and FTZ (a
 * subnormal result becomes a zero of its sign), and where no input and no
 * result is subnormal both are the identity. So the kernel runs the FMAs in
 * the contract's order (per pair q: the odd element's product, then the
 * even one's, one accumulator per output) with MXCSR's DE and UE flags
 * cleared, and reads them afterwards: DE (a subnormal operand: an input, an
 * exact subnormal sum fed to the next FMA, or a final sum, each multiplied
 * by 1 before the flags are read) or UE (a tiny inexact result) means a
 * flush could have mattered,
 * and the tile is recomputed by the scalar loop below (DAZ and FTZ per
 * operation, ref.c's formula). DE and UE are put back as they were (pa_emu_csr_end).
 * Where the caller runs with MXCSR's DAZ / FTZ set, the hardware flushes as
 * the contract does (FTZ still raises UE), and the scalar loop runs under
 * the same MXCSR. Finite bfloat16 data of normal range (all data a model
 * holds, in practice) never takes the scalar loop.
 *
 * A's pairs are split to float32 once per call (odd elements: the high
 * halves, masked; even: the low halves, shifted up; a mask and a shift per
 * 8 / 16 pairs; AVX-512: 16 pairs of every row at a time, so the split
 * copy stays small beside B's micro-panel in L1), so the loop body is a
 * broadcast from memory and two FMAs per row and element; B's pairs are
 * split the same way per q. (Splitting A in the registers instead --
 * a broadcast pair, then a mask or a shift per row -- measured 1.46x the
 * float32 time on the AVX2 kernel against 1.18x: the compiler spills.)
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

/* MXCSR with DE and UE clear, returning it as it was. ldmxcsr costs tens
 * of cycles (10 % of a call on attention's short K panels), so it is only
 * written when one of the two flags is set (rarely: they are sticky, but
 * nothing in a float32 program of normal numbers raises them). */
static inline unsigned int pa_emu_csr_begin(void)
{
    const unsigned int csr = _mm_getcsr();
    if (csr & (PA_MXCSR_DE | PA_MXCSR_UE)) _mm_setcsr(csr & ~(PA_MXCSR_DE | PA_MXCSR_UE));
    return csr;
}
/* MXCSR's flags after the FMAs; DE and UE put back as they were in csr
 * (written only when they differ; the other flags the FMAs raised -- inexact,
 * invalid for a NaN -- stay raised, as after any float32 arithmetic) */
static inline unsigned int pa_emu_csr_end(unsigned int csr)
{
    const unsigned int flags = _mm_getcsr(), du = PA_MXCSR_DE | PA_MXCSR_UE;
    if ((flags ^ csr) & du) _mm_setcsr((flags & ~du) | (csr & du));
    return flags;
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

/* ---- AVX2: 6 rows x 16 columns (12 accumulators) --------------------------
 * Per pair q: the odd halves of B's 16 pairs, then every row's odd product;
 * then the even halves and every row's even product: 12 accumulators, 2 B
 * vectors and a broadcast live at a time (15 of the 16 YMM registers). */
#define PA_EMU2_MR 6
#define PA_EMU2_NR 16

__attribute__((target("avx2,fma")))
void pa_gemm_bf16_avx2(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs, const void *B_, pa_ssize b_rs,
                       void *C_, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    enum { MR = PA_EMU2_MR, NR = PA_EMU2_NR };
    const uint16_t *A = (const uint16_t *)A_, *B = (const uint16_t *)B_;
    float *C = (float *)C_;
    float Ao[PA_GEMM_KC_BF16 / 2 * MR + 8] __attribute__((aligned(32)));   /* odd elements, [q][i] */
    float Ae[PA_GEMM_KC_BF16 / 2 * MR + 8] __attribute__((aligned(32)));   /* even elements */
    float acc[MR * NR] __attribute__((aligned(32)));
    (void)a_rs; (void)a_cs; (void)b_rs;
    const pa_ssize nq = kc / 2, nw = nq * MR;               /* kc <= PA_GEMM_KC_BF16, even */
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const uint32_t *Aw = (const uint32_t *)A_;              /* one 32-bit pair per row and q */
    pa_ssize t = 0;
    for (; t + 8 <= nw; t += 8) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(Aw + t));
        _mm256_store_si256((__m256i *)(Ao + t), _mm256_and_si256(w, hi));
        _mm256_store_si256((__m256i *)(Ae + t), _mm256_slli_epi32(w, 16));
    }
    for (; t < nw; t++) Ao[t] = pa_bf16_to_f32(A[2 * t + 1]), Ae[t] = pa_bf16_to_f32(A[2 * t]);
    const unsigned int csr = pa_emu_csr_begin();
    __asm__ volatile("" ::: "memory");
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (pa_ssize q = 0; q < nq; q++) {
        const __m256i *w = (const __m256i *)(B + q * NR * 2);
        const float *ao = Ao + q * MR, *ae = Ae + q * MR;
        __m256 b0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(w), hi));      /* odd */
        __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(w + 1), hi));
#define PA_EMU2_ROW(i, a, x0, x1)                               \
        {                                                       \
            const __m256 ai = _mm256_broadcast_ss(a + i);       \
            x0 = _mm256_fmadd_ps(ai, b0, x0);                   \
            x1 = _mm256_fmadd_ps(ai, b1, x1);                   \
        }
        PA_EMU2_ROW(0, ao, c00, c01) PA_EMU2_ROW(1, ao, c10, c11) PA_EMU2_ROW(2, ao, c20, c21)
        PA_EMU2_ROW(3, ao, c30, c31) PA_EMU2_ROW(4, ao, c40, c41) PA_EMU2_ROW(5, ao, c50, c51)
        b0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(w), 16));           /* even */
        b1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(w + 1), 16));
        PA_EMU2_ROW(0, ae, c00, c01) PA_EMU2_ROW(1, ae, c10, c11) PA_EMU2_ROW(2, ae, c20, c21)
        PA_EMU2_ROW(3, ae, c30, c31) PA_EMU2_ROW(4, ae, c40, c41) PA_EMU2_ROW(5, ae, c50, c51)
#undef PA_EMU2_ROW
    }
    /* a subnormal final sum raises DE too, as an operand of a product by 1;
     * the sums and those products exist before the flags are read */
    const __m256 one = _mm256_set1_ps(1.0f);
#define PA_EMU2_DE(x0, x1, x2, x3)                                                                     \
    {                                                                                                  \
        const __m256 p = _mm256_mul_ps(x0, one), r = _mm256_mul_ps(x1, one);                           \
        const __m256 u = _mm256_mul_ps(x2, one), v = _mm256_mul_ps(x3, one);                           \
        __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3) : "x"(p), "x"(r), "x"(u), "x"(v)); \
    }
    PA_EMU2_DE(c00, c01, c10, c11) PA_EMU2_DE(c20, c21, c30, c31) PA_EMU2_DE(c40, c41, c50, c51)
#undef PA_EMU2_DE
    const unsigned int flags = pa_emu_csr_end(csr);
    _mm256_store_ps(acc + 0, c00), _mm256_store_ps(acc + 8, c01);
    _mm256_store_ps(acc + 16, c10), _mm256_store_ps(acc + 24, c11);
    _mm256_store_ps(acc + 32, c20), _mm256_store_ps(acc + 40, c21);
    _mm256_store_ps(acc + 48, c30), _mm256_store_ps(acc + 56, c31);
    _mm256_store_ps(acc + 64, c40), _mm256_store_ps(acc + 72, c41);
    _mm256_store_ps(acc + 80, c50), _mm256_store_ps(acc + 88, c51);
    if (flags & (PA_MXCSR_DE | PA_MXCSR_UE))
        pa_emu_exact(kc, A, B, MR, NR, acc);                /* a flush may matter: the contract, op by op */
    if (m == MR && n == NR && cs == 1) {
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * rs;
            __m256 x0 = _mm256_load_ps(acc + i * NR), x1 = _mm256_load_ps(acc + i * NR + 8);
            if (accumulate) {
                x0 = _mm256_add_ps(_mm256_loadu_ps(ci), x0);
                x1 = _mm256_add_ps(_mm256_loadu_ps(ci + 8), x1);
            }
            _mm256_storeu_ps(ci, x0);
            _mm256_storeu_ps(ci + 8, x1);
        }
        return;
    }
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
    /* A's pairs split QB pairs at a time (3 KiB), not the whole panel
     * (24 KiB: with B's 32 KiB micro-panel more than a 48 KiB L1 holds) */
    enum { QB = 16 };
    float Ao[QB * MR] __attribute__((aligned(64)));      /* odd elements, [q][i] */
    float Ae[QB * MR] __attribute__((aligned(64)));      /* even elements */
    float acc[MR * NR] __attribute__((aligned(64)));
    (void)a_rs; (void)a_cs; (void)b_rs;
    const pa_ssize nq = kc / 2;                          /* kc <= PA_GEMM_KC_BF16, even */
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const uint32_t *Aw = (const uint32_t *)A_;
    const unsigned int csr = pa_emu_csr_begin();
    __asm__ volatile("" ::: "memory");
    __m512 c[MR][2];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (pa_ssize q0 = 0; q0 < nq; q0 += QB) {
        const pa_ssize qn = pa_min(nq - q0, QB), nw = qn * MR;   /* nw: a multiple of MR = 12 */
        const uint32_t *aw = Aw + q0 * MR;
        pa_ssize t = 0;
        for (; t + 16 <= nw; t += 16) {
            const __m512i w = _mm512_loadu_si512((const void *)(aw + t));
            _mm512_store_si512((void *)(Ao + t), _mm512_and_si512(w, hi));
            _mm512_store_si512((void *)(Ae + t), _mm512_slli_epi32(w, 16));
        }
        for (; t < nw; t++) Ao[t] = pa_bits_f32(aw[t] & 0xffff0000u), Ae[t] = pa_bits_f32(aw[t] << 16);
        for (pa_ssize q = 0; q < qn; q++) {
            const uint16_t *bq = B + (q0 + q) * NR * 2;
            const __m512i w0 = _mm512_loadu_si512((const void *)bq);
            const __m512i w1 = _mm512_loadu_si512((const void *)(bq + 32));
            const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
            const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
            const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
            const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
            const float *ao = Ao + q * MR, *ae = Ae + q * MR;
            for (int i = 0; i < MR; i++) {
                const __m512 a1 = _mm512_set1_ps(ao[i]);
                c[i][0] = _mm512_fmadd_ps(a1, o0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(a1, o1, c[i][1]);
                const __m512 a0 = _mm512_set1_ps(ae[i]);
                c[i][0] = _mm512_fmadd_ps(a0, e0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(a0, e1, c[i][1]);
            }
        }
    }
    const __m512 one = _mm512_set1_ps(1.0f);               /* a subnormal final sum raises DE (above) */
    for (int i = 0; i < MR; i++) {
        const __m512 p = _mm512_mul_ps(c[i][0], one), r = _mm512_mul_ps(c[i][1], one);
        __asm__ volatile("" : "+v"(c[i][0]), "+v"(c[i][1]) : "v"(p), "v"(r));
    }
    const unsigned int flags = pa_emu_csr_end(csr);
    if (flags & (PA_MXCSR_DE | PA_MXCSR_UE)) {
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

/* ---- precision "bf16"'s P packer (pa_bf16_pack_fn, family.h) ---------------
 * Two rows of weights (keys 2q and 2q + 1) over the mr queries of a panel,
 * rounded as pa_bf16_round does (to nearest even; a NaN keeps its high half
 * with the quiet bit set) into one pair word per query: the even key's
 * bfloat16 in the low half. Integer vector operations, the same bits as the
 * portable loop of ops/attn_flash.c, for every family that has AVX2 (its
 * avx2 and avx512emu families) or AVX-512F (avx512, avx512bf16). */
__attribute__((target("avx512f")))
static inline __m512i pa_emu_round16(__m512i u)
{
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
}

__attribute__((target("avx512f")))
void pa_bf16_pack_p_avx512(const float *St, pa_ssize ld, pa_ssize qc, pa_ssize nj2, int mr, uint32_t *Pp)
{
    const uint32_t *S = (const uint32_t *)(const void *)St;
    const pa_ssize np = nj2 / 2;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (pa_ssize r0 = 0; r0 < qc; r0 += mr)
        for (int i0 = 0; i0 < mr; i0 += 16) {
            const int n = mr - i0 < 16 ? mr - i0 : 16;
            const __mmask16 k = (__mmask16)((1u << n) - 1u);
            const uint32_t *a = S + r0 + i0;
            uint32_t *dst = Pp + r0 * np + i0;
            for (pa_ssize q = 0; q < np; q++) {
                const __m512i x = pa_emu_round16(_mm512_maskz_loadu_epi32(k, a + 2 * q * ld));
                const __m512i y = pa_emu_round16(_mm512_maskz_loadu_epi32(k, a + (2 * q + 1) * ld));
                _mm512_mask_storeu_epi32(dst + q * mr, k, _mm512_or_si512(_mm512_and_si512(y, hi),
                                                                          _mm512_srli_epi32(x, 16)));
            }
        }
}

__attribute__((target("avx2")))
static inline __m256i pa_emu_round8(__m256i u)
{
    /* |u| and the infinity are below 2^31: the signed compare is the unsigned one */
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                       _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

__attribute__((target("avx2")))
void pa_bf16_pack_p_avx2(const float *St, pa_ssize ld, pa_ssize qc, pa_ssize nj2, int mr, uint32_t *Pp)
{
    const uint32_t *S = (const uint32_t *)(const void *)St;
    const pa_ssize np = nj2 / 2;
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (pa_ssize r0 = 0; r0 < qc; r0 += mr)
        for (int i0 = 0; i0 < mr; i0 += 8) {
            const int n = mr - i0 < 8 ? mr - i0 : 8;
            const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);   /* lanes < n */
            const uint32_t *a = S + r0 + i0;
            uint32_t *dst = Pp + r0 * np + i0;
            for (pa_ssize q = 0; q < np; q++) {
                const __m256i x = pa_emu_round8(_mm256_maskload_epi32((const int *)(a + 2 * q * ld), k));
                const __m256i y = pa_emu_round8(_mm256_maskload_epi32((const int *)(a + (2 * q + 1) * ld), k));
                const __m256i w = _mm256_or_si256(_mm256_and_si256(y, hi), _mm256_srli_epi32(x, 16));
                uint32_t *d = dst + q * mr;
                if (n == 8) {
                    _mm256_storeu_si256((__m256i *)d, w);
                    continue;
                }
                /* a partial store as plain stores (a masked store is slow on AMD cores) */
                __m128i v = _mm256_castsi256_si128(w);
                int left = n;
                if (left >= 4) {
                    _mm_storeu_si128((__m128i *)d, v);
                    v = _mm256_extracti128_si256(w, 1), d += 4, left -= 4;
                }
                if (left >= 2) {
                    _mm_storel_epi64((__m128i *)d, v);
                    v = _mm_srli_si128(v, 8), d += 2, left -= 2;
                }
                if (left) *d = (uint32_t)_mm_cvtsi128_si32(v);
            }
        }
}
#undef PA_MXCSR_DE
#undef PA_MXCSR_UE

/* ---- precision "bf16"'s row narrower (pa_bf16_narrow_fn, family.h) ----------
 * n float32 values, or float16 ones widened exactly (F16C vcvtph2ps),
 * rounded as pa_bf16_round does into bfloat16 bits (the rows path's float32
 * / float16 key and value tiles), 16 a step, the tail by the portable rule;
 * the source prefetched ahead (a prefetch past its end is harmless: the next
 * rows of a contiguous cache).
 * Not vcvtneps2bf16: it reads subnormals as 0. */
/* the source prefetched this many bytes ahead (into L1: the loop's loads
 * otherwise wait on memory, its arithmetic not overlapped; measured 1024:
 * 0.7-0.85x the default decode with float16 caches on avx2, 4096: 0.9-1.0x) */
#ifndef PA_NARROW_PF
#define PA_NARROW_PF 4096
#endif
__attribute__((target("avx512f")))
void pa_bf16_narrow_avx512(uint16_t *dst, const void *src, pa_ssize n, int f16)
{
    pa_ssize e = 0;
    for (; e + 16 <= n; e += 16) {
        _mm_prefetch((const char *)src + (e << (f16 ? 1 : 2)) + PA_NARROW_PF, _MM_HINT_T0);
        const __m512 x = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)src + e)))
                             : _mm512_loadu_ps((const float *)src + e);
        const __m512i r = pa_emu_round16(_mm512_castps_si512(x));
        _mm256_storeu_si256((__m256i *)(void *)(dst + e), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; e < n; e++) dst[e] = pa_f32_to_bf16(pa_load_f32(src, e, f16 ? PA_F16 : PA_F32));
}

__attribute__((target("avx2,f16c")))
static inline __m256i pa_emu_load8(const void *src, pa_ssize e, int f16)
{
    return _mm256_castps_si256(f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)src + e)))
                                   : _mm256_loadu_ps((const float *)src + e));
}

/* the avx2 loop rounds without the NaN case (u + 0x7fff + the parity bit),
 * noting any NaN on the way; a source with a NaN is narrowed again with it
 * (pa_emu_round8): fewer operations per value where no NaN is (measured,
 * loaded, 1 thread: precision="bf16" decode on float16 caches 0.91-0.93x
 * the default's speed with the blend per vector, 1.0-1.1x so) */
__attribute__((target("avx2,f16c")))
static inline __m256i pa_emu_fast8(__m256i u, __m256i *nan)
{
    *nan = _mm256_or_si256(*nan, _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                                      _mm256_set1_epi32(0x7f800000)));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                       _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    return _mm256_srli_epi32(r, 16);
}

__attribute__((target("avx2,f16c")))
void pa_bf16_narrow_avx2(uint16_t *dst, const void *src, pa_ssize n, int f16)
{
    pa_ssize e = 0;
    __m256i nan = _mm256_setzero_si256();
    for (; e + 16 <= n; e += 16) {
        _mm_prefetch((const char *)src + (e << (f16 ? 1 : 2)) + PA_NARROW_PF, _MM_HINT_T0);
        const __m256i a = pa_emu_fast8(pa_emu_load8(src, e, f16), &nan);
        const __m256i b = pa_emu_fast8(pa_emu_load8(src, e + 8, f16), &nan);
        /* the high halves are 0: the unsigned pack is exact; it packs per 128-bit lane */
        _mm256_storeu_si256((__m256i *)(void *)(dst + e), _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
    }
    if (!_mm256_testz_si256(nan, nan))               /* a NaN: those values again, with its case */
        for (pa_ssize t = 0; t < e; t += 8) {
            const __m256i r = _mm256_srli_epi32(pa_emu_round8(pa_emu_load8(src, t, f16)), 16);
            const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
            _mm_storeu_si128((__m128i *)(void *)(dst + t), w);
        }
    for (; e < n; e++) dst[e] = pa_f32_to_bf16(pa_load_f32(src, e, f16 ? PA_F16 : PA_F32));
}
#endif /* PA_HAVE_X86_KERNELS */
