/*
 * bind_ukr.h -- the binding of the micro-kernel shape choice (bind_ukr.c over
 * ukr_select.c): _C._ukr_info, _C._ukr_select, _C._ukr_classify (module.c's
 * method table; pyattn/_ukr.py is their one user besides the tests).
 */
#ifndef PYATTN_BIND_UKR_H
#define PYATTN_BIND_UKR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *pa_py_ukr_info(PyObject *self, PyObject *unused);
PyObject *pa_py_ukr_select(PyObject *self, PyObject *arg);
PyObject *pa_py_ukr_classify(PyObject *self, PyObject *args);
extern const char pa_ukr_info_doc[], pa_ukr_select_doc[], pa_ukr_classify_doc[];

#endif
