/* attention_ref.c -- the exact attention path, portable C
 * (attention_ref.inc, once per dtype). */
#include <math.h>
#include "attention.h"
#include "threads.h"

/* s[BQ*BK] + acc[BQ*Ev] + m[BQ] + l[BQ] elements; 0 on overflow */
size_t pa_attn_ref_ws(int dtype, pa_ssize E, pa_ssize Ev)
{
    size_t a, b;
    const size_t n = PA_REF_BQ * PA_REF_BK + 2 * PA_REF_BQ;
    (void)E;
    if (!pa_mul_ok(PA_REF_BQ, (size_t)Ev, &a) || a > SIZE_MAX - n) return 0;
    if (!pa_mul_ok(a + n, pa_elsize(dtype), &b)) return 0;
    return b;
}

#define PA_TEMPLATE "ops/attention_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
