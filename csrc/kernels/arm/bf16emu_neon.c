/*
 * bf16emu_neon.c -- precision="bf16" on aarch64 (the neon family): the
 * products of vdpbf16ps (the gemm_bf16 contract, csrc/README.md) on NEON
 * float32 FMAs, the same bits as kernels/ref/ref.c's exact emulation.
 * Exports pa_gemm_bf16_neon, a 6 x 16 tile (24 accumulators).
 *
 * Why plain FMAs are exact: a bfloat16 value widens to float32 exactly (its
 * bits << 16), the product of two has at most 16 significant bits, so
 * fma(a, b, acc) rounds once, as the instruction does. Its other rules are
 * DAZ (a subnormal input reads as a zero of its sign) and FTZ (a subnormal
 * result becomes a zero of its sign). The kernel runs the FMAs in the
 * contract's order (per pair q: the odd element's product, then the even
 * one's) with FPCR.FZ set: the hardware then reads subnormal inputs as
 * zeros of their sign -- DAZ exactly -- and flushes a result that is tiny
 * BEFORE rounding, raising FPSR.UFC. The contract flushes a result that is
 * subnormal AFTER rounding; every such result is tiny before rounding too
 * (rounding is monotonic and FLT_MIN is a float), so where UFC stays clear
 * no result was flushed by either rule and the sums are the contract's.
 * Where UFC is set (a value within 2^-126 of zero: a tiny product, or sums
 * that cancel to one -- never in data of normal range) the tile is computed
 * again by the scalar loop below, under the caller's FPCR (ref.c's formula,
 * DAZ and FTZ per operation). FPCR and FPSR's UFC and IDC are put back as
 * they were; the final C = acc or C += acc runs under the caller's FPCR.
 *
 * A's pairs are split to float32 once per call (odd elements: the high
 * halves, masked; even: the low halves, shifted up); B's 16 pairs per q the
 * same way, in registers. Per q: 4 B loads, 8 integer operations, 48 FMAs
 * by lane (rows 0-3 from one vector of A, rows 4-5 from a half vector).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_NEON_KERNELS
#include <arm_neon.h>
#include <math.h>

#define PA_FPCR_FZ (1ull << 24)     /* flush subnormal inputs and results to zero */
#define PA_FPSR_UFC (1ull << 3)     /* underflow (with FZ: a result was flushed) */
#define PA_FPSR_IDC (1ull << 7)     /* a subnormal input was flushed (FZ) */

static inline uint64_t pa_neon_get_fpcr(void)
{
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    return r;
}
static inline void pa_neon_set_fpcr(uint64_t r) { __asm__ volatile("msr fpcr, %0" : : "r"(r) : "memory"); }
static inline uint64_t pa_neon_get_fpsr(void)
{
    uint64_t r;
    __asm__ volatile("mrs %0, fpsr" : "=r"(r));
    return r;
}
static inline void pa_neon_set_fpsr(uint64_t r) { __asm__ volatile("msr fpsr, %0" : : "r"(r) : "memory"); }

static inline float pa_neon_daz(uint16_t h)
{
    return (h & 0x7f80u) ? pa_bf16_to_f32(h) : pa_bits_f32((uint32_t)(h & 0x8000u) << 16);
}
static inline float pa_neon_ftz(float x)
{
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}

#define PA_EMUN_MR 6
#define PA_EMUN_NR 16

/* The contract on the 6 x 16 pair panels, one scalar operation at a time */
static void pa_neon_bf16_exact(pa_ssize kc, const uint16_t *A, const uint16_t *B, float *acc)
{
    enum { MR = PA_EMUN_MR, NR = PA_EMUN_NR };
    for (int i = 0; i < MR * NR; i++) acc[i] = 0;
    for (pa_ssize q = 0; q < kc / 2; q++) {
        const uint16_t *a = A + q * MR * 2, *b = B + q * NR * 2;
        for (int i = 0; i < MR; i++) {
            const float a1 = pa_neon_daz(a[2 * i + 1]), a0 = pa_neon_daz(a[2 * i]);
            for (int j = 0; j < NR; j++) {
                const float t = pa_neon_ftz(fmaf(a1, pa_neon_daz(b[2 * j + 1]), acc[i * NR + j]));
                acc[i * NR + j] = pa_neon_ftz(fmaf(a0, pa_neon_daz(b[2 * j]), t));
            }
        }
    }
}

