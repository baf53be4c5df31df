/* attention_ref.c -- the exact attention path, portable C
 * (attention_ref.inc, once per dtype). */
#include <math.h>
#include "attention.h"
#include "quant.h"
#include "threads.h"
#include "kernels/ref/quant_ref.h"

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

/* Element e of key row j / element d of value row j as the exact path reads
 * it, for an int8 / int4 / fp8 K or V (a->kv.ks / a->kv.vs): dequantize()'s value, the
 * stored integer (fp8: its exact value) times its group's float32 scale, exact in float32 -- the
 * contract's "attention over dequantize(cache)". Other operands are read
 * with pa_ld_* (attention_ref.inc). Quantized caches compute in float32. */
static inline float ref_qel(const void *row, pa_ssize e, int bits)
{
    return pa_qfp8(bits) ? pa_fp8_value(((const uint8_t *)row)[e], bits) : (float)pa_qval(row, e, bits);
}
static inline float ref_qk(const pa_attn_args *a, pa_ssize j, pa_ssize e)
{
    return ref_qel((const char *)a->k + pa_kv_row(&a->kv, PA_KV_K, j), e, pa_qbits(a->k_dt)) *
           a->kv.ks[pa_kv_row(&a->kv, PA_KV_KS, j) + e / a->kv.kG];
}
static inline float ref_qv(const pa_attn_args *a, pa_ssize j, pa_ssize d)
{
    return ref_qel((const char *)a->v + pa_kv_row(&a->kv, PA_KV_V, j), d, pa_qbits(a->v_dt)) *
           a->kv.vs[pa_kv_row(&a->kv, PA_KV_VS, j) + d / a->kv.vG];
}

#define PA_TEMPLATE "ops/attention_ref.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
