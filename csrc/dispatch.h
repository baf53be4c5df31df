/*
 * dispatch.h -- the kernel table.
 *
 * pa_dispatch_init() fills the table with the portable reference kernels
 * (kernels/ref), then overwrites entries with the best family the CPU and the
 * PYATTN_ISA request allow. Ops call kernels only through pa_kernels.
 */
#ifndef PYATTN_DISPATCH_H
#define PYATTN_DISPATCH_H

#include "pyattn.h"

/* Families, in order. PA_ISA_AVX512_EMU is not a level of its own: a request
 * for it (tests only) installs the AVX-512 kernel bodies built over pairs of
 * AVX2 registers (avx512_emu.c), so CPUs without AVX-512 can test them. */
enum { PA_ISA_GENERIC = 0, PA_ISA_AVX2 = 1, PA_ISA_AVX512 = 2, PA_ISA_AVX512_EMU = 3 };

/* GEMM micro-kernel.
 *   A : MR rows, element (i, p) at A[i*a_rs + p*a_cs] -- a packed A panel
 *       (a_rs = 1, a_cs = MR) or rows of a row-major tile (a_rs = lda, a_cs = 1)
 *   B : kc x NR, element (p, j) at B[p*b_rs + j] -- a packed B panel
 *       (b_rs = NR) or NR columns of a row-major matrix (b_rs = ldb)
 *   C : (m, n) with element strides rs, cs; m <= MR, n <= NR
 * Computes acc = Ap^T Bp over p = 0..kc-1 in order, then C = acc (accumulate
 * == 0) or C += acc (accumulate != 0), writing only the m x n corner. */
typedef void (*pa_gemm_ukr)(pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs,
                            const void *B, pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs,
                            int m, int n, int accumulate);

typedef struct {
    pa_gemm_ukr ukr;
    int mr, nr;           /* register tile */
    int kc, mc, nc;       /* cache blocking: K panel, A block rows, B block cols */
    const char *name;
} pa_gemm_kernel;

/* Attention over query rows [i0, i1) of one head. ws: per-thread workspace of
 * at least attn_ws(E, Ev) bytes, aligned to 64. */
typedef void (*pa_attn_fn)(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);
typedef size_t (*pa_attn_ws_fn)(pa_ssize E, pa_ssize Ev);
/* Merge query row i of one head from the partial results of nchunks key
 * chunks (chunk c at partials + c * chunk_stride elements, row i at
 * i * (2 + Ev) within it), in chunk order, into a->out. */
typedef void (*pa_attn_merge_fn)(const pa_attn_args *a, pa_ssize i, const void *partials,
                                 pa_ssize nchunks, pa_ssize chunk_stride, void *ws);

typedef struct {
    pa_attn_fn run;
    pa_attn_ws_fn ws;
    pa_attn_merge_fn merge;   /* NULL: the kernel cannot work on key chunks */
    int bq;               /* query rows per task: a multiple of lcm(MR, NR) of
                             the family's micro-kernel */
    const char *name;
} pa_attn_kernel;

typedef void (*pa_softmax_fn)(const pa_softmax_row *r);

/* Online-softmax step on a tile of scores stored key-major: St (nj, ncols)
 * with row stride ld, column c = one query. For every column: tile max
 * (ignoring NaN) -> mnew = max(m, tile max); alpha = exp(m - mnew) (0 while
 * nothing was admissible); St = exp(St - mnew) (0 for -inf); l = l * alpha +
 * column sum; m = mnew. The caller rescales its accumulator rows by alpha. */
typedef void (*pa_tilesm_float)(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                                float *m, float *l, float *alpha);
typedef void (*pa_tilesm_double)(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                                 double *m, double *l, double *alpha);

/* tiles of the flash kernel (attn_flash.inc) */
/* (the query rows per block are the table's attn[].bq: 48, or 96 for AVX-512 f32) */
#define PA_FLASH_BK 60   /* keys per tile: a multiple of every MR (4, 6, 12) */
#define PA_FLASH_MAXD 512
/* decode shapes (few queries, many keys): keys split into fixed chunks, one
 * task each, merged in chunk order -- a partition that depends on the shape
 * only, never on the thread count */
#define PA_SPLIT_MAXL 8
#define PA_SPLIT_MINS 4096
#define PA_SPLIT_CHUNK 2048
/* query rows per call of the reference attention kernel (its workspace) */
#define PA_REF_BQ 16

