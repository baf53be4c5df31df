/*
 * attention.h -- the attention drivers' shared declarations: what the two
 * ops, attention.c (the forward: tasks, threads) and attn_backward.c (the
 * backward), and the routes (attn_varlen.c, paged_packed.c) call below
 * them: attn_args.c (one head's pa_attn_args), attn_flash.c (the tiled
 * forward and backward on a family's kernels) and attention_ref.c (the
 * exact portable path), and the shapes that choose between them. The rules
 * those paths apply (pa_attn_args, the score rule, the key tiles, ...) are
 * rules.h's, included here. Calls go down only: ops -> attn_args.c,
 * attn_flash.c -> attention_ref.c. Not seen by kernels.
 */
#ifndef PYATTN_OPS_ATTENTION_H
#define PYATTN_OPS_ATTENTION_H

#include "rules.h"

/* decode shapes (few queries, many keys): keys split into fixed chunks, one
 * task each, merged in chunk order -- a partition that depends on the shape
 * only, never on the thread count */
#define PA_SPLIT_MAXL 8
#define PA_SPLIT_MINS 4096
#define PA_SPLIT_CHUNK 2048
/* precision "bf16" on few query rows (decode): the rows path on bfloat16
 * values (attn_flash.c, pa_bf16_rows_*) where L <= PA_SPLIT_MAXL, or the
 * query heads of a key/value head stacked as rows (div > 1) up to
 * PA_BF16_ROWS_MAXL rows; its split's chunks lie on the key tiles' grid
 * (a multiple of PA_FLASH_BK): no key tile crosses two chunks */
#define PA_BF16_ROWS_MAXL 32
#define PA_BF16_SPLIT_CHUNK (34 * PA_FLASH_BK)
static inline int pa_bf16_rows_shape(pa_ssize L, pa_ssize div, pa_ssize E, pa_ssize Ev)
{
    return (L <= PA_SPLIT_MAXL || (div > 1 && L <= PA_BF16_ROWS_MAXL)) && E <= PA_FLASH_MAXD && Ev <= PA_FLASH_MAXD;
}
/* head dims the rows path (decode: few query rows, or a GQA group's stacked
 * as rows) runs on the family's row kernels; larger ones, and the tiled
 * path's past PA_FLASH_MAXD, take the exact (reference) path. Its workspace
 * grows with them: (PA_FLASH_BK + the query block) x (E + Ev) values. */
#define PA_ROWS_MAXD 4096
static inline int pa_rows_dims(pa_ssize E, pa_ssize Ev)
{
    return E <= PA_ROWS_MAXD && Ev <= PA_ROWS_MAXD;
}
/* query rows and keys per block of the reference path (its workspace) */
#define PA_REF_BQ 16
#define PA_REF_BK 64

/* The tiled forward (attn_flash.c) for query rows [i0, i1) of one head, on
 * family f's kernels; ws: a workspace of pa_flash_ws bytes, aligned to 64
 * (0: the size overflows). pa_flash_merge combines query row i of one head
 * from the partials of nchunks key chunks (chunk c at partials + c *
 * chunk_stride elements, row i at i * (2 + Ev) within it), in chunk order. */
size_t pa_flash_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev);
void pa_flash_run(const pa_family *f, int dtype, const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                  void *ws);
void pa_flash_merge(int dtype, const pa_attn_args *a, pa_ssize i, const void *partials,
                    pa_ssize nchunks, pa_ssize chunk_stride, void *ws);

/* Shared-prefix (cascade) reads (attention.c groups the heads): the rows
 * path of the decode split for n >= 2 heads grp[0, n) of one call (L <=
 * PA_SPLIT_MAXL rows, or a GQA group's; the same [key_begin, key_end))
 * whose keys [key_begin, kshared) -- kshared on the key tiles' grid, within
 * every member's filled keys -- are the same rows of the same paged pool
 * (the same blocks of the same head; scales too): each key tile there read
 * once for all, then each member's other tiles alone; every member's
 * partial written as its own pa_flash_run would (the same bits). ws:
 * pa_flash_shared_ws for n * L rows (0: the size overflows), aligned to 64. */
size_t pa_flash_shared_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev, pa_ssize R);
void pa_flash_shared(const pa_family *f, int dtype, const pa_attn_args *const *grp, pa_ssize n,
                     pa_ssize kshared, void *ws);

/* The pa_attn_args of flat batch index b of attention call c (attn_args.c):
 * operands, the key rule, per-head options. */
void pa_attn_setup(pa_attn_args *a, const pa_family *fam, const pa_attn_call *c, pa_ssize b);

/* The backward's own operands of one head (strides in elements): the
 * forward's output o and lse, the incoming gradient go, and the gradients
 * it adds into: dq (L, E), dk (S, E), dv (S, Ev); dsink receives the sink's
 * gradient (or NULL). */
