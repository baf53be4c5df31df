/*
 * bind_sdpa.h -- _C.sdpa, _C.sdpa_backward, _C.merge (bind_sdpa.c), for
 * module.c's method table.
 */
#ifndef PYATTN_BIND_SDPA_H
#define PYATTN_BIND_SDPA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *pa_py_sdpa(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pa_py_sdpa_backward(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pa_py_merge(PyObject *self, PyObject *args, PyObject *kw);
extern const char pa_sdpa_doc[], pa_sdpa_backward_doc[], pa_merge_doc[];

#endif
