/*
 * ops.h -- the ops (the frame): loops over batch / heads / tiles, threading,
 * packing, masks. Each takes the kernel family of the call as its first
 * argument and passes it down; it reads no global table and never touches
 * Python.
 *
 * Batch axes: every operand of an op has the same leading batch shape
 * bshape[0..nb-1] (the binding broadcast them with stride-0 views); each
 * operand brings its own batch strides (elements). Flat batch index b runs
 * over bshape in C order.
 *
 * Each op returns 0, or -1 when its workspace cannot be allocated (the
 * binding then raises MemoryError). Call without the GIL.
 */
#ifndef PYATTN_OPS_H
#define PYATTN_OPS_H

#include "family.h"

#define PA_MAXDIMS 64

typedef struct {
    int nb;                         /* number of batch axes */
    pa_ssize shape[PA_MAXDIMS];
    pa_ssize count;                 /* product of shape */
} pa_batch;

/* element offset of flat batch index b in an operand with batch strides st */
static inline pa_ssize pa_batch_offset(const pa_batch *bt, const pa_ssize *st, pa_ssize b)
{
    pa_ssize off = 0;
    for (int d = bt->nb - 1; d >= 0; d--) {
        pa_ssize n = bt->shape[d];
        off += (b % n) * st[d];
        b /= n;
    }
    return off;
}

/* A strided operand: base pointer, batch strides, row / column strides. */
typedef struct {
    const void *p;
    pa_ssize bs[PA_MAXDIMS];
    pa_ssize rs, cs;
} pa_operand;

/* The mask of flat batch index b (kind PA_MASK_NONE: none). Bool masks are
 * bytes, additive ones of the compute dtype. */
static inline pa_mask pa_mask_of(const pa_batch *bt, const pa_operand *m, int kind, int dtype,
                                 pa_ssize b)
{
    pa_mask r = {NULL, 0, 0, PA_MASK_NONE};
    if (kind == PA_MASK_NONE) return r;
    const pa_ssize es = kind == PA_MASK_BOOL ? 1 : (pa_ssize)pa_elsize(dtype);
    r.p = (const char *)m->p + pa_batch_offset(bt, m->bs, b) * es;
    r.rs = m->rs;
    r.cs = m->cs;
    r.kind = kind;
    return r;
}

/* Aligned scratch (64 bytes). */
void *pa_alloc64(size_t bytes);
void pa_free64(void *p);

/* A reusable workspace (64-byte aligned) for the ops that need large
 * scratch on every call (the backward: each thread's tiles and packed query
 * side, the key-split's buffers): freeing and allocating megabytes a call
 * costs a page fault per page touched (the allocator gives large blocks back
 * to the OS), so the last block given back is kept for the next call.
 * pa_ws_take returns a block of at least `bytes` (the kept one if it is
 * large enough; else a fresh one, the kept one freed; NULL when out of
 * memory, and for the hook: a take counts as an allocation); its contents
 * are whatever the last call left. Calls that overlap (the GIL released)
 * never share a block: the first takes the kept one, the others allocate
 * their own. pa_ws_give hands it back (kept unless above PA_WS_KEEP_MAX;
 * the block it replaces is freed); pa_ws_release frees the kept block (the
 * thread count changed, module teardown). A kept block is not counted live
 * by pa_alloc_hook. */
#define PA_WS_KEEP_MAX ((size_t)256 << 20)
void *pa_ws_take(size_t bytes);
void pa_ws_give(void *p);
void pa_ws_release(void);

/* The allocation-failure test hook (private _C._alloc_hook): armed with
 * n >= 1, the n-th allocation from then on fails (pa_alloc64 returns NULL,
 * the binding raises MemoryError), once; n = 0 disarms it. Returns the
 * countdown it replaced (0: disarmed or already fired) and, in *live, the
 * pa_alloc64 blocks not yet freed. pa_alloc_fails() is what every
 * allocation site asks: one relaxed atomic load when disarmed. */
long pa_alloc_hook(long n, long *live);
int pa_alloc_fails(void);

