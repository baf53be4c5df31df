/* attn_flash.c -- the tiled (FlashAttention-2) attention kernel, portable C
 * around the family's GEMM micro-kernel and softmax tile step
 * (attn_flash.inc), and the portable tile step itself. */
#include <math.h>
#include "dispatch.h"

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)

/* Portable online-softmax tile step (see pa_tilesm_float in dispatch.h);
 * vertical loops over queries, which compilers vectorise. */
#define PA_TILESM_BODY(T, EXP)                                                   \
    for (pa_ssize c = 0; c < ncols; c++) {                                       \
        T mt = -INFINITY;                                                        \
        for (pa_ssize j = 0; j < nj; j++)                                        \
            if (St[j * ld + c] > mt) mt = St[j * ld + c];                        \
        const T mold = m[c];                                                     \
        const T mnew = mt > mold ? mt : mold;                                    \
        const T msafe = mnew == -INFINITY ? (T)0 : mnew;                         \
        alpha[c] = mold == -INFINITY ? (T)0 : EXP(mold - msafe);                 \
        T sum = 0;                                                               \
        for (pa_ssize j = 0; j < nj; j++) {                                      \
            const T x = St[j * ld + c];                                          \
            const T e = x == -INFINITY ? (T)0 : EXP(x - msafe);                  \
            St[j * ld + c] = e;                                                  \
            sum += e;                                                            \
        }                                                                        \
        l[c] = l[c] * alpha[c] + sum;                                            \
        m[c] = mnew;                                                             \
    }

void pa_tilesm_f32_ref(float *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                       float *m, float *l, float *alpha)
{
    PA_TILESM_BODY(float, expf)
}

void pa_tilesm_f64_ref(double *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,
                       double *m, double *l, double *alpha)
{
    PA_TILESM_BODY(double, exp)
}

#define T float
#define DT PA_F32
#define EXP expf
#define PA_MERGE_NAME pa_attn_merge_f32_flash
#define TILESM pa_kernels.tilesm_float
#define PA_NAME pa_attn_f32_flash
#define PA_WS_NAME pa_attn_ws_f32_flash
#define PA_REF_NAME pa_attn_f32_ref
#define PA_REF_WS_NAME pa_attn_ws_f32_ref
#include "attn_flash.inc"
#undef T
#undef DT
#undef EXP
#undef PA_MERGE_NAME
#undef TILESM
#undef PA_NAME
#undef PA_WS_NAME
#undef PA_REF_NAME
#undef PA_REF_WS_NAME

#define T double
#define DT PA_F64
#define EXP exp
#define PA_MERGE_NAME pa_attn_merge_f64_flash
#define TILESM pa_kernels.tilesm_double
#define PA_NAME pa_attn_f64_flash
#define PA_WS_NAME pa_attn_ws_f64_flash
#define PA_REF_NAME pa_attn_f64_ref
#define PA_REF_WS_NAME pa_attn_ws_f64_ref
#include "attn_flash.inc"
