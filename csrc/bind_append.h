/*
 * bind_append.h -- the contiguous KV cache append of _C.sdpa's append=
 * (bind_append.c): the new rows checked in full into THE append
 * (pa_kv_append, bind_paged.h: a contiguous cache is a paged one whose
 * table is the identity, one block per sequence), then written by the op
 * (pa_attn_call's before: pa_kv_append_run) once everything the call needs
 * is allocated, so a failing call writes nothing.
 *
 * Shape legend: B batch, H heads, T new rows, S_max cache rows, E / Ev head
 * dims of k / v.
 */
#ifndef PYATTN_BIND_APPEND_H
#define PYATTN_BIND_APPEND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pyattn.h"
#include "bind_paged.h"

/* append = (k_cache, v_cache, key, value, positions (B,) int64[, k_scale,
 * v_scale][, rotary]) checked in full into *ap, before the call allocates
 * or writes anything (k_cache / v_cache (B, H, S_max, E / Ev): block b of
 * the identity table; with idx (cache_batch_idx, nseq entries: the new
 * rows' B), sequence b's block is entry idx[b] of the caches' Bc, a table
 * of one column). -1 with an exception set. */
int pa_get_append(PyObject *o, const int64_t *idx, pa_ssize nseq, pa_kv_append *ap);

#endif
