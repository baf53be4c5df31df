/*
 * bind_call.h -- THE converter of an attention call (bind_call.c): the
 * keywords _C.sdpa and _C.sdpa_backward share (pyattn/_spec.py's
 * AttnSpec.c_kwargs) into a pa_attn_call.
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim.
 */
#ifndef PYATTN_BIND_CALL_H
#define PYATTN_BIND_CALL_H

#include "bind_views.h"
#include "bind_paged.h"

/* An attention call as the entries' keywords give it (the forward's and
 * the backward's share these: pyattn/_spec.py's AttnSpec.c_kwargs), before
 * pa_attn_call_of converts it. */
typedef struct {
    PyObject *q, *k, *v, *mask, *slopes, *sinks, *kv_len, *qoff;
    int allow;                  /* pa_get_view's allow for q, k, v */
    int causal, bf16, want_w, q8;
    double scale, dropout_p, softcap;
    unsigned long long key;
    Py_ssize_t left, right, row_div;
    PyObject *cuq, *cuk;        /* packed sequences' offsets (varlen), or None */
    PyObject *k_scale, *v_scale;    /* a quantized cache's scales, or None (pa_cache_of) */
    int paged;                      /* a paged cache: cu_seqlens_q alone (ops/paged_packed.c) */
    int seq_align;                  /* varlen: each sequence bottom-right aligned (align=) */
    PyObject *leftpad, *batch_idx;  /* cache_leftpad / cache_batch_idx (B,) int64, or None (pa_cache_of) */
} pa_call_args;

/* a's defaults (None, 1.0, -1, ...), q, k, v admitted by pa_get_view's allow */
void pa_call_args_init(pa_call_args *a, int allow);
/* checks q, k, v (views left in qkv[0..3) for the entry's own checks), the
 * mask and every option, and fills *c but for the results and the entry's
 * own operands. -1 with an exception set. */
int pa_attn_call_of(const pa_call_args *a, pa_attn_call *c, pa_view *qkv);
/* THE converter of the call's KV cache (pa_cache, ops/ops.h), after
 * pa_attn_call_of (the forward's): into *cc, in this order, the scales of an
 * int8 / int4 k, v (a's k_scale, v_scale; bind_quant.c), precision "int8"'s
 * needs, then paged = (pools, block table[, scale pools]) or None
 * (bind_paged.c, which rebinds the scales to the scale pools), and the new
 * rows of append (paged's or a contiguous cache's: bind_append.c) into *ap,
 * written by c->before. c->cache = cc when the call has a paged or a
 * quantized cache. has_bm: the call has a block mask. -1 with an exception
 * set. */
int pa_cache_of(const pa_call_args *a, PyObject *paged, PyObject *append, int has_bm, pa_attn_call *c,
                pa_cache *cc, pa_kv_append *ap);

#endif
