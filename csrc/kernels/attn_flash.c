/* attn_flash.c -- the tiled (FlashAttention-2) attention kernel, portable C
 * around the family's GEMM micro-kernel and vector exp (attn_flash.inc). */
#include <math.h>
#include "dispatch.h"

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)

/* max ignoring NaN, as `if (x > m) m = x` */
static inline double pa_rowmax_f64(const double *s, pa_ssize n)
{
    double m = -INFINITY;
    for (pa_ssize j = 0; j < n; j++)
        if (s[j] > m) m = s[j];
    return m;
}

float pa_rowmax_f32_ref(const float *s, pa_ssize n)
{
    float m = -INFINITY;
    for (pa_ssize j = 0; j < n; j++)
        if (s[j] > m) m = s[j];
    return m;
}

#define T float
#define DT PA_F32
#define EXP expf
#define ROWMAX(s, n) pa_kernels.rowmax_float(s, n)
#define PA_NAME pa_attn_f32_flash
#define PA_WS_NAME pa_attn_ws_f32_flash
#define PA_REF_NAME pa_attn_f32_ref
#define PA_REF_WS_NAME pa_attn_ws_f32_ref
#include "attn_flash.inc"
#undef T
#undef DT
#undef EXP
#undef ROWMAX
#undef PA_NAME
#undef PA_WS_NAME
#undef PA_REF_NAME
#undef PA_REF_WS_NAME

#define T double
#define DT PA_F64
#define EXP exp
#define ROWMAX(s, n) pa_rowmax_f64(s, n)
#define PA_NAME pa_attn_f64_flash
#define PA_WS_NAME pa_attn_ws_f64_flash
#define PA_REF_NAME pa_attn_f64_ref
#define PA_REF_WS_NAME pa_attn_ws_f64_ref
#include "attn_flash.inc"

/* reference exp rows: s[j] = exp(s[j] - m) (0 for -inf), returns the sum */
float pa_exprow_f32_ref(float *s, pa_ssize n, float m)
{
    float sum = 0;
    for (pa_ssize j = 0; j < n; j++) {
        float e = (s[j] == -INFINITY) ? 0.0f : expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    return sum;
}

double pa_exprow_f64_ref(double *s, pa_ssize n, double m)
{
    double sum = 0;
    for (pa_ssize j = 0; j < n; j++) {
        double e = (s[j] == -INFINITY) ? 0.0 : exp(s[j] - m);
        s[j] = e;
        sum += e;
    }
    return sum;
}
