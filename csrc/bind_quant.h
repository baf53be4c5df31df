/* bind_quant.h -- the bindings of the quantization ops (bind_quant.c), for
 * module.c's method table. */
#ifndef PYATTN_BIND_QUANT_H
#define PYATTN_BIND_QUANT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ops/quant.h"

/* pa_attn_call_of (bind_call.c): the scales of c's int8 / int4 k, v (c->k_dt,
 * c->v_dt; their element strides are bytes) into *qs (its
 * scales; qs zeroed by the caller), c->cache = qs when either is quantized. ks / vs: float32 arrays (..., S, E / G) with c's batch
 * axes, or None where that operand is not quantized; ValueError / TypeError
 * (naming k_scale / v_scale) for missing or wrong scales, and for what the
 * quantized paths do not take (weights, precision "bf16", head dims over
 * 512, values not contiguous along a row). -1 with an exception set. */
int pa_bind_kv_scales(PyObject *ks, PyObject *vs, pa_attn_call *c, int want_w, pa_cache *qs);
/* pa_get_append (bind_append.c): the scales (B, H, S_max, D / G) of quantized cache
 * x (0: k, 1: v) for its new rows: float32, aligned, writeable; sets *sc,
 * the element strides st[4] and the group size *G. -1 with an exception. */
int pa_append_scales(PyObject *o, int x, pa_ssize B, pa_ssize H, pa_ssize S, pa_ssize D, float **sc,
                     pa_ssize *st, pa_ssize *G);

PyObject *pa_py_quantize(PyObject *self, PyObject *args);
PyObject *pa_py_dequantize(PyObject *self, PyObject *args);
extern const char pa_quantize_doc[], pa_dequantize_doc[];

#endif
