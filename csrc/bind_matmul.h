/*
 * bind_matmul.h -- _C.matmul, _C.softmax, _C.softmax_backward
 * (bind_matmul.c), for module.c's method table.
 */
#ifndef PYATTN_BIND_MATMUL_H
#define PYATTN_BIND_MATMUL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *pa_py_matmul(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pa_py_softmax(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pa_py_softmax_backward(PyObject *self, PyObject *args);
extern const char pa_matmul_doc[], pa_softmax_doc[], pa_softmax_backward_doc[];

#endif
