/*
 * bind_views.h -- the bindings' ndarray arguments as views the kernels read
 * and write in place (bind_views.c): the dtype code, shape and element
 * strides of an argument; the shape checks and their messages; outputs
 * given or allocated; the mask and the per-head arrays of an entry. For
 * bind_sdpa.c, bind_call.c, bind_append.c, bind_matmul.c and bind_config.c.
 *
 * NumPy's C API: those files share one table, defined in bind_views.c and
 * imported once by PyInit__C (pa_views_import); a file includes this header
 * before any NumPy header.
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim,
 * M, N, K matmul.
 */
#ifndef PYATTN_BIND_VIEWS_H
#define PYATTN_BIND_VIEWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL pa_numpy_api
#ifndef PA_VIEWS_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "pyattn.h"
#include "ops/ops.h"

#define PA_ALLOW_BOOL 1
#define PA_ALLOW_16 2 /* float16 arrays, and uint16 arrays holding bfloat16 bits */
#define PA_ALLOW_Q 4  /* int8 arrays, uint8 arrays holding int4 pairs, ml_dtypes' fp8 (quantized caches) */

typedef struct {
    PyArrayObject *arr;     /* borrowed */
    int nd;
    int dtype;              /* PA_F32, PA_F64 or PA_BOOL */
    pa_ssize shape[PA_MAXDIMS];
    pa_ssize st[PA_MAXDIMS];/* element strides */
    char *data;
} pa_view;

static inline const char *pa_dtype_name(int d)
{
    return pa_dtypes[d].name;
}

/* PyInit__C's import_array(): the NumPy table these files share. 0, or -1
 * with ImportError set. */
int pa_views_import(void);

/* obj as an ndarray the kernels can read (or write) in place: a dtype that
 * allow admits, aligned, native, min_nd..PA_MAXDIMS axes, strides in whole
 * items (int4: the last axis counts values). -1 with an exception set. */
int pa_get_view(PyObject *obj, const char *name, int min_nd, int allow, int writeable, pa_view *v);
/* the compute dtype of n operands that may be stored in 16 bits (names: for
 * the messages); -1 with TypeError set */
int pa_compute_of(const pa_view *const *vs, int n, const char *names);
/* v's shape as a Python string (new reference) */
PyObject *pa_shape_str(const pa_view *v);
/* ValueError "<name> has shape ..., which does not match <what> of shape
 * ..."; returns -1 */
int pa_shape_error(const char *name, const pa_view *a, const char *what, const pa_view *b);
/* the leading nb axes of a and b equal (and their ndim); -1 with ValueError */
int pa_same_batch(const pa_view *a, const char *an, const pa_view *b, const char *bn, int nb);
/* the nb batch axes of v; v as an operand with nb batch axes */
void pa_batch_of(const pa_view *v, int nb, pa_batch *bt);
void pa_operand_of(const pa_view *v, int nb, pa_operand *o);
/* a new C-contiguous float32 / float64 array (NULL with MemoryError) */
PyArrayObject *pa_new_array(int nd, const pa_ssize *shape, int dtype, const char *what);
/* the same, its data from blocks that large arrays freed before (kept a
 * few at a time instead of handed back to the OS: no page faults on the
 * next call's first writes; the backward's gradients), an ordinary
 * ndarray; pa_kept_release frees the blocks kept (module teardown) */
PyArrayObject *pa_new_array_kept(int nd, const pa_ssize *shape, int dtype, const char *what);
void pa_kept_release(void);
/* out_obj (None: allocated) checked for exactly shape and dtype, writeable;
 * a new reference, *ov its view; NULL with an exception set */
PyArrayObject *pa_get_out(PyObject *out_obj, int nd, const pa_ssize *shape, int dtype, pa_view *ov,
                          const char *what);
/* attn_mask: None, or bool / dtype of like's shape; *kind its PA_MASK_* */
int pa_get_mask(PyObject *mo, const pa_view *like, int dtype, pa_view *m, int *kind);
/* an is_causal code: 0, 1 or 2 */
int pa_check_causal(int causal);
/* None, or a 1-D contiguous npy_type array of count entries (*ptr) */
int pa_get_perbatch(PyObject *o, const char *name, int npy_type, pa_ssize count, const void **ptr);

#endif
