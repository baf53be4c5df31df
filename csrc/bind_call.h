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
#include "ops/quant.h"

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
    PyObject *k_scale, *v_scale;    /* a quantized cache's scales, or None */
    pa_cache *qsc;                  /* where pa_attn_call_of puts them (NULL: not accepted) */
    int paged;                      /* a paged cache: cu_seqlens_q alone (ops/paged_packed.c) */
    int seq_align;                  /* varlen: each sequence bottom-right aligned (align=) */
} pa_call_args;

/* a's defaults (None, 1.0, -1, ...), q, k, v admitted by pa_get_view's allow */
void pa_call_args_init(pa_call_args *a, int allow);
/* checks q, k, v (views left in qkv[0..3) for the entry's own checks), the
 * mask and every option, and fills *c but for the results and the entry's
 * own operands. -1 with an exception set. */
int pa_attn_call_of(const pa_call_args *a, pa_attn_call *c, pa_view *qkv);

#endif