/* C[b] = A[b] @ B[b] (+ bias). A (M, K), B (K, N), C (M, N), bias (N,) with
 * element stride bias_s, or NULL. dtype: the compute dtype (C, bias);
 * a_dt, b_dt: how A and B are stored -- dtype, or PA_F16 / PA_BF16 with
 * PA_F32 (widened as they are packed). bf16 (float32 only; -1 otherwise):
 * precision "bf16" -- A and B rounded to bfloat16 as they are packed, the
 * family's gemm_bf16 products (float32 accumulation). */
typedef struct {
    int dtype, a_dt, b_dt;
    const pa_batch *bt;
    pa_ssize M, N, K;
    const pa_operand *A, *B, *C;
    const void *bias;
    pa_ssize bias_s;
    int bf16;
} pa_matmul_call;
int pa_matmul(const pa_family *fam, const pa_matmul_call *mm, int nthreads);
/* A GEMM kernel's blocking for this machine: MC and NC from the caches the
 * OS reports (KC never changes); the note says from which, for show_config */
pa_gemm_kernel pa_gemm_blocked(const pa_gemm_kernel *g, size_t packed_elsize);
int pa_gemm_blocking_note(char *buf, size_t n);

/* Rows of x (bt = all axes but the last, the last of them being L when
 * causal), each of length S. x, mask, out share bt; mask may be NULL. */
typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize S;
    const pa_operand *x, *mask, *out;
    int mask_kind, causal;
    double scale;
} pa_softmax_call;
int pa_softmax(const pa_family *fam, const pa_softmax_call *sm, int nthreads);

/* The softmax backward over rows of length S: out = scale * y * (gy -
 * sum(gy * y)), 0 where y is 0. gy, y, out share bt. */
int pa_softmax_backward(int dtype, const pa_batch *bt, pa_ssize S, const pa_operand *gy,
                        const pa_operand *y, double scale, const pa_operand *out, int nthreads);

/* A KV cache as the attention frame reads it (API.md, "Paged and
 * mixed-length KV caches"; "Quantized KV caches"): the call's one
 * description of where key j's rows of K and V, and their scales, lie.
 * The binding fills it with one converter (bind_paged.c, pa_cache_of);
 * attn_args.c turns it into one head's pa_kv_head (rules.h), whose one
 * accessor, pa_kv_row, every frame reads rows through.
 *
 * Paging (table NULL: not paged): key j of flat batch index b lives in row
 * j % block_size of block table[b][j / block_size] of the pools, each read
 * in place by strides (pyattn's head-major pool (num_blocks, Hkv,
 * block_size, E) or FlashAttention's token-major one, as a view). The
 * call's operands k, v then hold the pools' element [0, h, 0, 0] per flat
 * b (their batch strides: the head's), and the binding has checked every
 * table entry the call reads to lie in [0, num_blocks).
 *
 * Quantization (ks.p / vs.p NULL: that operand is not quantized): per flat
 * b, float32 scales (S, E / kG) beside an int8 / int4 key and (S, Ev / vG)
 * beside a value; element strides (bs: batch, rs: rows, within a block when
 * paged; the groups of a row are contiguous). */
typedef struct {
    const int64_t *table;           /* block table rows (int64), or NULL: not paged */
    pa_ssize tbs[PA_MAXDIMS];       /* element offset of flat b's table row, per batch axis */
    pa_ssize block_size;            /* >= 1 when paged */
    pa_ssize k_blk, v_blk;          /* the pools' block strides (elements) */
    pa_ssize k_rs, v_rs;            /* their row strides within a block (elements) */
    pa_operand ks, vs;              /* the scales of a quantized K / V (p NULL: none) */
    pa_ssize kG, vG;                /* their groups' sizes (1 when not quantized) */
    pa_ssize ks_blk, vs_blk;        /* paged and quantized: the scale pools' block strides */
    /* where a sequence's rows lie (contiguous caches; FlashAttention's
     * cache_leftpad / cache_batch_idx), per sequence s = flat b / per_seq:
     * its keys from row pad[s] on (key j is row pad[s] + j: the head's
     * kv_len, S and positions count from there), read from cache entry
     * idx[s] (the batch axis 0 of k, v and the scales); NULL: none */
    const int64_t *pad, *idx;
    pa_ssize per_seq;               /* flat batch indices per sequence (>= 1) */
} pa_cache;

