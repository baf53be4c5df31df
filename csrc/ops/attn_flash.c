/* attn_flash.c -- the tiled (FlashAttention-2) forward and backward: frame
 * code around a family's GEMM micro-kernel and tile steps (attn_flash.inc,
 * attn_backward.inc, once per dtype). */
#include <math.h>
#include <string.h>
#include "attention.h"
#include "quant.h"
#include "threads.h"
#include "tpack.h"

/* n rows x cols of a strided operand stored in 16 bits (sd: PA_F16 or
 * PA_BF16), widened into dst (row stride ld) by the family's kernel where
 * rows are contiguous. The tiled paths call it once per key tile: the
 * operand is read in place, never copied whole. */
static void widen_rows(const pa_family *f, int sd, const void *p, pa_ssize rs, pa_ssize cs,
                       pa_ssize n, pa_ssize cols, float *dst, pa_ssize ld)
{
    const uint16_t *h = (const uint16_t *)p;
    if (cs == 1) {
        const pa_widen_fn w = f->widen[sd].fn;
        for (pa_ssize r = 0; r < n; r++) w(dst + r * ld, h + r * rs, cols);
    } else {
        for (pa_ssize r = 0; r < n; r++)
            for (pa_ssize c = 0; c < cols; c++) dst[r * ld + c] = pa_load_f32(h, r * rs + c * cs, sd);
    }
}

#ifndef PA_QWIDEN_ROWS
#define PA_QWIDEN_ROWS 4        /* rows a qwiden call (rows in one piece) */
#endif
/* n rows of a quantized K (v = 0) or V (v = 1) from key j, within one
 * block (a run: pa_kv_run), dequantized into dst (row stride ld) by the
 * family's qwiden (int8, int4 and fp8), rows and scales read through the accessor: the tiled
 * paths' key tiles */
static void qwiden_rows(const pa_family *f, const pa_attn_args *a, int v, pa_ssize j, pa_ssize n, float *dst,
                        pa_ssize ld)
{
    const char *p = (const char *)(v ? a->v : a->k) + pa_kv_row(&a->kv, v ? PA_KV_V : PA_KV_K, j);
    const float *sc = (v ? a->kv.vs : a->kv.ks) + pa_kv_row(&a->kv, v ? PA_KV_VS : PA_KV_KS, j);
    const pa_ssize rs = v ? a->v_rs : a->k_rs, srs = a->kv.rs[v ? PA_KV_VS : PA_KV_KS];
    const pa_ssize cols = v ? a->Ev : a->E, G = v ? a->kv.vG : a->kv.kG;
    const int bits = pa_qbits(v ? a->v_dt : a->k_dt);
    if (G > 0 && cols % G == 0 && ld == cols && rs == (bits == 4 ? cols / 2 : cols) && srs == cols / G) {
        /* rows, scales and dst in one piece each: PA_QWIDEN_ROWS rows a call, as one row of
           their values (the same value for each: the same bits, fewer calls) */
        for (pa_ssize r = 0; r < n; r += PA_QWIDEN_ROWS)
            f->qwiden.fn(dst + r * ld, p + r * rs, sc + r * srs, pa_min(PA_QWIDEN_ROWS, n - r) * cols, G, bits);
        return;
    }
    for (pa_ssize r = 0; r < n; r++) f->qwiden.fn(dst + r * ld, p + r * rs, sc + r * srs, cols, G, bits);
}

/* an fp8 K or V: the rows paths widen its tiles into float32 (rows_gathered_) */
static inline int pa_kv_fp8(const pa_attn_args *a)
{
    return pa_qfp8(pa_qbits(a->k_dt)) || pa_qfp8(pa_qbits(a->v_dt));
}

/* ---- precision "bf16" with an fp8 cache (a->qbf16 on the gathered rows
 * path, rows_qbf16_gathered_): the key tile's codes widened unscaled by the
 * family's qwiden (scale 1: each code's exact value -- an fp8 byte's, or an
 * int8 / int4 key's beside fp8 values), then the two kernels below, portable
 * C with the same operations in the same order on every family. */

/* n rows of K's codes from key j (one run of a block) into dst (row stride
 * ld), unscaled */
static void qcode_rows(const pa_family *f, const pa_attn_args *a, pa_ssize j, pa_ssize n, float *dst, pa_ssize ld)
{
    const char *p = (const char *)a->k + pa_kv_row(&a->kv, PA_KV_K, j);
    const pa_ssize G = a->kv.kG > 0 ? a->kv.kG : 1, ng = a->E / G;
    float ones[PA_FLASH_MAXD];
    for (pa_ssize g = 0; g < ng; g++) ones[g] = 1.0f;
    const int bits = pa_qbits(a->k_dt);
    for (pa_ssize r = 0; r < n; r++) f->qwiden.fn(dst + r * ld, p + r * a->k_rs, ones, a->E, G, bits);
}

/* qrowdot's rule (csrc/README.md) on R query rows Q (bfloat16 values in
 * float32) against nj code rows K (keys j0..., row stride E), each key's group scales
 * read through the accessor: per group, 16 partials gp[e % 16] = fma(q_e,
 * k_e, gp), from +0; p[t] = fma(gp[t], scale_g, p[t]); the 16 p pairwise;
 * the score that times a->scale. Where every q_e of a row is 0 or a normal
 * float below 2^100, each product q_e k_e (at most 8 + 4 significant bits;
 * |k_e| < 2^16, its last bit at least 2^-16) is exact in float32, so
 * gp + q_e * k_e (multiply, then add: the loop vectorises) is the fma's
 * value; other rows take fmaf. The fma is correctly rounded wherever it
 * runs: the x86 SIMD families (FMA3 on every CPU they run on) take the
 * copy compiled for it (qbf16_dot_fma), the others the C library's fmaf --
 * the same bits. */
static inline __attribute__((always_inline)) void
qbf16_dot_body(const pa_attn_args *a, const float *Q, pa_ssize qrs, pa_ssize R, const float *K,
               pa_ssize j0, pa_ssize nj, float *s, pa_ssize ss)
{
    const pa_ssize E = a->E, G = a->kv.kG > 0 ? a->kv.kG : 1;
    const float scale = (float)a->scale;
    for (pa_ssize r = 0; r < R; r++) {
        const float *q = Q + r * qrs;
        int exact = G % 16 == 0;
        for (pa_ssize e = 0; e < E; e++) {
            const float m = fabsf(q[e]);
            exact &= m == 0 || (m >= 0x1p-126f && m < 0x1p100f);
        }
        for (pa_ssize j = 0; j < nj; j++) {
            const float *k = K + j * E;
            const float *sc = a->kv.ks + pa_kv_row(&a->kv, PA_KV_KS, j0 + j);
            float p[16] = {0};
            for (pa_ssize g0 = 0; g0 < E; g0 += G) {
                float gp[16] = {0};
                if (exact)
                    for (pa_ssize e = g0; e < g0 + G; e += 16)
                        for (int t = 0; t < 16; t++) gp[t] = gp[t] + q[e + t] * k[e + t];
                else
                    for (pa_ssize e = g0; e < g0 + G; e++) gp[e % 16] = fmaf(q[e], k[e], gp[e % 16]);
                const float sg = sc[g0 / G];
                for (int t = 0; t < 16; t++) p[t] = fmaf(gp[t], sg, p[t]);
            }
            for (int w = 8; w >= 1; w /= 2)
                for (int t = 0; t < w; t++) p[t] = p[t] + p[t + w];
            s[r * ss + j] = p[0] * scale;
        }
    }
}