typedef struct {
    int isa;              /* family in use (PA_ISA_*) */
    int isa_machine;      /* best family the CPU + OS support */
    pa_gemm_kernel gemm[2];       /* [PA_F32], [PA_F64] */
    pa_attn_kernel attn[2];
    pa_softmax_fn softmax[2];
    const char *softmax_name[2];
    pa_tilesm_float tilesm_float;
    pa_tilesm_double tilesm_double;
    const char *tilesm_name;
} pa_dispatch;

extern pa_dispatch pa_kernels;

const char *pa_isa_name(int isa);
/* requested: PA_ISA_* upper bound (or -1 for "best available"). Returns the
 * family chosen. */
int pa_dispatch_init(int requested);

/* AVX2+FMA kernels (kernels/x86); pa_have_avx2_kernels() is 0 where they
 * could not be compiled (not x86-64 GCC/clang) */
int pa_have_avx2_kernels(void);
void pa_gemm_ukr_f32_avx2_6x16(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_gemm_ukr_f64_avx2_6x8(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);

/* AVX-512 kernels (kernels/x86/gemm_avx512.c; 0: not compiled here) and the
 * same bodies over AVX2 register pairs (avx512_emu.c, for tests) */
int pa_have_avx512_kernels(void);
void pa_gemm_ukr_f32_avx512_12x32(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_gemm_ukr_f64_avx512_12x16(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_gemm_ukr_f32_avx512emu_12x32(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_gemm_ukr_f64_avx512emu_12x16(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);

/* benchmark probes (kernels/x86/peak.c): float32 FMA throughput at 8 and 16
 * lanes; return the flops done (0: not compiled here) */
double pa_fma_probe_avx2(long long iters, float *sink);
double pa_fma_probe_avx512(long long iters, float *sink);

/* tiled attention (kernels/attn_flash.c), on any family's micro-kernel */
void pa_attn_f32_flash(const pa_attn_args *, pa_ssize, pa_ssize, void *);
void pa_attn_f64_flash(const pa_attn_args *, pa_ssize, pa_ssize, void *);
void pa_attn_merge_f32_flash(const pa_attn_args *, pa_ssize, const void *, pa_ssize, pa_ssize, void *);
void pa_attn_merge_f64_flash(const pa_attn_args *, pa_ssize, const void *, pa_ssize, pa_ssize, void *);
size_t pa_attn_ws_f32_flash(pa_ssize, pa_ssize);
size_t pa_attn_ws_f64_flash(pa_ssize, pa_ssize);
void pa_tilesm_f32_ref(float *, pa_ssize, pa_ssize, pa_ssize, float *, float *, float *);
void pa_tilesm_f64_ref(double *, pa_ssize, pa_ssize, pa_ssize, double *, double *, double *);
void pa_tilesm_f32_avx2(float *, pa_ssize, pa_ssize, pa_ssize, float *, float *, float *);
void pa_tilesm_f64_avx2(double *, pa_ssize, pa_ssize, pa_ssize, double *, double *, double *);
void pa_tilesm_f32_avx512(float *, pa_ssize, pa_ssize, pa_ssize, float *, float *, float *);
void pa_tilesm_f64_avx512(double *, pa_ssize, pa_ssize, pa_ssize, double *, double *, double *);
void pa_tilesm_f32_avx512emu(float *, pa_ssize, pa_ssize, pa_ssize, float *, float *, float *);
void pa_tilesm_f64_avx512emu(double *, pa_ssize, pa_ssize, pa_ssize, double *, double *, double *);

/* reference kernels (kernels/ref) */
void pa_gemm_ukr_f32_ref_4x16(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_gemm_ukr_f64_ref_4x8(pa_ssize, const void *, pa_ssize, pa_ssize, const void *, pa_ssize, void *, pa_ssize, pa_ssize, int, int, int);
void pa_attn_f32_ref(const pa_attn_args *, pa_ssize, pa_ssize, void *);
void pa_attn_f64_ref(const pa_attn_args *, pa_ssize, pa_ssize, void *);
size_t pa_attn_ws_f32_ref(pa_ssize, pa_ssize);
size_t pa_attn_ws_f64_ref(pa_ssize, pa_ssize);
void pa_softmax_f32_ref(const pa_softmax_row *);
void pa_softmax_f64_ref(const pa_softmax_row *);
void pa_softmax_f32_avx2(const pa_softmax_row *);
void pa_softmax_f64_avx2(const pa_softmax_row *);

#endif
