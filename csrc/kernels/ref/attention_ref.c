/* attention_ref.c -- portable fused attention (see attention_ref.inc). */
#include <math.h>
#include "dispatch.h"

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)

#define T float
#define EXP expf
#define PA_NAME pa_attn_f32_ref
#define PA_WS_NAME pa_attn_ws_f32_ref
#include "attention_ref.inc"
#undef T
#undef EXP
#undef PA_NAME
#undef PA_WS_NAME

#define T double
#define EXP exp
#define PA_NAME pa_attn_f64_ref
#define PA_WS_NAME pa_attn_ws_f64_ref
#include "attention_ref.inc"
