/*
 * pyattn.h -- types shared by the ops and the kernels. No Python here.
 *
 * Shape legend (used in every C file of pyattn):
 *   B   batch (all leading axes, flattened by the op layer)
 *   H   heads
 *   L   queries (rows of the score matrix)
 *   S   keys    (columns of the score matrix)
 *   E   head dim of query/key
 *   Ev  head dim of value / output
 *   M, N, K  matmul: (M, K) @ (K, N) -> (M, N)
 *
 * Every stride in the ops and kernels is counted in ELEMENTS, not bytes; the
 * binding (module.c) converts NumPy's byte strides once.
 */
#ifndef PYATTN_H
#define PYATTN_H

#include <stddef.h>
#include <stdint.h>

/* ptrdiff_t is Py_ssize_t on every platform CPython supports; the C layers
 * below the binding use it so that they never include Python.h. */
typedef ptrdiff_t pa_ssize;

enum { PA_F32 = 0, PA_F64 = 1 };

/* a*b for sizes; returns 0 (and leaves *r untouched) on overflow. */
static inline int pa_mul_ok(size_t a, size_t b, size_t *r)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *r = a * b;
    return 1;
}

/* ---- mask / causal conventions ------------------------------------------ */
enum { PA_MASK_NONE = 0, PA_MASK_BOOL = 1, PA_MASK_ADD = 2 };
enum { PA_CAUSAL_NONE = 0, PA_CAUSAL_TOP_LEFT = 1, PA_CAUSAL_BOTTOM_RIGHT = 2 };

/* Number of keys query row i may see under the causal mode (keys 0..n-1).
 * top-left:     j <= i            (torch.tril(ones(L, S)))
 * bottom-right: j <= i + (S - L)  (FlashAttention, decoding with a cache) */
static inline pa_ssize pa_causal_limit(int causal, pa_ssize i, pa_ssize L, pa_ssize S)
{
    pa_ssize n;
    if (causal == PA_CAUSAL_TOP_LEFT) n = i + 1;
    else if (causal == PA_CAUSAL_BOTTOM_RIGHT) n = i + 1 + (S - L);
    else return S;
    if (n < 0) n = 0;
    if (n > S) n = S;
    return n;
}

/* ---- dropout: a counter-based generator ---------------------------------
 * The keep/drop decision for score element (b, i, j) depends only on the key
 * drawn from the user's generator and on the element's flat index
 * ((b * L + i) * S + j), so it is the same whatever the thread count or the
 * tiling. pyattn/_reference.py implements the same function in NumPy. */
static inline uint64_t pa_mix64(uint64_t z)
{
    z ^= z >> 30; z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27; z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}
/* Uniform double in [0, 1) for counter ctr under key. */
static inline double pa_uniform(uint64_t key, uint64_t ctr)
{
    uint64_t h = pa_mix64(key + (ctr + 1) * 0x9e3779b97f4a7c15ULL);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- attention arguments (one head: one flattened batch index) ---------- */
typedef struct {
    pa_ssize L, S, E, Ev;
    const void *q; pa_ssize q_rs, q_cs;     /* (L, E)  */
    const void *k; pa_ssize k_rs, k_cs;     /* (S, E)  */
    const void *v; pa_ssize v_rs, v_cs;     /* (S, Ev) */
    const void *mask; pa_ssize m_rs, m_cs;  /* (L, S) bool (uint8) or float of the compute dtype */
    int mask_kind;                          /* PA_MASK_* */
    int causal;                             /* PA_CAUSAL_* */
    double scale;
    double dropout_p;                       /* 0 <= p < 1 */
    uint64_t dropout_key;
    uint64_t ctr_base;                      /* b * L * S: counter of element (b, 0, 0) */
    pa_ssize key_begin, key_end;            /* the keys this call covers, [0, S) unless split */
    void *partial;                          /* NULL, or per query row (2 + Ev) values of the
                                               compute dtype: running max m, sum l and the
                                               unnormalised output, for a later merge */
    void *out; pa_ssize o_rs, o_cs;         /* (L, Ev) */
    void *w; pa_ssize w_rs, w_cs;           /* (L, S) weights, or NULL */
} pa_attn_args;

/* ---- softmax arguments: n rows of length S ------------------------------ */
typedef struct {
    pa_ssize S;                             /* row length */
    const void *x; pa_ssize x_cs;           /* row of x */
    const void *mask; pa_ssize m_cs;        /* row of the mask, or NULL */
    int mask_kind;
    pa_ssize limit;                         /* columns >= limit are masked (causal); S if none */
    double scale;
    void *out; pa_ssize o_cs;
} pa_softmax_row;

#endif