static void qbf16_dot_c(const pa_attn_args *a, const float *Q, pa_ssize qrs, pa_ssize R, const float *K,
                        pa_ssize j0, pa_ssize nj, float *s, pa_ssize ss)
{
    qbf16_dot_body(a, Q, qrs, R, K, j0, nj, s, ss);
}

#ifdef PA_HAVE_X86_KERNELS
__attribute__((target("avx2,fma")))
static void qbf16_dot_fma(const pa_attn_args *a, const float *Q, pa_ssize qrs, pa_ssize R, const float *K,
                          pa_ssize j0, pa_ssize nj, float *s, pa_ssize ss)
{
    qbf16_dot_body(a, Q, qrs, R, K, j0, nj, s, ss);
}
#endif

static void qbf16_dot(const pa_family *f, const pa_attn_args *a, const float *Q, pa_ssize qrs, pa_ssize R,
                      const float *K, pa_ssize j0, pa_ssize nj, float *s, pa_ssize ss)
{
#ifdef PA_HAVE_X86_KERNELS
    if (f->isa == PA_ISA_AVX2 || f->isa == PA_ISA_AVX512 || f->isa == PA_ISA_AVX512_EMU) {
        qbf16_dot_fma(a, Q, qrs, R, K, j0, nj, s, ss);
        return;
    }
#endif
    (void)f;
    qbf16_dot_c(a, Q, qrs, R, K, j0, nj, s, ss);
}

/* the weights P (R x nj, row stride ps) times the value tile Vw (row
 * stride vrs) added into acc: keys in order, a weight of 0 skipped,
 * acc[d] = fma(P, v[d], acc[d]) -- the SIMD families' rowpv, operation by
 * operation, for the generic family (whose own multiplies, then adds) */
static void qbf16_pv(const float *P, pa_ssize ps, pa_ssize R, const float *Vw, pa_ssize vrs, pa_ssize nj,
                     pa_ssize Ev, float *acc, pa_ssize ald)
{
    for (pa_ssize r = 0; r < R; r++)
        for (pa_ssize j = 0; j < nj; j++) {
            const float pj = P[r * ps + j];
            if (pj == 0) continue;
            const float *v = Vw + j * vrs;
            for (pa_ssize d = 0; d < Ev; d++) acc[r * ald + d] = fmaf(pj, v[d], acc[r * ald + d]);
        }
}

#define PA_TEMPLATE "ops/attn_flash.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "ops/attn_backward.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE

/* ---- precision "bf16" (float32 compute): the tiled forward on bfloat16
 * products (the family's gemm_bf16: vdpbf16ps, or its exact emulation).
 * q, k, v are rounded to bfloat16 as they are packed into pair panels;
 * per key tile (the fixed grid of PA_FLASH_BK keys):
 *   St = K_tile Q^T (bfloat16 products, float32 sums), then x scale
 *   (float32: the scale is not rounded into q; a power of two is folded
 *   into q before the rounding, which gives the same values);
 *   the score rule and the online-softmax tile step as in the float32 path
 *   (the running sums l of the unrounded exp);
 *   P = exp(St - m_running) rounded to bfloat16 (after dropout), and
 *   O += P V_tile on bfloat16 products -- the weights are rounded relative
 *   to the running max of the tiles so far, as PyTorch's and OpenVINO's
 *   bfloat16 flash kernels round them (pyattn/_reference.py models it).
 * No weights path; few query rows (decode shapes, pa_bf16_rows_shape) take
 * the rows path below (bf16_rows_run) instead. */

/* a stored bfloat16 as pa_f32_to_bf16(pa_load_f32(...)) gives it: itself,
 * a NaN quieted (integer operations, so loops over it vectorise) */
static inline uint32_t bf16_keep(uint32_t h)
{
    return (h & 0x7fffu) > 0x7f80u ? (h | 0x40u) : h;
}

/* The float32 bits of element i of a value row stored in float32, or in
 * bfloat16 (bf: its bits << 16, the widening; pa_bf16_round of those gives
 * the stored bits back, a NaN quieted -- what bf16_keep gives) */
static inline uint32_t v_bits(const void *v, int bf, pa_ssize i)
{
    return bf ? (uint32_t)((const uint16_t *)v)[i] << 16 : pa_f32_bits(((const float *)v)[i]);
}

/* V's unit-stride rows [j0, j0 + nj) stored in float32 or bfloat16 (bf) as
 * B pair panels: a 32-bit word per key pair and column */
static inline __attribute__((always_inline)) void bf16_pack_v_rows(const pa_attn_args *a, pa_ssize j0, pa_ssize nj,
                                                                   int NR, pa_ssize evp, const int bf, uint16_t *Vp)
{
    const pa_ssize Ev = a->Ev, nj2 = pa_round_up(nj, 2);
    for (pa_ssize q2 = 0; q2 < nj2 / 2; q2++) {
        /* an offset is any sign (a negative row stride): "no second key" is a flag */
        const int two = 2 * q2 + 1 < nj;
        const pa_ssize o0 = pa_kv_row(&a->kv, PA_KV_V, j0 + 2 * q2);
        const pa_ssize o1 = two ? pa_kv_row(&a->kv, PA_KV_V, j0 + 2 * q2 + 1) : 0;
        for (pa_ssize c0 = 0; c0 < evp; c0 += NR) {
            uint32_t *w = (uint32_t *)(Vp + c0 * nj2) + q2 * NR;
            const pa_ssize nc = pa_min(NR, pa_max(Ev - c0, 0));
            if (two)
                for (pa_ssize j = 0; j < nc; j++)
                    w[j] = (pa_bf16_round(v_bits(a->v, bf, o1 + c0 + j)) & 0xffff0000u) |
                           (pa_bf16_round(v_bits(a->v, bf, o0 + c0 + j)) >> 16);
            else
                for (pa_ssize j = 0; j < nc; j++) w[j] = pa_bf16_round(v_bits(a->v, bf, o0 + c0 + j)) >> 16;
            for (pa_ssize j = nc; j < NR; j++) w[j] = 0;
        }
    }
}

