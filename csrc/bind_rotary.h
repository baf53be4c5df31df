/*
 * bind_rotary.h -- rotary embedding's binding (bind_rotary.c): the rotary
 * tables of an append (bind_append.c's pa_get_append, bind_paged.c's get_rows) and
 * _C.rotary, the queries' rotation (module.c's method table).
 */
#ifndef PYATTN_BIND_ROTARY_H
#define PYATTN_BIND_ROTARY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ops/rotary.h"

/* o = (cos, sin, interleaved): cos / sin ndarrays (R, half) of the compute
 * dtype cd (PA_F32 / PA_F64), one shape, 2 * half <= E; into *r. -1 with an
 * exception set (naming rotary_cos / rotary_sin). */
int pa_bind_rope(PyObject *o, int cd, pa_ssize E, pa_rope *r);
/* the new rows of sequence b sit at positions [pos[b], pos[b] + T): each
 * below r->R, else ValueError ("nothing was written"). -1 with it set. */
int pa_rope_check_rows(const pa_rope *r, pa_ssize b, int64_t pos, pa_ssize T);

PyObject *pa_py_rotary(PyObject *self, PyObject *args, PyObject *kw);
extern const char pa_rotary_doc[];

#endif
