/*
 * bind_config.h -- what a call runs on and what the build is (bind_config.c):
 * the kernel family in use and the call's threads, for the entries; the
 * threads, select_isa, config, families, the benchmark's probes and the
 * allocation-failure hook, for module.c's method table.
 */
#ifndef PYATTN_BIND_CONFIG_H
#define PYATTN_BIND_CONFIG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "family.h"

/* PyInit__C: the machine's best family (PYATTN_ISA capped) for new calls */
void pa_config_init(void);
/* the family new calls use: an entry reads it once, before releasing the
 * GIL, and hands it to its op */
const pa_family *pa_family_now(void);
/* threads for this call: nthreads in [1, PA_MAX_THREADS], else the pool's */
int pa_call_threads(int req);

PyObject *pa_py_set_num_threads(PyObject *self, PyObject *arg);
PyObject *pa_py_get_num_threads(PyObject *self, PyObject *unused);
PyObject *pa_py_select_isa(PyObject *self, PyObject *arg);
PyObject *pa_py_config(PyObject *self, PyObject *unused);
PyObject *pa_py_set_decode_read(PyObject *self, PyObject *arg);
PyObject *pa_py_families(PyObject *self, PyObject *unused);
PyObject *pa_py_fma_probe(PyObject *self, PyObject *arg);
PyObject *pa_py_bf16_probe(PyObject *self, PyObject *arg);
PyObject *pa_py_read_probe(PyObject *self, PyObject *arg);
PyObject *pa_py_gemm_probe(PyObject *self, PyObject *args);
PyObject *pa_py_alloc_hook(PyObject *self, PyObject *arg);

#endif
