/*
 * attention.h -- the attention frame's own pieces, shared by attention.c
 * (tasks, threads), attn_flash.c (the tiled forward on a family's kernels)
 * and attention_ref.c (the exact portable path). Not seen by kernels.
 *
 * Shapes per head (one flattened batch index): q (L, E), k (S, E),
 * v (S, Ev), mask (L, S), out (L, Ev), w (L, S); strides in elements.
 */
#ifndef PYATTN_OPS_ATTENTION_H
#define PYATTN_OPS_ATTENTION_H

#include "family.h"

/* decode shapes (few queries, many keys): keys split into fixed chunks, one
 * task each, merged in chunk order -- a partition that depends on the shape
 * only, never on the thread count */
#define PA_SPLIT_MAXL 8
#define PA_SPLIT_MINS 4096
#define PA_SPLIT_CHUNK 2048
/* query rows and keys per block of the reference path (its workspace) */
#define PA_REF_BQ 16
#define PA_REF_BK 64

typedef struct {
    pa_ssize L, S, E, Ev;
    const void *q; pa_ssize q_rs, q_cs;     /* (L, E)  */
    const void *k; pa_ssize k_rs, k_cs;     /* (S, E)  */
    const void *v; pa_ssize v_rs, v_cs;     /* (S, Ev) */
    pa_mask mask;                           /* (L, S), or kind PA_MASK_NONE */
    int causal;                             /* PA_CAUSAL_* */
    double scale;
    double dropout_p;                       /* 0 <= p < 1 */
    uint64_t dropout_key;
    uint64_t ctr_base;                      /* b * L * S: counter of element (b, 0, 0) */
    pa_ssize key_begin, key_end;            /* the keys this call covers, [0, S) unless split */
    void *partial;                          /* NULL, or per query row (2 + Ev) values of the
                                               compute dtype: running max m, sum l and the
                                               unnormalised output, for a later merge */
    void *out; pa_ssize o_rs, o_cs;         /* (L, Ev) */
    void *w; pa_ssize w_rs, w_cs;           /* (L, S) weights, or NULL */
} pa_attn_args;

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

/* The exact path (attention_ref.c), rows [i0, i1), at most PA_REF_BQ. */
size_t pa_attn_ref_ws(int dtype, pa_ssize E, pa_ssize Ev);
void pa_attn_ref_f32(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);
void pa_attn_ref_f64(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);

#endif
