/*
 * family.h -- the kernel contract and `pa_family`, the complete, const
 * kernel set of one instruction-set family. csrc/README.md ("The kernel
 * kinds") says what each kernel kind receives and must compute; this header
 * is its C form. The kinds and families themselves are listed once, in
 * registry.h: the signatures, the fields of pa_family and the family codes
 * below are generated from those lists.
 *
 * A family is a const struct built at compile time, in the family's own
 * kernel file (kernels/<arch>/<isa>.c, kernels/ref/family.c: PA_FAMILY_KERNELS);
 * dispatch.c chooses one; the binding hands it to an op, which passes it
 * down in the call's context. No kernel and no frame reads global state, so
 * a call keeps the family it started with whatever happens meanwhile.
 */
#ifndef PYATTN_FAMILY_H
#define PYATTN_FAMILY_H

#include "pyattn.h"

/* Families: the rows of PA_FAMILIES (registry.h). PA_ISA_<CODE> is a
 * family's code (PYATTN_ISA's word: pa_isa_name), PA_ISA_OF_<isa> the same
 * code by the family's word in kernel symbols (PA_ISA_OF_ref: generic). */
#define PA_ISA_CODE(CODE, word, isa, arch, ...) PA_ISA_##CODE,
#define PA_ISA_OF(CODE, word, isa, arch, ...) PA_ISA_OF_##isa = PA_ISA_##CODE,
enum { PA_FAMILIES(PA_ISA_CODE, _) PA_ISA_COUNT };
enum { PA_FAMILIES(PA_ISA_OF, _) };
#undef PA_ISA_CODE
#undef PA_ISA_OF

/* Where the SIMD families can be compiled (GCC and clang intrinsics):
 * PA_ARCH_<arch> is 1 where the families of that arch column are built */
#define PA_ARCH_any 1
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PA_HAVE_X86_KERNELS 1
#define PA_ARCH_x86 1
#else
#define PA_ARCH_x86 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define PA_HAVE_NEON_KERNELS 1
#define PA_ARCH_arm 1
#else
#define PA_ARCH_arm 0
#endif

/* ---- the contract constants: every family's tiles honour them, so an
 * element's arithmetic (and so its bits) does not depend on the family ---- */