/* Keys [j0, j0 + nj) of K and V, rounded to bfloat16, as the pair panels
 * of gemm_bf16: K as A panels of MR keys (pairs along E: rup(BK, MR) x
 * rup(E, 2) elements), V as B panels of NR columns (pairs along the keys:
 * rup(nj, 2) x rup(Ev, NR)); zero-padded. */
void pa_bf16_pack_kv(const pa_family *f, const pa_attn_args *a, pa_ssize j0, pa_ssize nj,
                     uint16_t *Kp, uint16_t *Vp)
{
    const int MR = f->gemm_bf16.mr, NR = f->gemm_bf16.nr;
    const pa_ssize E = a->E, Ev = a->Ev;
    const pa_ssize e2 = pa_round_up(E > 0 ? E : 1, 2), evp = pa_round_up(Ev > 0 ? Ev : 1, NR), nj2 = pa_round_up(nj, 2);
    const int kf = a->k_dt == PA_F32 && a->k_cs == 1, vf = a->v_dt == PA_F32 && a->v_cs == 1;
    const int kb = a->k_dt == PA_BF16 && a->k_cs == 1, vb = a->v_dt == PA_BF16 && a->v_cs == 1;
    for (pa_ssize r0 = 0; r0 < pa_round_up(nj, MR); r0 += MR)
        for (int i = 0; i < MR; i++) {
            const pa_ssize r = r0 + i;
            uint16_t *dst = Kp + r0 * e2 + 2 * i;
            if (r >= nj) {
                for (pa_ssize q2 = 0; q2 < e2 / 2; q2++) dst[q2 * MR * 2] = dst[q2 * MR * 2 + 1] = 0;
                continue;
            }
            if (kb) {                                /* stored bfloat16: the words as they are */
                const uint16_t *src = (const uint16_t *)a->k + pa_kv_row(&a->kv, PA_KV_K, j0 + r);
                uint32_t *w = (uint32_t *)(Kp + r0 * e2) + i;
                for (pa_ssize q2 = 0; q2 < E / 2; q2++)
                    w[q2 * MR] = bf16_keep(src[2 * q2]) | bf16_keep(src[2 * q2 + 1]) << 16;
                if (E & 1) w[(E / 2) * MR] = bf16_keep(src[E - 1]);
                if (E == 0) w[0] = 0;                /* the pad pair */
                continue;
            }
            if (kf) {                                /* a 32-bit word per pair */
                const float *src = (const float *)a->k + pa_kv_row(&a->kv, PA_KV_K, j0 + r);
                uint32_t *w = (uint32_t *)(Kp + r0 * e2) + i;
                for (pa_ssize q2 = 0; q2 < E / 2; q2++) w[q2 * MR] = pa_bf16_pair(src[2 * q2], src[2 * q2 + 1]);
                if (E & 1) w[(E / 2) * MR] = pa_bf16_round(pa_f32_bits(src[E - 1])) >> 16;
                if (E == 0) w[0] = 0;                /* the pad pair */
                continue;
            } else {
                for (pa_ssize e = 0; e < E; e++)
                    dst[(e >> 1) * MR * 2 + (e & 1)] =
                        pa_f32_to_bf16(pa_load_f32(a->k, pa_kv_row(&a->kv, PA_KV_K, j0 + r) + e * a->k_cs, a->k_dt));
            }
            for (pa_ssize e = E; e < e2; e++) dst[(e >> 1) * MR * 2 + (e & 1)] = 0;   /* pad: E odd or 0 */
        }
    if (vb && nj > 0) {                              /* stored bfloat16 (bf a constant: two copies, */
        bf16_pack_v_rows(a, j0, nj, NR, evp, 1, Vp);  /* no per-element select) */
        return;
    }
    if (vf && nj > 0) {
        bf16_pack_v_rows(a, j0, nj, NR, evp, 0, Vp);
        return;
    }
    for (pa_ssize q2 = 0; q2 < nj2 / 2; q2++)
        for (int t = 0; t < 2; t++) {
            const pa_ssize r = 2 * q2 + t;
            for (pa_ssize c0 = 0; c0 < evp; c0 += NR) {
                uint16_t *dst = Vp + c0 * nj2 + q2 * NR * 2 + t;
                for (int j = 0; j < NR; j++) {
                    const pa_ssize d = c0 + j;
                    dst[2 * j] = (r < nj && d < Ev)
                        ? pa_f32_to_bf16(vf ? ((const float *)a->v)[pa_kv_row(&a->kv, PA_KV_V, j0 + r) + d]
                                            : pa_load_f32(a->v, pa_kv_row(&a->kv, PA_KV_V, j0 + r) + d * a->v_cs, a->v_dt))
                        : 0;
                }
            }
        }
}

/* elements of one key tile's packed K and V (pa_bf16_pack_kv) */
pa_ssize pa_bf16_kv_tile(const pa_family *f, pa_ssize E, pa_ssize Ev)
{
    const pa_ssize e2 = pa_round_up(E > 0 ? E : 1, 2), evp = pa_round_up(Ev > 0 ? Ev : 1, f->gemm_bf16.nr);
    return pa_round_up(PA_FLASH_BK, f->gemm_bf16.mr) * e2 + PA_FLASH_BK * evp;
}

static size_t flash_bf16_ws(const pa_family *f, pa_ssize E, pa_ssize Ev)
{
    const pa_gemm_kernel *g = &f->gemm_bf16;
    const pa_ssize BQ = f->attn_bq[PA_F32], BK = PA_FLASH_BK;
    const pa_ssize e2 = pa_round_up(E > 0 ? E : 1, 2), evp = pa_round_up(Ev > 0 ? Ev : 1, g->nr);
    const pa_ssize qcmax = pa_round_up(BQ, pa_attn_lcm(g->mr, g->nr));
    /* uint16: Qp (qcmax x e2) + Kp (rup(BK, MR) x e2) + Pp (qcmax x BK) + Vp (BK x evp);
     * float: St (BK x qcmax) + O (qcmax x evp) + m, l, alpha */
    const size_t u16 = (size_t)(qcmax * e2 + pa_round_up(BK, g->mr) * e2 + qcmax * BK + BK * evp);
    const size_t f32 = (size_t)(BK * qcmax + qcmax * evp + 3 * qcmax);
    return (size_t)pa_round_up((pa_ssize)(u16 * sizeof(uint16_t)), 64) + f32 * sizeof(float);
}

