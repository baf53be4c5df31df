/* softmax_ref.c -- portable masked softmax rows (see softmax_ref.inc). */
#include <math.h>
#include "dispatch.h"

#define T float
#define EXP expf
#define PA_NAME pa_softmax_f32_ref
#include "softmax_ref.inc"
#undef T
#undef EXP
#undef PA_NAME

#define T double
#define EXP exp
#define PA_NAME pa_softmax_f64_ref
#include "softmax_ref.inc"