void pa_gemm_bf16_neon(pa_ssize kc, const void *A_, pa_ssize a_rs, pa_ssize a_cs, const void *B_, pa_ssize b_rs,
                       void *C_, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate)
{
    enum { MR = PA_EMUN_MR, NR = PA_EMUN_NR };
    const uint16_t *A = (const uint16_t *)A_, *B = (const uint16_t *)B_;
    const uint32_t *Aw = (const uint32_t *)A_, *Bw = (const uint32_t *)B_;
    float *C = (float *)C_;
    float Ao[PA_GEMM_KC_BF16 / 2 * MR + 8] __attribute__((aligned(16)));    /* odd elements, [q][i] */
    float Ae[PA_GEMM_KC_BF16 / 2 * MR + 8] __attribute__((aligned(16)));    /* even elements */
    float acc[MR * NR] __attribute__((aligned(16)));
    (void)a_rs; (void)a_cs; (void)b_rs;
    const pa_ssize nq = kc / 2, nw = nq * MR;              /* kc <= PA_GEMM_KC_BF16, even */
    const uint32x4_t hi = vdupq_n_u32(0xffff0000u);
    pa_ssize t = 0;
    for (; t + 4 <= nw; t += 4) {
        const uint32x4_t w = vld1q_u32(Aw + t);
        vst1q_f32(Ao + t, vreinterpretq_f32_u32(vandq_u32(w, hi)));
        vst1q_f32(Ae + t, vreinterpretq_f32_u32(vshlq_n_u32(w, 16)));
    }
    for (; t < nw; t++) Ao[t] = pa_bf16_to_f32(A[2 * t + 1]), Ae[t] = pa_bf16_to_f32(A[2 * t]);

    const uint64_t fpcr = pa_neon_get_fpcr(), fpsr = pa_neon_get_fpsr();
    if (fpsr & PA_FPSR_UFC) pa_neon_set_fpsr(fpsr & ~PA_FPSR_UFC);
    pa_neon_set_fpcr(fpcr | PA_FPCR_FZ);                   /* a memory barrier for the compiler */
    float32x4_t c[MR][4];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = vdupq_n_f32(0.0f);
    for (pa_ssize q = 0; q < nq; q++) {
        const uint32_t *w = Bw + q * NR;
        const uint32x4_t w0 = vld1q_u32(w), w1 = vld1q_u32(w + 4), w2 = vld1q_u32(w + 8), w3 = vld1q_u32(w + 12);
        const float32x4_t a03 = vld1q_f32(Ao + q * MR), e03 = vld1q_f32(Ae + q * MR);
        const float32x2_t a45 = vld1_f32(Ao + q * MR + 4), e45 = vld1_f32(Ae + q * MR + 4);
        float32x4_t b0 = vreinterpretq_f32_u32(vandq_u32(w0, hi)), b1 = vreinterpretq_f32_u32(vandq_u32(w1, hi));
        float32x4_t b2 = vreinterpretq_f32_u32(vandq_u32(w2, hi)), b3 = vreinterpretq_f32_u32(vandq_u32(w3, hi));
#define PA_EMUN_ROWQ(i, av, l)                                   \
        c[i][0] = vfmaq_laneq_f32(c[i][0], b0, av, l);           \
        c[i][1] = vfmaq_laneq_f32(c[i][1], b1, av, l);           \
        c[i][2] = vfmaq_laneq_f32(c[i][2], b2, av, l);           \
        c[i][3] = vfmaq_laneq_f32(c[i][3], b3, av, l);
#define PA_EMUN_ROWD(i, av, l)                                   \
        c[i][0] = vfmaq_lane_f32(c[i][0], b0, av, l);            \
        c[i][1] = vfmaq_lane_f32(c[i][1], b1, av, l);            \
        c[i][2] = vfmaq_lane_f32(c[i][2], b2, av, l);            \
        c[i][3] = vfmaq_lane_f32(c[i][3], b3, av, l);
        PA_EMUN_ROWQ(0, a03, 0) PA_EMUN_ROWQ(1, a03, 1) PA_EMUN_ROWQ(2, a03, 2) PA_EMUN_ROWQ(3, a03, 3)
        PA_EMUN_ROWD(4, a45, 0) PA_EMUN_ROWD(5, a45, 1)
        b0 = vreinterpretq_f32_u32(vshlq_n_u32(w0, 16)), b1 = vreinterpretq_f32_u32(vshlq_n_u32(w1, 16));
        b2 = vreinterpretq_f32_u32(vshlq_n_u32(w2, 16)), b3 = vreinterpretq_f32_u32(vshlq_n_u32(w3, 16));
        PA_EMUN_ROWQ(0, e03, 0) PA_EMUN_ROWQ(1, e03, 1) PA_EMUN_ROWQ(2, e03, 2) PA_EMUN_ROWQ(3, e03, 3)
        PA_EMUN_ROWD(4, e45, 0) PA_EMUN_ROWD(5, e45, 1)
#undef PA_EMUN_ROWQ
#undef PA_EMUN_ROWD
    }
    /* the sums exist before the flags are read and FPCR is put back */
    for (int i = 0; i < MR; i++) __asm__ volatile("" : "+w"(c[i][0]), "+w"(c[i][1]), "+w"(c[i][2]), "+w"(c[i][3]));
    const uint64_t flags = pa_neon_get_fpsr();
    pa_neon_set_fpcr(fpcr);
    if ((flags ^ fpsr) & (PA_FPSR_UFC | PA_FPSR_IDC))      /* UFC and IDC as they were */
        pa_neon_set_fpsr((flags & ~(PA_FPSR_UFC | PA_FPSR_IDC)) | (fpsr & (PA_FPSR_UFC | PA_FPSR_IDC)));
    if (flags & PA_FPSR_UFC) {
        pa_neon_bf16_exact(kc, A, B, acc);                 /* a flush may matter: the contract, op by op */
    } else if (m == MR && n == NR && cs == 1) {
        for (int i = 0; i < MR; i++) {
            float *ci = C + i * rs;
            for (int v = 0; v < 4; v++) {
                float32x4_t x = c[i][v];
                if (accumulate) x = vaddq_f32(vld1q_f32(ci + 4 * v), x);
                vst1q_f32(ci + 4 * v, x);
            }
        }
        return;
    } else {
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 4; v++) vst1q_f32(acc + i * NR + 4 * v, c[i][v]);
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *cij = C + i * rs + j * cs;
            *cij = accumulate ? *cij + acc[i * NR + j] : acc[i * NR + j];
        }
}
#undef PA_EMUN_MR
#undef PA_EMUN_NR
#undef PA_FPCR_FZ
#undef PA_FPSR_UFC
#undef PA_FPSR_IDC
#endif