/* element e of a query row: float32, or bfloat16 (stored as uint16) widened */
static inline float q_elem(const void *row, int bf, pa_ssize e)
{
    return bf ? pa_bf16_to_f32(((const uint16_t *)row)[e]) : ((const float *)row)[e];
}

/* One query block of the bfloat16 path and its workspace. */
typedef struct {
    const pa_gemm_kernel *g;
    pa_ssize i0, nq, qc, ld, e2, evp;
    uint16_t *Qp;           /* B panels: pairs along E, NR queries */
    uint16_t *Kp;           /* A panels: pairs along E, MR keys */
    uint16_t *Pp;           /* A panels: pairs along keys, MR queries */
    uint16_t *Vp;           /* B panels: pairs along keys, NR columns */
    float *St;              /* (BK, ld) */
    float *O;               /* (qc, evp) */
    float *m, *l, *alpha;
    int fold;               /* the scale went into Q */
} bf16_blk;

static void bf16_init(const pa_family *f, const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws,
                      bf16_blk *b)
{
    const pa_gemm_kernel *g = &f->gemm_bf16;
    const int MR = g->mr, NR = g->nr;
    const pa_ssize E = a->E, BK = PA_FLASH_BK, lcm = pa_attn_lcm(MR, NR);
    const pa_ssize qcmax = pa_round_up(f->attn_bq[PA_F32], lcm);
    b->g = g; b->i0 = i0; b->nq = i1 - i0;
    b->qc = pa_round_up(b->nq, lcm);
    b->ld = qcmax;
    b->e2 = pa_round_up(E > 0 ? E : 1, 2);
    b->evp = pa_round_up(a->Ev > 0 ? a->Ev : 1, NR);
    b->Qp = (uint16_t *)ws;
    b->Kp = b->Qp + qcmax * b->e2;
    b->Pp = b->Kp + pa_round_up(BK, MR) * b->e2;
    b->Vp = b->Pp + qcmax * BK;
    const size_t u16 = (size_t)(qcmax * b->e2 + pa_round_up(BK, MR) * b->e2 + qcmax * BK + BK * b->evp);
    b->St = (float *)((char *)ws + pa_round_up((pa_ssize)(u16 * sizeof(uint16_t)), 64));
    b->O = b->St + BK * b->ld;
    b->m = b->O + qcmax * b->evp; b->l = b->m + qcmax; b->alpha = b->l + qcmax;
    /* a power-of-two scale (E = 16, 64, 256, ...) commutes with the rounding:
     * it goes into Q as it is packed, and the pass over the scores is saved */
    int sexp;
    b->fold = frexp(a->scale, &sexp) == 0.5;
    const float qs = b->fold ? (float)a->scale : 1.0f;
    if ((a->q_dt == PA_F32 || a->q_dt == PA_BF16) && a->q_cs == 1 && E > 0) {
        /* Q as pair panels, a 32-bit word per pair, from float32 or stored bfloat16 rows */
        const int bf = a->q_dt == PA_BF16;
        for (pa_ssize c0 = 0; c0 < b->qc; c0 += NR)
            for (int j = 0; j < NR; j++) {
                const pa_ssize r = c0 + j;
                uint32_t *w = (uint32_t *)(b->Qp + c0 * b->e2) + j;
                if (r >= b->nq) {
                    for (pa_ssize q2 = 0; q2 < b->e2 / 2; q2++) w[q2 * NR] = 0;
                    continue;
                }
                const pa_ssize off = (i0 + r) * a->q_rs;
                const void *src = bf ? (const void *)((const uint16_t *)a->q + off)
                                     : (const void *)((const float *)a->q + off);
                for (pa_ssize q2 = 0; q2 < E / 2; q2++)
                    w[q2 * NR] = pa_bf16_pair(q_elem(src, bf, 2 * q2) * qs, q_elem(src, bf, 2 * q2 + 1) * qs);
                if (E & 1) w[(E / 2) * NR] = pa_bf16_round(pa_f32_bits(q_elem(src, bf, E - 1) * qs)) >> 16;
            }
    } else
    for (pa_ssize c0 = 0; c0 < b->qc; c0 += NR)       /* Q as pair panels */
        for (pa_ssize q2 = 0; q2 < b->e2 / 2; q2++)
            for (int j = 0; j < NR; j++)
                for (int t = 0; t < 2; t++) {
                    const pa_ssize r = c0 + j, e = 2 * q2 + t;
                    b->Qp[c0 * b->e2 + (q2 * NR + j) * 2 + t] = (r < b->nq && e < E)
                        ? pa_f32_to_bf16(pa_load_f32(a->q, (i0 + r) * a->q_rs + e * a->q_cs, a->q_dt) * qs) : 0;
                }
    for (pa_ssize r = 0; r < b->qc; r++) {
        for (pa_ssize d = 0; d < b->evp; d++) b->O[r * b->evp + d] = 0;
        b->m[r] = -INFINITY;
        b->l[r] = 0;
    }
}

/* P (St, nj keys) rounded to bfloat16, as pair panels (MR queries each):
 * one 32-bit word per query and key pair, written with integer operations
 * the compiler vectorises (pa_bf16_round) */
static inline void bf16_round_p_mr(bf16_blk *b, pa_ssize nj2, const int MR)
{
    const pa_ssize ld = b->ld;
    uint32_t nan = 0;                                /* bit 31: a NaN was seen */
    for (pa_ssize r0 = 0; r0 < b->qc; r0 += MR)
        for (pa_ssize q2 = 0; q2 < nj2 / 2; q2++) {
            const uint32_t *ea = (const uint32_t *)(b->St + 2 * q2 * ld + r0);
            const uint32_t *eb = (const uint32_t *)(b->St + (2 * q2 + 1) * ld + r0);
            uint32_t *dst = (uint32_t *)(b->Pp + r0 * nj2) + q2 * MR;
            for (int i = 0; i < MR; i++) {           /* pa_bf16_round without its NaN case */
                const uint32_t x = ea[i], y = eb[i];
                nan |= ((x & 0x7fffffffu) + 0x7fffffu) | ((y & 0x7fffffffu) + 0x7fffffu);
                dst[i] = ((y + 0x7fffu + ((y >> 16) & 1u)) & 0xffff0000u) | ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
            }
        }
    if (!(nan & 0x80000000u)) return;
    for (pa_ssize r0 = 0; r0 < b->qc; r0 += MR)      /* a NaN: again, with it */
        for (pa_ssize q2 = 0; q2 < nj2 / 2; q2++) {
            const uint32_t *ea = (const uint32_t *)(b->St + 2 * q2 * ld + r0);
            const uint32_t *eb = (const uint32_t *)(b->St + (2 * q2 + 1) * ld + r0);
            uint32_t *dst = (uint32_t *)(b->Pp + r0 * nj2) + q2 * MR;
            for (int i = 0; i < MR; i++)
                dst[i] = (pa_bf16_round(eb[i]) & 0xffff0000u) | (pa_bf16_round(ea[i]) >> 16);
        }
}
/* (the loop above with MR a constant: the rows of a panel as whole vectors;
 * the family's vector packer where it has one, the same bits) */
