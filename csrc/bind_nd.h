/*
 * bind_nd.h -- an ndarray argument of the bindings seen as a strided view
 * (bind_nd.c): its data, dtype code, shape and element strides. Shared by
 * bind_paged.c (pools, rows, tables) and bind_rotary.c (rotary tables,
 * rows to rotate), which check the dtypes they accept themselves.
 */
#ifndef PYATTN_BIND_ND_H
#define PYATTN_BIND_ND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pyattn.h"

#define PA_ND_INT64 (-2)   /* dtype code of an int64 array */
#define PA_ND_OTHER (-1)   /* any dtype without a code */

typedef struct {
    char *data;
    int dtype;             /* PA_F32, PA_F64, PA_F16, PA_BF16 (uint16), PA_I8, PA_I4 (uint8),
                              PA_F8E4, PA_F8E5 (ml_dtypes' fp8),
                              PA_ND_INT64 or PA_ND_OTHER */
    pa_ssize shape[4], st[4];  /* st: strides in elements */
} pa_nd;

/* the dtype code of o, or -1 with TypeError naming `name` set when o is
 * not an ndarray */
int pa_nd_dtype(PyObject *o, const char *name);

/* PA_F8E4 / PA_F8E5 when o is an ndarray of ml_dtypes' float8_e4m3fn /
 * float8_e5m2 (a user dtype of one byte, found by its scalar type's name so
 * that ml_dtypes stays optional), else -1; no exception set */
int pa_nd_fp8(PyObject *o);

/* o (an ndarray, after pa_nd_dtype) must be nd-D (nd <= 4), aligned, in
 * native byte order (writeable if asked), with strides that are multiples
 * of its item size; *r describes it. -1 with ValueError naming `name` set. */
int pa_nd_view(PyObject *o, const char *name, int nd, int writeable, pa_nd *r);

#endif
