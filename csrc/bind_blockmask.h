/*
 * bind_blockmask.h -- the binding of block masks (pyattn.BlockMask, issue
 * #26; csrc/ops/blockmask.h): _C._bm_pack for the builder, and the
 * converter of sdpa's / sdpa_backward's block_mask keyword.
 */
#ifndef PYATTN_BIND_BLOCKMASK_H
#define PYATTN_BIND_BLOCKMASK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ops/ops.h"
#include "ops/blockmask.h"

extern const char pa_bm_pack_doc[];
PyObject *pa_py_bm_pack(PyObject *self, PyObject *args);

/* A call's block mask as the binding holds it: the C view and the buffers
 * it reads (released by pa_bm_release, also after a failed pa_bm_get). */
typedef struct {
    pa_bmask m;
    Py_buffer buf[4];
    int nbuf;
} pa_bm_arg;

/* o: None (c->block_mask stays NULL) or the tuple pyattn's BlockMask._c_arg
 * gives (state, index, bits, slab, L, S, q_extra, k_extra; with cu_seqlens,
 * slab has a row of heads per sequence: c->nseq * c->bt.count), checked so that
 * no read leaves its arrays; c->block_mask = &arg->m. -1 with an exception. */
int pa_bm_get(PyObject *o, pa_attn_call *c, pa_bm_arg *arg);
void pa_bm_release(pa_bm_arg *arg);

#endif