struct pa_bmask;               /* a call's block mask: ops/blockmask.h */

/* One attention call (the C side of pyattn/_spec.py's AttnSpec; the
 * binding fills it with one converter, pa_attn_call_of in bind_call.c): every
 * attention op and its context take it. Per flat batch index b (all axes
 * but the last two; per-head values come as arrays over b, the binding
 * broadcast them): q (L, E), k (S, E), v (S, Ev), mask (L, S), out (L, Ev),
 * w (L, S), lse (L,) (element stride cs); strides in elements. */
typedef struct {
    int dtype;                  /* the compute dtype, PA_F32 or PA_F64 */
    pa_batch bt;
    pa_ssize L, S, E, Ev;
    pa_operand q, k, v;
    int q_dt, k_dt, v_dt;       /* storage dtypes of q, k, v: the compute dtype, or
                                   PA_F16 / PA_BF16 when it is PA_F32 */
    pa_operand mask;            /* read when mask_kind != PA_MASK_NONE */
    int mask_kind;              /* PA_MASK_* */
    int causal;                 /* PA_CAUSAL_* */
    pa_ssize left, right;       /* sliding window; < 0: unbounded */
    double scale;
    double softcap;             /* > 0, or 0: none */
    const double *slopes;       /* (count,) ALiBi slopes, or NULL */
    const double *sinks;        /* (count,) sink logits, or NULL */
    double dropout_p;           /* 0 <= p < 1 */
    uint64_t dropout_key;
    const int64_t *kv_len;      /* (count,) keys filled (<= S), or NULL: all S.
                                   Given: row i sits at position kv_len - L + i */
    pa_ssize row_div;           /* >= 1: rows per query position (the query heads of
                                   one key/value head stacked as rows, decoding) */
    int has_qoff;               /* 1: row i sits at key position i + qoff (a block of a */
    pa_ssize qoff;              /* longer sequence: pyattn.dask) */
    int bf16;                   /* precision "bf16" (float32 only): bfloat16 products --
                                   q, k, v and the weights rounded to bfloat16 */
    int q8;                     /* precision "int8" (an int8 / int4 k): query rows quantized
                                   to int8 per group of kG, integer key products (q8rowdot) */
    int qbf16;                  /* precision "bf16" with a quantized k (bf16 is 0 then):
                                   query rows rounded to bfloat16, qrowdot's products
                                   (exact), the scores times the scale after the sum */
    /* the forward's results (the backward reads out and lse) */
    pa_operand out;
    int has_w, has_lse;         /* 0: no w / lse */
    pa_operand w, lse;
    void (*before)(void *);     /* or NULL: called once, after every allocation of the */
    void *before_ctx;           /* call succeeded and before any result is written (a KV
                                   cache's new rows); not called when the call fails */
    /* packed sequences' offsets (count + 1,), or NULL */
    const int64_t *cu_seqlens_q, *cu_seqlens_k;
    const pa_cache *cache;      /* a paged and / or quantized KV cache, or NULL: k, v
                                   read j rows down, as stored (pa_call_paged, pa_call_quant) */
    const struct pa_bmask *block_mask;   /* ops/blockmask.h, or NULL */
    pa_ssize nseq;              /* with cu_seqlens_q/k: the sequences (cu_seqlens have
                                   nseq + 1 entries; alibi slopes nseq * count) */
    int seq_align;              /* with cu_seqlens_q/k, 1: each sequence bottom-right
                                   aligned, its row i at key position i + S_i - L_i
                                   (align="bottom_right": causal, window, ALiBi) */
} pa_attn_call;

