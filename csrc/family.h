/*
 * family.h -- the kernel contract and `pa_family`, the complete, const
 * kernel set of one instruction-set family. kernels/README.md says what each
 * kernel kind receives and must compute; this header is its C form.
 *
 * A family is a const struct built at compile time (kernels/<arch>/family.c);
 * dispatch.c chooses one; the binding hands it to an op, which passes it
 * down in the call's context. No kernel and no frame reads global state, so
 * a call keeps the family it started with whatever happens meanwhile.
 */
#ifndef PYATTN_FAMILY_H
#define PYATTN_FAMILY_H

#include "pyattn.h"

/* Families (PYATTN_ISA's words: pa_isa_name). x86 families are levels, a
 * request is capped at what the CPU has; avx512emu (tests only) runs the
 * AVX-512 bodies over pairs of AVX2 registers; neon is aarch64's. */
enum { PA_ISA_GENERIC = 0, PA_ISA_AVX2 = 1, PA_ISA_AVX512 = 2, PA_ISA_AVX512_EMU = 3,
       PA_ISA_NEON = 4, PA_ISA_COUNT = 5 };

/* Where the SIMD families can be compiled (GCC and clang intrinsics) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PA_HAVE_X86_KERNELS 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define PA_HAVE_NEON_KERNELS 1
#endif

/* ---- the contract constants: every family's tiles honour them, so an
 * element's arithmetic (and so its bits) does not depend on the family ---- */
