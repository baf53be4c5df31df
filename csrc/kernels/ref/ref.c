/*
 * ref.c -- the portable kernels, any CPU: the generic family, and the
 * reference twin every SIMD kernel falls back to. Each body is included
 * once per dtype (T, PA_DT, PA_EXP: the C library's exp for T).
 */
#include <math.h>
#include "kernels/kernels.h"

#define PA_CAT_(a, b) a##b
#define PA_CAT(a, b) PA_CAT_(a, b)
#define PA_REF(op) PA_CAT(PA_CAT(pa_##op##_, PA_DT), _ref)

#define T float
#define PA_DT f32
#define PA_EXP expf
#include "gemm_ref.inc"
#include "tilesm_ref.inc"
#include "softmax_ref.inc"
#undef T
#undef PA_DT
#undef PA_EXP

#define T double
#define PA_DT f64
#define PA_EXP exp
#include "gemm_ref.inc"
#include "tilesm_ref.inc"
#include "softmax_ref.inc"
#undef T
#undef PA_DT
#undef PA_EXP
