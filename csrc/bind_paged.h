/*
 * bind_paged.h -- the binding of paged KV caches (bind_paged.c): _C.sdpa's
 * paged=(k_pool, v_pool, block_table), and THE append of new rows into a
 * cache's pages (pa_kv_append: a contiguous cache's too, bind_append.c). bind_sdpa.c's pa_py_sdpa calls it once pa_attn_call_of has filled
 * the call, before anything is allocated.
 */
#ifndef PYATTN_BIND_PAGED_H
#define PYATTN_BIND_PAGED_H

#include <Python.h>
#include "ops/ops.h"
#include "ops/rotary.h"

/* THE append of new KV rows, for every cache kind: key / value (B, H, T,
 * E / Ev) written at logical rows [pos[b], pos[b] + T) of sequence b, row r
 * at row r % bsz of block table[b * tbs0 + r / bsz] of the pools -- or, for
 * a contiguous cache (table NULL: the identity table, one block per
 * sequence, bsz = S_max), row r of block b (k_cache / v_cache (B, H, S_max,
 * E / Ev), pst[.][0] their batch stride). Stored as the pools are; an int8 /
 * int4 pool takes float32 rows, quantized as they are written (their scales
 * in sc, laid out as the pool); rotary: the keys, of the compute dtype,
 * rotated as written. Filled by pa_get_append (bind_append.c: append= of a
 * contiguous cache) or pa_bind_paged (paged=), both checked in full; written
 * by pa_kv_append_run, the call's before hook, once everything is
 * allocated (a failing call writes nothing). */
typedef struct {
    char *pool[2];
    const char *rows[2];
    pa_ssize pst[2][4], rst[2][4];  /* element strides: (block, head, row, column); the rows' */
    pa_ssize B, H, T, D[2];
    size_t es[2];                   /* the pools' element size (int8 / int4: bytes, 1) */
    size_t res[2];                  /* the new rows' (float32 when quantized; rotary: the keys') */
    const int64_t *pos;
    const int64_t *table;           /* paged: the block table; NULL: block b is sequence b's */
    pa_ssize tbs0, bsz;             /* its row stride, the block size (contiguous: S_max) */
    const int64_t *cu;              /* packed (cu_seqlens_q): rows (total, H, E / Ev), sequence b
                                       its rows [cu[b], cu[b+1]), T unused; or NULL */
    int bits[2];                    /* pa_qbits: an int8 / int4 / fp8 pool, its new rows float32 */
    float *sc[2];                   /* its scales: a pool as the cache's, (block, head, row, group) */
    pa_ssize sst[2][4], G[2];
    int rot, kdt;                   /* rotary (bind_rotary.h): the keys, of the compute dtype, */
    pa_rope rope;                   /* rotated as written into the pool (stored as kdt) */
} pa_kv_append;

/* writes a's rows into the caches (pa_attn_call's before; no GIL) */
void pa_kv_append_run(void *ctx);
/* the checks every append makes after its shapes: rotary's positions and,
 * quantized, every new row finite (seq names B's axis in the message, pool
 * the cache). -1 with an exception set. */
int pa_kv_append_check(const pa_kv_append *ap, const char *seq, const char *pool);

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
int pa_bind_paged(PyObject *paged, PyObject *append, pa_attn_call *c, pa_cache *cc, pa_kv_append *ap);

#endif