static void bf16_round_p(const pa_family *f, bf16_blk *b, pa_ssize nj)
{
    const pa_ssize nj2 = pa_round_up(nj, 2);
    if (nj & 1)
        for (pa_ssize c = 0; c < b->qc; c++) b->St[nj * b->ld + c] = 0;   /* the pad key */
    if (f->bf16_pack_p) {
        f->bf16_pack_p(b->St, b->ld, b->qc, nj2, b->g->mr, (uint32_t *)b->Pp);
        return;
    }
    switch (b->g->mr) {
    case 4: bf16_round_p_mr(b, nj2, 4); break;
    case 6: bf16_round_p_mr(b, nj2, 6); break;
    case 12: bf16_round_p_mr(b, nj2, 12); break;
    default: bf16_round_p_mr(b, nj2, b->g->mr); break;
    }
}

/* clean: query 0's keys of weight 0 get V rows 0 (in Vp, packed here) */
static void bf16_clean_v(bf16_blk *b, pa_ssize nj)
{
    const int MR = b->g->mr, NR = b->g->nr;
    const pa_ssize nj2 = pa_round_up(nj, 2);
    for (pa_ssize j = 0; j < nj; j++)
        if ((b->Pp[(j >> 1) * MR * 2 + (j & 1)] & 0x7fffu) == 0)
            for (pa_ssize c0 = 0; c0 < b->evp; c0 += NR)
                for (int jj = 0; jj < NR; jj++) b->Vp[c0 * nj2 + (j >> 1) * NR * 2 + 2 * jj + (j & 1)] = 0;
}

/* One key tile [j0, j0 + nj): K and V as pair panels (packed once per head
 * by the caller, a->kvp, or here), St = K_tile Q^T x scale, the score rule,
 * the tile step, O rescaled, dropout, P rounded, O += P V_tile */
static void bf16_tile(const pa_family *f, const pa_attn_args *a, bf16_blk *b, pa_ssize j0, pa_ssize nj,
                      int clean)
{
    const pa_gemm_kernel *g = b->g;
    const int MR = g->mr, NR = g->nr;
    const pa_ssize BK = PA_FLASH_BK, ld = b->ld, e2 = b->e2, nj2 = pa_round_up(nj, 2);
    const uint16_t *Kt = b->Kp, *Vt = b->Vp;
    pa_ssize vs = nj2;                               /* V panel stride: pairs of the packed tile */
    if (a->kvp && !clean) {                          /* packed whole: min(BK, S - j0) keys */
        Kt = a->kvp + (j0 / BK) * a->kvp_tile;
        Vt = Kt + pa_round_up(BK, MR) * e2;
        vs = pa_round_up(pa_min(a->S - j0, BK), 2);
    } else {
        pa_bf16_pack_kv(f, a, j0, nj, b->Kp, b->Vp);
    }
    /* the sub-tile cut of the float32 path (pa_attn_cut): a sub-tile of keys
     * outside its queries' key ranges gets -inf, as the score rule makes it */
    const int cut = !pa_attn_tile_inside(a, b->i0, b->i0 + b->nq, j0, j0 + nj) && b->qc / NR <= PA_FLASH_MAXCOLS;
    pa_ssize lo[PA_FLASH_MAXCOLS], hi[PA_FLASH_MAXCOLS];
    if (cut) pa_attn_cut(a, b->i0, b->nq, b->qc, NR, lo, hi);
    if (cut && a->bm.state) pa_bm_cut(&a->bm, b->i0, b->nq, b->qc, NR, j0, nj, lo, hi);
    for (pa_ssize r0 = 0; r0 < nj; r0 += MR) {
        const int m = (int)pa_min(nj - r0, MR);
        for (pa_ssize c0 = 0, u = 0; c0 < b->qc; c0 += NR, u++) {
            float *St = b->St + r0 * ld + c0;
            if (cut && pa_attn_cut_out(j0 + r0, j0 + r0 + m, lo[u], hi[u])) {
                for (int rr = 0; rr < m; rr++)
                    for (int cc = 0; cc < NR; cc++) St[rr * ld + cc] = -INFINITY;
                continue;
            }
            g->ukr(e2, Kt + r0 * e2, 1, MR, b->Qp + c0 * e2, NR, St, ld, 1, m, NR, 0);
        }
    }
    if (!b->fold) {
        const float scale = (float)a->scale;
        for (pa_ssize r = 0; r < nj; r++)
            for (pa_ssize c = 0; c < b->qc; c++) b->St[r * ld + c] *= scale;
    }
    flash_scores_f32(f, a, b->i0, b->nq, j0, nj, b->St, ld);
    f->tilesm[PA_F32].fn(b->St, nj, b->qc, ld, b->m, b->l, b->alpha);
    flash_rescale_f32(b->nq, b->alpha, b->O, b->evp, a->Ev);
    if (a->dropout_p > 0) flash_dropout_f32(a, b->i0, b->nq, j0, nj, b->St, ld);
    bf16_round_p(f, b, nj);
    if (clean) bf16_clean_v(b, nj);
    for (pa_ssize r0 = 0; r0 < b->qc; r0 += MR)
        for (pa_ssize c0 = 0; c0 < b->evp; c0 += NR)
            g->ukr(nj2, b->Pp + r0 * nj2, 1, MR, Vt + c0 * vs, NR, b->O + r0 * b->evp + c0, b->evp, 1, MR, NR, 1);
}

/* clean (one row, i1 = i0 + 1): the redo of a row whose result holds NaN.
 * The products of gemm_bf16 spread a NaN or inf of V through a weight of 0
 * (0 * NaN), from keys the row may not see (causal, masks, window, the
 * unfilled part of a cache, dropout); the row is computed again alone, each
 * tile's V packed here with the keys of weight exactly 0 zeroed, so only
 * NaN the row may see reaches it: the float32 path's zero-weight rule, on
 * the same arithmetic otherwise. */