/* a paged cache; a quantized K or V */
static inline int pa_call_paged(const pa_attn_call *c) { return c->cache && c->cache->table; }
static inline int pa_call_quant(const pa_attn_call *c)
{
    return c->cache && (c->cache->ks.p || c->cache->vs.p);
}
/* the block table row of flat batch index b (a paged call) */
static inline const int64_t *pa_cache_table_row(const pa_attn_call *c, pa_ssize b)
{
    return c->cache->table + pa_batch_offset(&c->bt, c->cache->tbs, b);
}

/* Attention per flat batch index b of call c: out (and w, lse when asked). */
int pa_attention(const pa_family *fam, const pa_attn_call *c, int nthreads);

/* Shared-prefix (cascade) reads of paged decode calls since the module was
 * loaded (attention.c): key/value blocks read once for the queries of
 * several sequences, and the block reads that saved. */
void pa_cascade_stats(unsigned long long *blocks, unsigned long long *saved);

/* Packed sequences (attn_varlen.c): the forward and backward of a call with
 * cu_seqlens_q / cu_seqlens_k; pa_attention and pa_attention_backward hand
 * such calls on. Rows [cu_q[i], cu_q[i+1]) of L attend to keys
 * [cu_k[i], cu_k[i+1]) of S only, each sequence as its own dense call. */
int pa_attention_varlen(const pa_family *fam, const pa_attn_call *c, int nthreads);

/* A paged call (cache->table) with packed queries (cu_seqlens_q): a mixed
 * batch of prefill chunks and decode steps in one call (paged_packed.c,
 * its header comment); pa_attention hands such calls on. */
int pa_attention_paged_packed(const pa_family *fam, const pa_attn_call *c, int nthreads);

/* The backward's own operands (per flat batch index b): the incoming
 * gradient go (L, Ev) and the gradients it adds into, dq (L, E), dk (S, E),
 * dv (S, Ev) -- which the caller zeroed. dk and dv have batch stride 0 on
 * the axes flagged in reduce[0..nb) (the flat indices that differ only
 * there share one key/value head: their gradients are summed, in the order
 * of b). dsinks (count,) or NULL: per b, the gradient of its sink logit. */
typedef struct {
    pa_operand go, dq, dk, dv;
    const int *reduce;
    double *dsinks;
    int zero;           /* 1: dq, dk, dv are not zeroed yet: pa_attention_backward's tasks zero them (in parallel) */
} pa_attn_grads;

/* The attention backward (attn_backward.c) of call c (16-bit storage
 * excluded: q_dt etc. are dtype; no kv_len, row_div or qoff), from the
 * forward's output c->out and c->lse. Results do not depend on nthreads. */
int pa_attention_backward(const pa_family *fam, const pa_attn_call *c, const pa_attn_grads *g,
                          int nthreads);
int pa_attention_varlen_backward(const pa_family *fam, const pa_attn_call *c, const pa_attn_grads *g,
                                 int nthreads);

/* merge_attention: per flat batch index b, P partial results -- outputs
 * (L, Ev) and log-sum-exps (L,) over disjoint key sets, part p at element
 * offset p * outs_ps / p * lses_ps from part 0 -- combined in the order of
 * p into out (L, Ev) and lse (L,) (lse operands: element stride cs). */
typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize P, L, Ev;
    const pa_operand *outs, *lses, *out, *lse;
    pa_ssize outs_ps, lses_ps;
} pa_merge_call;
int pa_merge(const pa_merge_call *mg, int nthreads);

/* Benchmark probe: the family's GEMM micro-kernel alone, on packed panels
 * that stay in L1 (A: MR x kc, B: kc x NR), accumulating into one MR x NR
 * tile, iters times. Returns the flops done (2 MR NR kc per call), or -1
 * when the panels cannot be allocated. *sink receives a C element. */
double pa_gemm_probe(const pa_family *fam, int dtype, pa_ssize kc, long long iters, double *sink);

/* Benchmark probe: *sum = the sum of p[0..n), read once, split over
 * nthreads in fixed 4 MB chunks (time it over a buffer larger than the
 * caches). Returns 0, or -1 when the chunk sums cannot be allocated. */
int pa_read_probe(const pa_family *fam, const float *p, size_t n, int nthreads, double *sum);

#endif
