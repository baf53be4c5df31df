/*
 * paged.h -- a paged KV cache as the attention frame reads it (API.md,
 * "Paged and mixed-length KV caches"). pa_attn_call.block_table points at a
 * pa_paged: the key / value operands' row strides are then replaced by this
 * table. Key j of flat batch index b lives in row j % block_size of block
 * table[b][j / block_size] of the pools, each read in place by strides (any
 * strides: pyattn's head-major pool (num_blocks, Hkv, block_size, E) or
 * FlashAttention's token-major one, transposed as a view). The call's
 * operands k, v then hold the pools' element [0, h, 0, 0] per flat b (their
 * batch strides: the head's), and the binding has checked every table entry
 * the call reads (pa_paged_rows) to lie in [0, num_blocks).
 */
#ifndef PYATTN_OPS_PAGED_H
#define PYATTN_OPS_PAGED_H

#include "ops.h"

typedef struct {
    const int64_t *table;           /* block table rows (int64) */
    pa_ssize tbs[PA_MAXDIMS];       /* element offset of flat b's row, per batch axis */
    pa_ssize block_size;            /* >= 1 */
    pa_ssize k_blk, v_blk;          /* the pools' block strides (elements) */
    pa_ssize k_rs, v_rs;            /* their row strides within a block (elements) */
} pa_paged;

/* the block table row of flat batch index b */
static inline const int64_t *pa_paged_row(const pa_attn_call *c, pa_ssize b)
{
    const pa_paged *pg = (const pa_paged *)c->block_table;
    return pg->table + pa_batch_offset(&c->bt, pg->tbs, b);
}

#endif