static void flash_bf16(const pa_family *f, const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws,
                       int clean)
{
    bf16_blk b;
    bf16_init(f, a, i0, i1, ws, &b);
    pa_ssize j0, jend;
    pa_attn_key_tiles(a, i0, i1, &j0, &jend);
    pa_stop_flag *const stop = pa_stop_get();
    for (; j0 < jend && !pa_stopping(stop); j0 += PA_FLASH_BK)
        if (!pa_attn_tile_empty(a, i0, i1, j0, pa_min(jend, j0 + PA_FLASH_BK)))
            bf16_tile(f, a, &b, j0, pa_min(jend - j0, PA_FLASH_BK), clean);
    for (pa_ssize r = 0; r < b.nq; r++)
        (void)flash_put_row_f32(a, i0 + r, b.m[r], b.l[r], b.O + r * b.evp);
    if (clean) return;
    for (pa_ssize r = 0; r < b.nq; r++) {            /* NaN rows: again, alone and clean */
        const float *orow = (const float *)a->out + (i0 + r) * a->o_rs;
        pa_ssize d = 0;
        while (d < a->Ev && orow[d * a->o_cs] == orow[d * a->o_cs]) d++;
        if (d < a->Ev) flash_bf16(f, a, i0 + r, i0 + r + 1, ws, 1);
    }
}

/* ---- precision "bf16" on few query rows (decode; pa_bf16_rows_shape):
 * the rows path of attn_flash.inc (rowdot, rowsm, rowpv: no query block
 * padded to the GEMM's MR x NR tiles, no packing) on bfloat16 values. The
 * query rounded to bfloat16 (times a power-of-two scale, folded as the
 * tiled path folds it), K and V rows rounded to bfloat16 (each key tile
 * copied into the workspace as bfloat16 -- stored bfloat16 as it is, float32
 * and float16 rows by the family's bf16_narrow -- where the call reads
 * PA_ROWS_GATHER_KEYS keys or more, or has 16 rows; else stored bfloat16
 * read in place: the same values, the same bits), each
 * score the float32 sum of their exact products (rowdot[PA_BF16], by the
 * 16-partial rule: every SIMD family the same bits), times the scale, the
 * score rule, the online-softmax step (rowsm) on the same fixed grid of
 * PA_FLASH_BK keys, P rounded to bfloat16 after dropout -- relative to the
 * running max of the tiles so far, as the tiled path and the reference
 * round it -- and O += P V on exact products (rowpv[PA_BF16], skipping
 * weights of 0: the zero-weight rule without a redo). The same rounding
 * model as flash_bf16; the float32 sums run in another order (the last
 * bits differ from the tiled path's). */
typedef struct {
    float *Kw, *Vw;         /* (BK, e1), (BK, evp): a tile's keys, values rounded */
    float *qs;              /* (R, e1) the rounded query rows */
    float *sc;              /* (R, BK) scores, then P (one-pass) */
    float *acc;             /* (R, evp) unnormalised outputs */
    float *m, *l;           /* (R,) running max, sum */
    pa_ssize i0, R, e1, evp;
    float post;             /* the scale, applied to the scores (1: folded into qs) */
    int copy;               /* 1: every tile copied (bf16_rows_fetch), not read in place */
} bf16_rows_blk;

/* the workspace (within flash_ws_f32's rows share: R <= the query block) */
static void bf16_rows_init(const pa_family *f, const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws,
                           bf16_rows_blk *b)
{
    const pa_ssize E = a->E, R = i1 - i0;
    b->i0 = i0; b->R = R;
    b->e1 = E > 0 ? E : 1;
    b->evp = pa_round_up(a->Ev > 0 ? a->Ev : 1, f->gemm[PA_F32].nr);
    float *w = (float *)ws;
    b->Kw = w;
    b->Vw = w + PA_FLASH_BK * b->e1;
    b->qs = w + PA_FLASH_BK * b->e1 + PA_FLASH_BK * b->evp;
    b->sc = b->qs + R * b->e1;
    b->acc = b->sc + R * PA_FLASH_BK;
    b->m = b->acc + R * b->evp;
    b->l = b->m + R;
    int sexp;
    const int fold = frexp(a->scale, &sexp) == 0.5;
    const float qsc = fold ? (float)a->scale : 1.0f;
    b->post = fold ? 1.0f : (float)a->scale;
    for (pa_ssize r = 0; r < R; r++) {
        const pa_ssize i = i0 + r;
        for (pa_ssize e = 0; e < E; e++)
            b->qs[r * b->e1 + e] =
                pa_bits_f32(pa_bf16_round(pa_f32_bits(pa_load_f32(a->q, i * a->q_rs + e * a->q_cs, a->q_dt) * qsc)) &
                            0xffff0000u);
        for (pa_ssize d = 0; d < b->evp; d++) b->acc[r * b->evp + d] = 0;
        b->m[r] = -INFINITY;
        b->l[r] = 0;
    }
    pa_ssize kb, ke;                                 /* copy the tiles where rows_flash_ does */
    pa_attn_key_tiles(a, i0, i1, &kb, &ke);
    b->copy = R >= 16 || ke - kb >= PA_ROWS_GATHER_KEYS;
}

/* keys [j0, j1) of K (v = 0) or V (v = 1) as bfloat16 rows of D elements
 * in buf (row stride D): stored bfloat16 (unit column stride) copied as
 * stored, float32 and float16 rows rounded by the family's bf16_narrow (a
 * run of rows in one call; it prefetches its source 4 KiB ahead), strided
 * ones element by element -- the values rowdot / rowpv[PA_BF16] widen, the
 * same bits as reading them in place (or the float32 kernels reading them
 * rounded). The kernels' passes then read the copy from the cache
 * (rows_gathered_'s reason). No prefetch of the next tile's rows here:
 * measured slower (float32 rows 0.8x the default, bfloat16 0.95x, against
 * 1.0x without; Xeon, AVX-512, 1 thread, loaded). */
static void bf16_rows_fetch(const pa_family *f, const pa_attn_args *a, int v, pa_ssize j0, pa_ssize j1,
                            uint16_t *buf)
{
    const int dt = v ? a->v_dt : a->k_dt, kv = v ? PA_KV_V : PA_KV_K;
    const pa_ssize cs = v ? a->v_cs : a->k_cs, rs = v ? a->v_rs : a->k_rs, D = v ? a->Ev : a->E;
    const char *p = (const char *)(v ? a->v : a->k);
    for (pa_ssize j = j0, je; j < j1; j = je) {      /* run by run of rows in one block */
        je = pa_kv_run(&a->kv, j, j1);
        const pa_ssize o = pa_kv_row(&a->kv, kv, j), n = je - j;
        uint16_t *restrict d = buf + (j - j0) * D;
        if (cs == 1 && dt == PA_BF16) {
            for (pa_ssize i = 0; i < n; i++) memcpy(d + i * D, (const uint16_t *)p + o + i * rs, (size_t)D * 2);
        } else if (cs == 1 && (dt == PA_F32 || dt == PA_F16) && f->bf16_narrow) {
            const int h = dt == PA_F16;
            const char *r = (const char *)p + o * (h ? 2 : 4);
            if (rs == D) f->bf16_narrow(d, r, n * D, h);   /* the run in one call */
            else
                for (pa_ssize i = 0; i < n; i++) f->bf16_narrow(d + i * D, r + i * rs * (h ? 2 : 4), D, h);
        } else {
            for (pa_ssize i = 0; i < n; i++)
                for (pa_ssize e = 0; e < D; e++)
                    d[i * D + e] = (uint16_t)(pa_bf16_round(pa_f32_bits(pa_load_f32(p, o + i * rs + e * cs, dt))) >> 16);
        }
    }
}

