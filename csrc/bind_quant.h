/* bind_quant.h -- the bindings of the quantization ops (bind_quant.c), for
 * module.c's method table. */
#ifndef PYATTN_BIND_QUANT_H
#define PYATTN_BIND_QUANT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *pa_py_quantize(PyObject *self, PyObject *args);
PyObject *pa_py_dequantize(PyObject *self, PyObject *args);
extern const char pa_quantize_doc[], pa_dequantize_doc[];

#endif
