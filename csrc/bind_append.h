/*
 * bind_append.h -- the contiguous KV cache append of _C.sdpa's append=
 * (bind_append.c): the new rows checked in full, then written by the op
 * (pa_attn_call's before) once everything the call needs is allocated.
 *
 * Shape legend: B batch, H heads, T new rows, S_max cache rows, E / Ev head
 * dims of k / v.
 */
#ifndef PYATTN_BIND_APPEND_H
#define PYATTN_BIND_APPEND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pyattn.h"
#include "ops/rotary.h"

/* attention_with_kvcache's new rows: key / value (B, H, T, E / Ev), stored
 * as the caches are, copied into rows [pos[b], pos[b] + T) of k_cache /
 * v_cache (B, H, S_max, E / Ev) by pa_attention once everything the call
 * needs is allocated (opts.before), so a failing call writes nothing. */
typedef struct {
    char *cache[2];
    const char *rows[2];
    pa_ssize cst[2][4], rst[2][4];  /* element strides */
    pa_ssize B, H, T, D[2];
    size_t es[2];
    const int64_t *pos;
    int bits[2];                    /* 8 / 4: an int8 / int4 cache, its new rows float32 */
    float *sc[2];                   /* its scales (B, H, S_max, D / G) */
    pa_ssize sst[2][4], G[2];
    int rot, kdt;                   /* rotary: the keys (float32 / float64) rotated as written */
    pa_rope rope;                   /* into k_cache, stored as kdt (bind_rotary.h) */
} pa_kv_append;

/* writes a's rows into the caches (pa_attn_call's before; no GIL) */
void pa_kv_append_run(void *ctx);
/* append = (k_cache, v_cache, key, value, positions (B,) int64[, k_scale,
 * v_scale][, rotary]) checked in full into *ap, before the call allocates
 * or writes anything. -1 with an exception set. */
int pa_get_append(PyObject *o, pa_kv_append *ap);

#endif