/* rowdot (v = 0: scores of rows R of qs at s, row stride ss) or rowpv
 * (v = 1: acc += P V, P at s) over keys [j0, j1): the tile copied by
 * bf16_rows_fetch (b->copy), else
 * stored bfloat16 rows read in place, run by run of rows in one block (a
 * paged cache), the next run or the rows up to kend as the prefetch hint.
 * The copy's scores in passes of 4 rows (rows_gathered_'s: fewer loads per
 * FMA; a row's bits do not depend on the others of its call). */
static void bf16_rows_kernel(const pa_family *f, const pa_attn_args *a, bf16_rows_blk *b, int v, pa_ssize j0,
                             pa_ssize j1, pa_ssize kend, float *s, pa_ssize ss)
{
    const int dt = v ? a->v_dt : a->k_dt;
    const pa_ssize cs = v ? a->v_cs : a->k_cs, rs = v ? a->v_rs : a->k_rs;
    const uint16_t *p = (const uint16_t *)(v ? a->v : a->k);
    if (b->copy || dt != PA_BF16 || cs != 1) {
        uint16_t *buf = (uint16_t *)(void *)(v ? b->Vw : b->Kw);
        bf16_rows_fetch(f, a, v, j0, j1, buf);
        if (v) {
            f->rowpv[PA_BF16].fn(s, ss, b->R, buf, a->Ev, j1 - j0, a->Ev, b->acc, b->evp, NULL, 0);
        } else {
            for (pa_ssize r = 0; r < b->R; r += 4)
                f->rowdot[PA_BF16].fn(b->qs + r * b->e1, b->e1, pa_min(4, b->R - r), buf, a->E, j1 - j0, a->E,
                                      s + r * ss, ss, NULL, 0);
        }
        return;
    }
    for (pa_ssize j = j0, je; j < j1; j = je) {
        je = pa_kv_run(&a->kv, j, j1);
        pa_ssize nn = 0;
        const uint16_t *next = NULL;
        if (je < kend) {                             /* the next run, or the rows after the tile */
            nn = a->kv.bt ? pa_kv_run(&a->kv, je, kend) - je : kend - je;
            next = p + (v ? pa_kv_row(&a->kv, PA_KV_V, je) : pa_kv_row(&a->kv, PA_KV_K, je));
        }
        const uint16_t *rows = p + (v ? pa_kv_row(&a->kv, PA_KV_V, j) : pa_kv_row(&a->kv, PA_KV_K, j));
        if (v) f->rowpv[PA_BF16].fn(s + (j - j0), ss, b->R, rows, rs, je - j, a->Ev, b->acc, b->evp, next, nn);
        else f->rowdot[PA_BF16].fn(b->qs, b->e1, b->R, rows, rs, je - j, a->E, s + (j - j0), ss, next, nn);
    }
}

/* Row r's scores on keys [j0, j1) (at sr): its keys [*jb, *je) there
 * scaled and through the score rule; 0: none of its keys */
static int bf16_rows_score(const pa_attn_args *a, const bf16_rows_blk *b, pa_ssize r, pa_ssize j0, pa_ssize j1,
                           float *sr, pa_ssize *jb, pa_ssize *je)
{
    pa_key_range(&a->rule, b->i0 + r, jb, je);
    *jb = pa_max(*jb, j0);
    *je = pa_min(*je, j1);
    if (*jb >= *je) return 0;
    float *restrict x = sr + (*jb - j0);
    const pa_ssize n = *je - *jb;
    if (b->post != 1.0f)
        for (pa_ssize j = 0; j < n; j++) x[j] *= b->post;
    pa_attn_scores_f32(a, b->i0 + r, *jb, x, 1, n);
    return 1;
}

/* Row r's softmax step on its scored keys [jb, je) of the tile at sr:
 * rowsm, the accumulator rescaled, dropout, P rounded to bfloat16; the
 * tile's other entries of P 0 (all of them when has is 0) */
static void bf16_rows_step(const pa_family *f, const pa_attn_args *a, bf16_rows_blk *b, pa_ssize r, pa_ssize j0,
                           pa_ssize j1, float *sr, int has, pa_ssize jb, pa_ssize je)
{
    const pa_ssize nt = j1 - j0;
    if (!has) {
        for (pa_ssize j = 0; j < nt; j++) sr[j] = 0;
        return;
    }
    const pa_ssize off = jb - j0, nj = je - jb;
    for (pa_ssize j = 0; j < off; j++) sr[j] = 0;
    for (pa_ssize j = off + nj; j < nt; j++) sr[j] = 0;
    float *restrict x = sr + off, alpha;
    f->rowsm[PA_F32].fn(x, nj, b->m + r, b->l + r, &alpha);
    flash_rescale_f32(1, &alpha, b->acc + r * b->evp, b->evp, a->Ev);
    if (a->dropout_p > 0) flash_dropout_f32(a, b->i0 + r, 1, jb, nj, x, 1);
    for (pa_ssize j = 0; j < nj; j++) x[j] = pa_bits_f32(pa_bf16_round(pa_f32_bits(x[j])) & 0xffff0000u);
}

/* the keys the rows path reads: a paged cache's rows past the filled keys never */
static pa_ssize bf16_rows_kend(const pa_attn_args *a)
{
    return a->kv.bt ? pa_min(a->key_end, a->rule.S) : a->key_end;
}

/* Rows [i0, i1), keys [key_begin, key_end): the output rows (or, with
 * a->partial, (m, l, O) per row). sc NULL: each tile's scores by rowdot
 * here; else the scores pa_bf16_rows_scores left, key j's of row r at
 * sc + (j / PA_BF16_SPLIT_CHUNK) * cs + r * ld + j % PA_BF16_SPLIT_CHUNK
 * (rows [0, L): i0 = 0), taken there -- the same values, so the same bits */