#define PA_GEMM_KC 256      /* K panel: every GEMM element sums KC panels in order */
#define PA_GEMM_KC_BF16 512 /* K panel of the bfloat16 products (256 pairs: the bytes of PA_GEMM_KC floats) */
#define PA_FLASH_BK 60      /* keys per flash tile: a multiple of every MR (4, 6, 12) */
#define PA_BWD_QC 48        /* the backward sums dK, dV over query chunks of 48, in order
                               (every family's attn_bq is a multiple of it) */
#define PA_FLASH_MAXD 512   /* larger head dims take the exact (reference) path */

/* GEMM micro-kernel.
 *   A : MR rows, element (i, p) at A[i*a_rs + p*a_cs] -- a packed A panel
 *       (a_rs = 1, a_cs = MR) or rows of a row-major tile (a_rs = lda, a_cs = 1)
 *   B : kc x NR, element (p, j) at B[p*b_rs + j] -- a packed B panel
 *       (b_rs = NR) or NR columns of a row-major matrix (b_rs = ldb)
 *   C : (m, n) with element strides rs, cs; m <= MR, n <= NR
 * acc = sum over p = 0..kc-1, in order, one fused multiply-add per term
 * (the portable kernel: multiply, then add); then C = acc (accumulate == 0)
 * or C += acc, writing only the m x n corner. */
typedef void (*pa_gemm_ukr)(pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs,
                            const void *B, pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs,
                            int m, int n, int accumulate);

typedef struct {
    pa_gemm_ukr ukr;
    int mr, nr;           /* register tile */
    int kc, mc, nc;       /* cache blocking: K panel (PA_GEMM_KC), A block rows, B block cols */
    const char *name;
} pa_gemm_kernel;

/* Online-softmax tile step on scores stored key-major: St (nj, ncols), row
 * stride ld, column c = one query; m, l, alpha (ncols,); all of the compute
 * dtype. Per column: tile max (a NaN never becomes the max) -> mnew =
 * max(m, tile max); alpha = exp(m - mnew) (0 while nothing was admissible);
 * St = exp(St - mnew) (0 for -inf); l = l * alpha + column sum (one FMA);
 * m = mnew. The caller rescales its accumulator rows by alpha. Vertical:
 * a column's result does not depend on the vector width. */
typedef void (*pa_tilesm_fn)(void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                             void *m, void *l, void *alpha);

/* The backward's probability step on a key-major score tile (as
 * pa_tilesm_fn): St = exp(St - lse[c]) for column c, with lse of the compute
 * dtype (ncols,); a score of -inf gives 0, and a column whose lse is -inf
 * (nothing admissible) is taken as lse 0, so its -inf scores give 0. */
typedef void (*pa_tilep_fn)(void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld, const void *lse);
/* The backward's dS step on key-major tiles P and dP (as pa_tilep_fn), D
 * (ncols,): dP = P (dP - D[c]) scale, rounded after each operation, and
 * exactly 0 where P is 0 (a weight of 0 passes nothing back, not a NaN). */
typedef void (*pa_tileds_fn)(const void *P, void *dP, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                             const void *D, double scale);

/* One row of masked, scaled softmax (pa_softmax_row in pyattn.h). */
typedef void (*pa_softmax_fn)(const pa_softmax_row *r);

/* Benchmark probes. The FMA probe: iters rounds of 12 independent float32
 * FMA chains at the family's vector width; returns the flops done. The read
 * probe: the sum of n floats, each read once (time it over a buffer larger
 * than the caches: read bandwidth). */
typedef double (*pa_fma_probe_fn)(long long iters, float *sink);
typedef float (*pa_read_probe_fn)(const float *p, size_t n);

/* Widening: n contiguous 16-bit values (float16 or bfloat16 bits) to
 * float32, exactly. The frame calls it on tiles of 16-bit operands. */
typedef void (*pa_widen_fn)(float *dst, const uint16_t *src, pa_ssize n);

/* Decode kernels: the rows path of the attention frame (few query rows,
 * many keys: memory bound) on one key tile. Every sum keeps 16 partial sums
 * (element t into partial t mod 16, zero-padded) combined as a tree --
 * p[l] + p[l + 8], then + 4, + 2, + 1 -- so the bits do not depend on the
 * vector width.
 *   dot: s[r*ss + j] = Q[r] . K[j], r < R, j < nj; Q rows at Q + r*qrs and
 *        K rows at K + j*krs, each E contiguous elements.
 *   sm:  the online-softmax step of one row over its nj scores s
 *        (contiguous): as pa_tilesm_fn for one column, the tile's sum of
 *        exp by the 16-partial rule.
 *   pv:  acc[r*ald + d] += P[r*ps + j] * V[j*vrs + d] for j in order,
 *        skipping P == 0 (one FMA per term); d < Ev, V rows contiguous;
 *        acc rows are padded to a multiple of the vector width.
 * dot[0] / pv[0] read K / V of the compute dtype; dot[1], pv[1] (float16)
 * and dot[2], pv[2] (bfloat16) read them in 16 bits (float32 only; NULL
 * for float64), widening as they load. Strides count elements. */
typedef void (*pa_rowdot_fn)(const void *Q, pa_ssize qrs, pa_ssize R, const void *K, pa_ssize krs,
                             pa_ssize nj, pa_ssize E, void *s, pa_ssize ss);
typedef void (*pa_rowsm_fn)(void *s, pa_ssize nj, void *m, void *l, void *alpha);
typedef void (*pa_rowpv_fn)(const void *P, pa_ssize ps, pa_ssize R, const void *V, pa_ssize vrs,
                            pa_ssize nj, pa_ssize Ev, void *acc, pa_ssize ald);

/* The logit softcap on n contiguous scores: x = cap * tanh(x / cap), tanh
 * computed as sign(y) (1 - e) / (1 + e), e = exp(-2|y|) with the family's
 * exp (SIMD families: the shared vector exp, so they give the same bits). */
typedef void (*pa_softcap_fn)(void *x, pa_ssize n, double cap);

typedef struct { pa_tilesm_fn fn; const char *name; } pa_tilesm_kernel;
typedef struct { pa_tilep_fn fn; const char *name; } pa_tilep_kernel;
typedef struct { pa_tileds_fn fn; const char *name; } pa_tileds_kernel;
typedef struct { pa_softcap_fn fn; const char *name; } pa_softcap_kernel;
typedef struct { pa_rowdot_fn dot[3]; pa_rowsm_fn sm; pa_rowpv_fn pv[3]; const char *name; } pa_decode_kernel;
typedef struct { pa_widen_fn fn; const char *name; } pa_widen_kernel;
typedef struct { pa_softmax_fn fn; const char *name; } pa_softmax_kernel;

/* gemm_bf16 (precision="bf16"): a pa_gemm_ukr whose A and B are bfloat16
 * pair panels -- A[(q*MR + i)*2 + t] and B[(q*NR + j)*2 + t] hold K element
 * 2q + t of row i / column j; kc is even (zero-padded) -- and C float32.
 * acc sums the pairs in order of q, each as AVX512_BF16's vdpbf16ps does:
 * the odd element's product first, each step a fused multiply-add with
 * bfloat16 subnormal inputs read as 0 and subnormal results flushed to a
 * zero of their sign; then C = acc or C += acc (IEEE). a_rs, a_cs, b_rs
 * are unused. The portable kernel (kernels/ref/ref.c) is the exact
 * emulation; kernels/x86/avx512bf16.c runs the instruction. */

typedef struct pa_family {
    const char *name;                       /* PYATTN_ISA's word, e.g. "avx2" */
    int isa;                                /* PA_ISA_* */
    pa_gemm_kernel gemm[PA_NCOMPUTE];
    pa_gemm_kernel gemm_bf16;               /* bfloat16 products, float32 C */
    pa_tilesm_kernel tilesm[PA_NCOMPUTE];
    pa_tilep_kernel tilep[PA_NCOMPUTE];
    pa_tileds_kernel tileds[PA_NCOMPUTE];
    pa_softmax_kernel softmax[PA_NCOMPUTE];
    pa_decode_kernel decode[PA_NCOMPUTE];
    pa_softcap_kernel softcap[PA_NCOMPUTE];
    int attn_bq[PA_NCOMPUTE];               /* flash query block: a multiple of
                                               lcm(MR, NR) of the gemm kernel */
    const char *attn_name[PA_NCOMPUTE];
    pa_widen_kernel widen[2];               /* [0] float16, [1] bfloat16 */
    pa_fma_probe_fn fma_probe;              /* NULL: no SIMD probe */
    pa_fma_probe_fn bf16_probe;             /* vdpbf16ps chains (64 flops each), or NULL */
    int fma_lanes;                          /* float32 lanes of the probe */
    pa_read_probe_fn read_probe;
} pa_family;

/* The families (kernels/ref/family.c, kernels/x86/family.c, kernels/arm/family.c) */
extern const pa_family pa_family_generic;
#ifdef PA_HAVE_X86_KERNELS
extern const pa_family pa_family_avx2, pa_family_avx512, pa_family_avx512emu;
extern const pa_family pa_family_avx512bf16;   /* avx512 with AVX512_BF16's bfloat16 products */
#endif
#ifdef PA_HAVE_NEON_KERNELS
extern const pa_family pa_family_neon;
#endif

#endif