typedef struct {
    const void *o; pa_ssize o_rs, o_cs;
    const void *go; pa_ssize go_rs, go_cs;
    const void *lse; pa_ssize lse_s;
    void *dq; pa_ssize dq_rs, dq_cs;
    void *dk; pa_ssize dk_rs, dk_cs;
    void *dv; pa_ssize dv_rs, dv_cs;
    double *dsink;
} pa_bwd_io;

/* The tiled backward of one head (attn_backward.inc) on family f's kernels;
 * ws: pa_bwd_ws bytes, aligned to 64 (0: the size overflows). */
size_t pa_bwd_ws(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev);
void pa_bwd_head(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *ws);
/* pa_bwd_head in two steps (the key-split, attn_backward.c): the packed
 * query side into qs (pa_bwd_ws_qside bytes, aligned to 64), then the key
 * tiles [a->key_begin, a->key_end) on it (read only) with tiles (the rest
 * of pa_bwd_ws, aligned to 64) */
size_t pa_bwd_ws_qside(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev);
void pa_bwd_pack(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs);
/* pa_bwd_pack of the query blocks [t0, t1) (of attn_bq rows) only: slices
 * of one head packed in parallel */
void pa_bwd_pack_blocks(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs,
                        pa_ssize t0, pa_ssize t1);
void pa_bwd_keys(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, const void *qs,
                 void *tiles);
/* pa_bwd_head with the key-split the dense call (call: one sequence's,
 * nouter key/value heads) would run, its chunks in turn: the same bits
 * (attn_backward.c) */
void pa_bwd_head_chunked(const pa_family *fam, const pa_attn_call *call, pa_ssize nouter, const pa_attn_args *a,
                         const pa_bwd_io *io, void *ws);
/* the dense backward (attn_backward.c); pa_attention_backward (attention.c)
 * routes every call without cu_seqlens_q to it */
int pa_attention_backward_dense(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                                int nthreads);

/* precision "bf16": keys [j0, j0 + nj) of K and V packed for the family's
 * gemm_bf16 (attn_flash.c); pa_bf16_kv_tile: the elements of one tile. */
void pa_bf16_pack_kv(const pa_family *f, const pa_attn_args *a, pa_ssize j0, pa_ssize nj,
                     uint16_t *Kp, uint16_t *Vp);
pa_ssize pa_bf16_kv_tile(const pa_family *f, pa_ssize E, pa_ssize Ev);
/* precision "bf16", the rows path's split (pa_bf16_rows_shape, S >=
 * PA_SPLIT_MINS; attention.c): pass 1, pa_bf16_rows_scores, per key chunk
 * of PA_BF16_SPLIT_CHUNK keys (a->key_begin, a->key_end), the scores of
 * every row into sc (row r at sc + r * ld, ld >= the chunk); pass 2,
 * pa_bf16_rows_finish, per head over all its keys: the rows path on those
 * scores (chunk c's at sc + c * cs), the output rows. The scores are the
 * values the rows path computes itself, and pass 2 runs its steps in its
 * order: the bits of the call without the split (so varlen and paged
 * calls, which do not split these, give the same). The workspace is
 * pa_flash_ws's. */
void pa_bf16_rows_scores(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, void *ws);
void pa_bf16_rows_finish(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, pa_ssize cs,
                         void *ws);

/* The exact path (attention_ref.c), rows [i0, i1), at most PA_REF_BQ. */
size_t pa_attn_ref_ws(int dtype, pa_ssize E, pa_ssize Ev);
void pa_attn_ref_f32(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);
void pa_attn_ref_f64(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);


/* A task of a packed call (attn_varlen.c, paged_packed.c): query rows
 * [i0, i1) of head b of sequence seq (chunk -1), or key chunk `chunk` of
 * all its rows into the partials at element poff (chunk >= 0), or the merge
 * of its nchunks partials (chunk -2); cost orders the list. */
typedef struct {
    pa_ssize seq, b, i0, i1, chunk, nchunks;
    size_t poff;
    double cost;
} pa_seq_task;

/* qsort order of seq tasks: most work first; then by sequence, head, chunk,
 * and a head's query blocks last-first (as the dense op: the long rows of a
 * causal head start early, its K and V stay in cache across its blocks) */
int pa_seq_task_cmp(const void *x, const void *y);

/* Run task k on a (set up for its sequence s and head): a key chunk into
 * the partials, the merge of a split sequence's partials, or query rows. */
void pa_seq_task_run(const pa_family *fam, pa_attn_args *a, const pa_attn_call *s, const pa_seq_task *k,
                     char *partials, void *ws);

#endif