static void bf16_rows_run(const pa_family *f, const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws,
                          float *sc, pa_ssize ld, pa_ssize cs)
{
    bf16_rows_blk b;
    bf16_rows_init(f, a, i0, i1, ws, &b);
    pa_ssize j0, jend;
    pa_attn_key_tiles(a, i0, i1, &j0, &jend);
    const pa_ssize kend = bf16_rows_kend(a);
    pa_stop_flag *const stop = pa_stop_get();
    for (; j0 < jend && !pa_stopping(stop); j0 += PA_FLASH_BK) {
        const pa_ssize j1 = pa_min(j0 + PA_FLASH_BK, kend);
        if (pa_attn_tile_empty(a, i0, i1, j0, j1)) continue;
        float *st = b.sc;
        pa_ssize sld = PA_FLASH_BK;
        if (sc) {
            st = sc + (j0 / PA_BF16_SPLIT_CHUNK) * cs + j0 % PA_BF16_SPLIT_CHUNK;
            sld = ld;
        } else {
            bf16_rows_kernel(f, a, &b, 0, j0, j1, kend, st, sld);
        }
        for (pa_ssize r = 0; r < b.R; r++) {
            float *sr = st + r * sld;
            pa_ssize jb, je;
            int has;
            if (sc) {                                /* scored already: the row's keys here */
                pa_key_range(&a->rule, i0 + r, &jb, &je);
                jb = pa_max(jb, j0);
                je = pa_min(je, j1);
                has = jb < je;
            } else {
                has = bf16_rows_score(a, &b, r, j0, j1, sr, &jb, &je);
            }
            bf16_rows_step(f, a, &b, r, j0, j1, sr, has, jb, je);
        }
        bf16_rows_kernel(f, a, &b, 1, j0, j1, kend, st, sld);
    }
    if (a->partial) {
        flash_put_partial_f32(a, i0, b.R, b.m, b.l, b.acc, b.evp);
        return;
    }
    for (pa_ssize r = 0; r < b.R; r++) (void)flash_put_row_f32(a, i0 + r, b.m[r], b.l[r], b.acc + r * b.evp);
}

void pa_bf16_rows_scores(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, void *ws)
{
    bf16_rows_blk b;
    bf16_rows_init(f, a, 0, a->L, ws, &b);
    pa_ssize j0, jend;
    pa_attn_key_tiles(a, 0, a->L, &j0, &jend);
    const pa_ssize kend = bf16_rows_kend(a);
    pa_stop_flag *const stop = pa_stop_get();
    for (; j0 < jend && !pa_stopping(stop); j0 += PA_FLASH_BK) {
        const pa_ssize j1 = pa_min(j0 + PA_FLASH_BK, kend);
        if (pa_attn_tile_empty(a, 0, a->L, j0, j1)) continue;
        float *st = sc + (j0 - a->key_begin);
        bf16_rows_kernel(f, a, &b, 0, j0, j1, kend, st, ld);
        for (pa_ssize r = 0; r < b.R; r++) {
            pa_ssize jb, je;
            (void)bf16_rows_score(a, &b, r, j0, j1, st + r * ld, &jb, &je);
        }
    }
}

void pa_bf16_rows_finish(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, pa_ssize cs, void *ws)
{
    bf16_rows_run(f, a, 0, a->L, ws, sc, ld, cs);
}

size_t pa_flash_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev)
{
    if (dtype != PA_F32) return flash_ws_f64(f, E, Ev);
    const size_t a = flash_ws_f32(f, E, Ev), b = flash_bf16_ws(f, E, Ev);
    return a > b ? a : b;
}

void pa_flash_run(const pa_family *f, int dtype, const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                  void *ws)
{
    if ((a->q8 || a->qbf16) && f->isa == PA_ISA_GENERIC) f = &pa_family_generic_vecbits;   /* "int8", "bf16" */
    if (dtype == PA_F32 && a->bf16 && pa_bf16_rows_shape(a->L, a->rule.div, a->E, a->Ev))
        bf16_rows_run(f, a, i0, i1, ws, NULL, 0, 0);   /* decode shapes: the rows path */
    else if (dtype == PA_F32 && a->bf16) flash_bf16(f, a, i0, i1, ws, 0);
    else if (dtype == PA_F32) flash_run_f32(f, a, i0, i1, ws);
    else flash_run_f64(f, a, i0, i1, ws);
}

size_t pa_flash_shared_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev, pa_ssize R)
{
    return dtype == PA_F32 ? rows_ws_f32(f, E, Ev, R) : rows_ws_f64(f, E, Ev, R);
}

void pa_flash_shared(const pa_family *f, int dtype, const pa_attn_args *const *grp, pa_ssize n,
                     pa_ssize kshared, void *ws)
{
    if (n > 0 && (grp[0]->q8 || grp[0]->qbf16) && f->isa == PA_ISA_GENERIC)
        f = &pa_family_generic_vecbits;   /* "int8", "bf16" with int8 / int4 keys */
    if (dtype == PA_F32) rows_shared_f32(f, grp, n, kshared, ws);
    else rows_shared_f64(f, grp, n, kshared, ws);
}

void pa_flash_merge(int dtype, const pa_attn_args *a, pa_ssize i, const void *partials,
                    pa_ssize nchunks, pa_ssize chunk_stride, void *ws)
{
    if (dtype == PA_F32) flash_merge_f32(a, i, partials, nchunks, chunk_stride, ws);
    else flash_merge_f64(a, i, partials, nchunks, chunk_stride, ws);
}

size_t pa_bwd_ws(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev)
{
    return dtype == PA_F32 ? bwd_ws_f32(f, L, E, Ev, 0) : bwd_ws_f64(f, L, E, Ev, 0);
}

size_t pa_bwd_ws_qside(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev)
{
    return dtype == PA_F32 ? bwd_ws_f32(f, L, E, Ev, 1) : bwd_ws_f64(f, L, E, Ev, 1);
}

void pa_bwd_pack(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs)
{
    if (dtype == PA_F32) bwd_pack_f32(f, a, io, qs);
    else bwd_pack_f64(f, a, io, qs);
}

void pa_bwd_pack_blocks(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs,
                        pa_ssize t0, pa_ssize t1)
{
    if (dtype == PA_F32) bwd_pack_blocks_f32(f, a, io, qs, t0, t1);
    else bwd_pack_blocks_f64(f, a, io, qs, t0, t1);
}

void pa_bwd_keys(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, const void *qs,
                 void *tiles)
{
    if (dtype == PA_F32) bwd_keys_f32(f, a, io, qs, tiles);
    else bwd_keys_f64(f, a, io, qs, tiles);
}

void pa_bwd_head(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *ws)
{
    if (dtype == PA_F32) bwd_head_f32(f, a, io, ws);
    else bwd_head_f64(f, a, io, ws);
}
