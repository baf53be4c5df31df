/*
 * bind_paged.h -- the binding of paged KV caches (bind_paged.c): _C.sdpa's
 * paged=(k_pool, v_pool, block_table) and its append of new rows into the
 * pools' pages. bind_sdpa.c's pa_py_sdpa calls it once pa_attn_call_of has filled
 * the call, before anything is allocated.
 */
#ifndef PYATTN_BIND_PAGED_H
#define PYATTN_BIND_PAGED_H

#include <Python.h>
#include "ops/ops.h"
#include "ops/rotary.h"

/* new rows of a paged call: key / value (B, H, T, E / Ev), stored as the
 * pools are, written at logical rows [pos[b], pos[b] + T) of sequence b */
typedef struct {
    char *pool[2];
    const char *rows[2];
    pa_ssize pst[2][4], rst[2][4];  /* element strides */
    pa_ssize B, H, T, D[2];
    size_t es[2];
    const int64_t *pos;
    const pa_cache *pg;             /* the call's (its table; its scale pools) */
    const int64_t *cu;              /* packed (cu_seqlens_q): rows (total, H, E / Ev), sequence b
                                       its rows [cu[b], cu[b+1]), T unused; or NULL */
    int bits[2];                    /* 8 / 4: an int8 / int4 pool, its new rows float32 */
    float *sc[2];                   /* its scale pool (num_blocks, Hkv, block_size, D / G) */
    pa_ssize sst[2][4], G[2];
    int rot, kdt;                   /* append's 4th entry, rotary (bind_rotary.h): the keys, of the */
    pa_rope rope;                   /* compute dtype, rotated as written into the pool (stored as kdt) */
} pa_paged_append;

/* paged = (k_pool, v_pool, block_table), append = (key, value, positions
 * [, rotary]) or None: checked in full (every table entry the call reads or writes in
 * [0, num_blocks)) into *cc's paging fields, then c->cache = cc and, with new rows, c->before
 * writes them. A quantized call (*cc's scales, from the k_scale / v_scale
 * stand-ins attn_call_of bound) takes paged = (k_pool, v_pool, block_table,
 * k_scale_pool, v_scale_pool): int8 / int4 (uint8) pools, float32 scale
 * pools (num_blocks, Hkv, block_size, D / G) (None where that operand is
 * not quantized), which replace the stand-ins' operands in *cc;
 * its new rows are float32, quantized as they are written. -1 with an
 * exception set. */
int pa_bind_paged(PyObject *paged, PyObject *append, pa_attn_call *c, pa_cache *cc, pa_paged_append *ap);

#endif