#define PA_GEMM_KC 256      /* K panel: every GEMM element sums KC panels in order */
#define PA_GEMM_KC_BF16 512 /* K panel of the bfloat16 products (256 pairs: the bytes of PA_GEMM_KC floats) */
#define PA_FLASH_BK 60      /* keys per flash tile: a multiple of every MR (4, 6, 12) */
#define PA_BWD_QC 48        /* the backward sums dK, dV over query chunks of 48, in order
                               (every family's attn_bq is a multiple of it) */
#define PA_FLASH_MAXD 512   /* larger head dims take the exact (reference) path */

/* ---- the kernel kinds (rows of PA_KERNEL_KINDS): what each computes ----
 *
 * gemm, the GEMM micro-kernel (shape G: f->gemm[compute dtype]).
 *   A : MR rows, element (i, p) at A[i*a_rs + p*a_cs] -- a packed A panel
 *       (a_rs = 1, a_cs = MR) or rows of a row-major tile (a_rs = lda, a_cs = 1)
 *   B : kc x NR, element (p, j) at B[p*b_rs + j] -- a packed B panel
 *       (b_rs = NR) or NR columns of a row-major matrix (b_rs = ldb)
 *   C : (m, n) with element strides rs, cs; m <= MR, n <= NR
 * acc = sum over p = 0..kc-1, in order, one fused multiply-add per term
 * (the portable kernel: multiply, then add); then C = acc (accumulate == 0)
 * or C += acc, writing only the m x n corner.
 *
 * tilesm, the online-softmax tile step on scores stored key-major: St (nj,
 * ncols), row stride ld, column c = one query; m, l, alpha (ncols,); all of
 * the compute dtype. Per column: tile max (a NaN never becomes the max) ->
 * mnew = max(m, tile max); alpha = exp(m - mnew) (0 while nothing was
 * admissible); St = exp(St - mnew) (0 for -inf); l = l * alpha + column sum
 * (one FMA); m = mnew. The caller rescales its accumulator rows by alpha.
 * Vertical: a column's result does not depend on the vector width.
 *
 * tilep, the backward's probability step on a key-major score tile (as
 * tilesm): St = exp(St - lse[c]) for column c, with lse of the compute dtype
 * (ncols,); a score of -inf gives 0, and a column whose lse is -inf (nothing
 * admissible) is taken as lse 0, so its -inf scores give 0.
 *
 * tileds, the backward's dS step on key-major tiles P and dP (as tilep), D
 * (ncols,): dP = P (dP - D[c]) scale, rounded after each operation, and
 * exactly 0 where P is 0 (a weight of 0 passes nothing back, not a NaN).
 *
 * softmax, one row of masked, scaled softmax (pa_softmax_row in pyattn.h).
 *
 * softcap, the logit softcap on n contiguous scores: x = cap * tanh(x /
 * cap), tanh computed as sign(y) (1 - e) / (1 + e), e = exp(-2|y|) with the
 * family's exp (SIMD families: the shared vector exp, so they give the same
 * bits).
 *
 * rescale, the flash forward's accumulator rows after a tile step: row r
 * of O (nr rows, row stride ld, n columns) times alpha[r], one rounded
 * multiply per element, where alpha[r] != 1 (x * 1 == x: rows left alone
 * change no bit); elements past n untouched.
 *
 * rowdot, rowsm, rowpv: the decode kernels, the rows path of the attention
 * frame (few query rows, many keys: memory bound) on one key tile. Every sum
 * keeps 16 partial sums (element t into partial t mod 16, zero-padded)
 * combined as a tree -- p[l] + p[l + 8], then + 4, + 2, + 1 -- so the bits
 * do not depend on the vector width.
 *   rowdot: s[r*ss + j] = Q[r] . K[j], r < R, j < nj; Q rows (the compute
 *        dtype) at Q + r*qrs and K rows at K + j*krs, each E contiguous
 *        elements.
 *   rowsm: the online-softmax step of one row over its nj scores s
 *        (contiguous): as tilesm for one column, the tile's sum of exp by
 *        the 16-partial rule.
 *   rowpv: acc[r*ald + d] += P[r*ps + j] * V[j*vrs + d] for j in order,
 *        skipping P == 0 (one FMA per term); d < Ev, V rows contiguous;
 *        acc rows are padded to a multiple of the vector width.
 *   rowdot, rowpv (next, nnext): prefetch hints only, never read -- the
 *        nnext rows (row stride krs / vrs) the caller reads after these nj
 *        (a paged cache's next block; in place, the rows after the tile);
 *        NULL, 0: none. A kernel prefetches min(32, nj) keys ahead along
 *        its rows, then into next's, and nothing past them.
 * rowdot and rowpv are indexed by the dtype K / V are STORED in (shape S):
 * f->rowdot[PA_F16] reads float16 keys and computes in float32 (widening as
 * it loads), f->rowdot[PA_F64] float64 keys. Strides count elements.
 *
 * widen: n contiguous values stored as the index dtype (shape W: float16 or
 * bfloat16 bits) to its compute dtype (float32), exactly. The frame calls it
 * on tiles of 16-bit operands: f->widen[PA_BF16].
 *
 * read_probe (benchmark): the sum of n floats, each read once (time it over
 * a buffer larger than the caches: read bandwidth). */
#define PA_KIND_TYPES(kind, shape, ret, params, ...)                               \
    typedef ret pa_##kind##_sig params;                                            \
    typedef pa_##kind##_sig *pa_##kind##_fn;                                       \
    PA_REG_CAT(PA_KIND_ENTRY_, shape)(kind)
#define PA_KIND_ENTRY_G(kind)
#define PA_KIND_ENTRY_C(kind) typedef struct { pa_##kind##_fn fn; const char *name; } pa_##kind##_kernel;
#define PA_KIND_ENTRY_S PA_KIND_ENTRY_C
#define PA_KIND_ENTRY_W PA_KIND_ENTRY_C
#define PA_KIND_ENTRY_F PA_KIND_ENTRY_C
PA_KERNEL_KINDS(PA_KIND_TYPES, _)
#undef PA_KIND_TYPES
#undef PA_KIND_ENTRY_G
#undef PA_KIND_ENTRY_C
#undef PA_KIND_ENTRY_S
#undef PA_KIND_ENTRY_W
#undef PA_KIND_ENTRY_F
typedef pa_gemm_fn pa_gemm_ukr;

/* A GEMM micro-kernel and the family's tile for it (shape G; gemm_bf16) */
typedef struct {
    pa_gemm_ukr ukr;
    const char *name;     /* the kernel's C symbol */
    int mr, nr;           /* register tile */
    int kc, mc, nc;       /* cache blocking: K panel (PA_GEMM_KC), A block rows, B block cols */
} pa_gemm_kernel;

/* The FMA peak probe (benchmark): iters rounds of 12 independent float32
 * FMA chains at the family's vector width; returns the flops done. */
typedef double (*pa_fma_probe_fn)(long long iters, float *sink);

/* precision "bf16"'s P packer (bf16_pack_p): the weights St (keys x
 * queries, row stride ld; nj2 keys, even; qc queries, a multiple of mr)
 * rounded to bfloat16 (pa_bf16_round's bits) as the A pair panels of
 * gemm_bf16 (mr queries each, pairs along the keys): word
 * Pp[r0 * nj2 / 2 + q * mr + i] = P[2q + 1][r0 + i] (high half) : P[2q][r0 + i].
 * NULL: the frame's portable loop. */
typedef void (*pa_bf16_pack_fn)(const float *St, pa_ssize ld, pa_ssize qc, pa_ssize nj2, int mr, uint32_t *Pp);

/* precision "bf16"'s row narrower (bf16_narrow): n float32 values (f16 = 0)
 * or float16 values (f16 = 1, widened exactly first) rounded to bfloat16,
 * dst[e] = pa_bf16_round(bits of src[e] as float32) >> 16 (the rows path's
 * float32 / float16 key and value tiles). NULL: the frame's portable loop. */
typedef void (*pa_bf16_narrow_fn)(uint16_t *dst, const void *src, pa_ssize n, int f16);

/* gemm_bf16 (precision="bf16"): a pa_gemm_ukr whose A and B are bfloat16
 * pair panels -- A[(q*MR + i)*2 + t] and B[(q*NR + j)*2 + t] hold K element
 * 2q + t of row i / column j; kc is even (zero-padded) -- and C float32.
 * acc sums the pairs in order of q, each as AVX512_BF16's vdpbf16ps does:
 * the odd element's product first, each step a fused multiply-add with
 * bfloat16 subnormal inputs read as 0 and subnormal results flushed to a
 * zero of their sign; then C = acc or C += acc (IEEE). a_rs, a_cs, b_rs
 * are unused. The portable kernel (kernels/ref/ref.c) is the exact
 * emulation; kernels/x86/avx512bf16.c runs the instruction. A family
 * parameter, not a kind: a family picks one of those two. */

/* One field per kernel kind (PA_KERNEL_KINDS), then the family's own
 * parameters. A field's entries are {fn, name}; an index a family has no
 * kernel for (f->rowdot[PA_BOOL], f->widen[PA_F32]) is {NULL, NULL}. */
#define PA_KIND_FIELD(kind, shape, ret, params, ...) PA_REG_CAT(PA_KIND_FIELD_, shape)(kind)
#define PA_KIND_FIELD_G(kind) pa_gemm_kernel kind[PA_NCOMPUTE];
#define PA_KIND_FIELD_C(kind) pa_##kind##_kernel kind[PA_NCOMPUTE];
#define PA_KIND_FIELD_S(kind) pa_##kind##_kernel kind[PA_NDTYPES];
#define PA_KIND_FIELD_W(kind) pa_##kind##_kernel kind[PA_NDTYPES];
#define PA_KIND_FIELD_F(kind) pa_##kind##_kernel kind;
typedef struct pa_family {
    int isa;                                /* PA_ISA_*: its row of PA_FAMILIES */
    PA_KERNEL_KINDS(PA_KIND_FIELD, _)
    pa_gemm_kernel gemm_bf16;               /* bfloat16 products, float32 C */
    int attn_bq[PA_NCOMPUTE];               /* flash query block: a multiple of
                                               lcm(MR, NR) of the gemm kernel */
    pa_fma_probe_fn fma_probe;              /* NULL: no SIMD probe */
    pa_fma_probe_fn bf16_probe;             /* vdpbf16ps chains (64 flops each), or NULL */
    int fma_lanes;                          /* float32 lanes of the probe */
    pa_bf16_pack_fn bf16_pack_p;            /* precision "bf16": P as pair panels, or NULL */
    pa_bf16_narrow_fn bf16_narrow;          /* precision "bf16": rows to bfloat16, or NULL */
} pa_family;
#undef PA_KIND_FIELD
#undef PA_KIND_FIELD_G
#undef PA_KIND_FIELD_C
#undef PA_KIND_FIELD_S
#undef PA_KIND_FIELD_W
#undef PA_KIND_FIELD_F

/* The kernel fields of family <isa>'s table, from PA_KERNEL_KINDS: its code
 * and, for every kind, the symbols pa_<kind>_<sfx>_<isa> (pa_<kind>_<isa>
 * for shape F) with their names; a G kind takes the tile PA_TILE_<kind>_<sfx>
 * ("mr, nr, kc, mc, nc") that the family's file defines. Use:
 *   const pa_family pa_family_avx2 = { PA_FAMILY_KERNELS(avx2), .attn_bq = ... }; */
#define PA_FAMILY_KERNELS(fam) .isa = PA_ISA_OF_##fam PA_KERNEL_KINDS(PA_INIT_KIND, fam)
#define PA_INIT_KIND(kind, shape, ret, params, fam) , .kind = { PA_REG_CAT(PA_INIT_, shape)(kind, fam) }
#define PA_INIT_G(kind, fam) PA_DTYPES(PA_INIT_DT_G, kind, fam)
#define PA_INIT_C(kind, fam) PA_DTYPES(PA_INIT_DT_C, kind, fam)
#define PA_INIT_S(kind, fam) PA_DTYPES(PA_INIT_DT_S, kind, fam)
#define PA_INIT_W(kind, fam) PA_DTYPES(PA_INIT_DT_W, kind, fam)
#define PA_INIT_F(kind, fam) PA_NAMED(pa_##kind##_##fam)
#define PA_INIT_DT_G(CODE, sfx, name, size, compute, c, s, w, kind, fam) \
    PA_WHEN(c)([PA_##CODE] = {PA_NAMED(pa_##kind##_##sfx##_##fam), PA_TILE_##kind##_##sfx},)
#define PA_INIT_DT_C(CODE, sfx, name, size, compute, c, s, w, kind, fam) \
    PA_WHEN(c)([PA_##CODE] = {PA_NAMED(pa_##kind##_##sfx##_##fam)},)
#define PA_INIT_DT_S(CODE, sfx, name, size, compute, c, s, w, kind, fam) \
    PA_WHEN(s)([PA_##CODE] = {PA_NAMED(pa_##kind##_##sfx##_##fam)},)
#define PA_INIT_DT_W(CODE, sfx, name, size, compute, c, s, w, kind, fam) \
    PA_WHEN(w)([PA_##CODE] = {PA_NAMED(pa_##kind##_##sfx##_##fam)},)
/* a kernel and its name: the symbol, stringised (never typed twice) */
#define PA_NAMED(sym) sym, PA_REG_STR(sym)

/* The families' tables (one per row of PA_FAMILIES, each in its family's
 * kernel file; only those of this build's architecture exist). */
#define PA_FAMILY_EXTERN(CODE, word, isa, arch, ...) extern const pa_family pa_family_##word;
PA_FAMILIES(PA_FAMILY_EXTERN, _)
#undef PA_FAMILY_EXTERN
#ifdef PA_HAVE_X86_KERNELS
extern const pa_family pa_family_avx512bf16;   /* avx512 with AVX512_BF16's bfloat16 products */
extern const pa_family pa_family_avx512vnni;   /* avx512 with AVX512_VNNI's q8rowdot */
extern const pa_family pa_family_avx512bf16vnni;   /* both */
#endif
/* the generic family with the SIMD families' float32 rowsm and softcap (the
 * shared vector exp) in portable C (kernels/ref/vecbits_ref.c): precision
 * "int8" promises the same bits on every family, and runs it in place of
 * the generic family (ops/attn_flash.c, ops/attn_args.c) */
extern const pa_family pa_family_generic_vecbits;
pa_rowsm_sig pa_rowsm_f32_vecbits_ref;
pa_softcap_sig pa_softcap_f32_vecbits_ref;

/* How decode (the rows path of ops/attn_flash.inc) reads a float cache's
 * key and value rows -- a property of the machine, not of a family, and no
 * result depends on it (the same values, summed in the same order):
 *   PA_READ_HW      in place, no software prefetch: the rows stream in by
 *                   the hardware's prefetchers (the kernels read each key's
 *                   row from start to end, one ascending stream per tile);
 *   PA_READ_NTA     in place, the decode kernels' prefetchnta PA_DEC_PFB
 *                   bytes ahead;
 *   PA_READ_GATHER  each key tile copied once into the workspace, the next
 *                   tile prefetched meanwhile, the kernels on the copy;
 *   PA_READ_T2      in place, the decode kernels' prefetcht2 PA_DEC_PFB_T2
 *                   bytes ahead (and a paged cache's runs ahead, as HW).
 * Chosen per CPU at import (cpu.c, pa_cpu_decode_read; PYATTN_DECODE_READ
 * overrides), changed by pyattn._C.set_decode_read (tests, the benchmark);
 * read once per kernel call. */
enum { PA_READ_HW, PA_READ_NTA, PA_READ_GATHER, PA_READ_T2, PA_READ_COUNT };
extern int pa_dec_read_mode;                /* kernels/ref/family.c */
static inline int pa_dec_read(void)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(&pa_dec_read_mode, __ATOMIC_RELAXED);
#else
    return pa_dec_read_mode;
#endif
}
static inline void pa_dec_read_set(int mode)
{
#if defined(__GNUC__) || defined(__clang__)
    __atomic_store_n(&pa_dec_read_mode, mode, __ATOMIC_RELAXED);
#else
    pa_dec_read_mode = mode;
#endif
}

#endif
