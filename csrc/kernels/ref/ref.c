/*
 * ref.c -- the portable kernels, any CPU: the generic family, and the
 * reference twin every SIMD kernel falls back to. Each body is included
 * once per dtype (dtypes.inc).
 */
#include <math.h>
#include "kernels/kernels.h"

#define PA_REF(op) PA_CAT(PA_CAT(pa_##op##_, PA_DT), _ref)

#define PA_TEMPLATE "kernels/ref/gemm_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/tilesm_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "kernels/ref/softmax_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_REF
