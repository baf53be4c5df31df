/*
 * pyattn.h -- what the frame (ops/) and the kernels share: sizes, element
 * types, the mask and causal rules, dropout. No Python here.
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
 * binding (bind_views.c) converts NumPy's byte strides once.
 */
#ifndef PYATTN_H
#define PYATTN_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "registry.h"

/* ptrdiff_t is Py_ssize_t on every platform CPython supports; the C layers
 * below the binding use it so that they never include Python.h. */
typedef ptrdiff_t pa_ssize;

/* token pasting after expansion: PA_CAT(pa_gemm_, PA_DT) -> pa_gemm_f32 */
#define PA_CAT_(a, b) a##b
#define PA_CAT(a, b) PA_CAT_(a, b)

/* ---- element types ------------------------------------------------------
 * One code space, one descriptor per dtype (the rows of PA_DTYPES,
 * registry.h): the type an operand is stored in, the type its arithmetic
 * runs in, and the stored size. The compute dtypes (PA_F32, PA_F64) come
 * first: PA_NCOMPUTE of them index the kernels of a compute dtype. The
 * 16-bit storage types (float16, bfloat16) compute in PA_F32: the frame
 * widens them where it packs or reads operands (a tile at a time, never a
 * copy of the array), and the kernels that read stored operands (widen,
 * rowdot, rowpv) are indexed by the storage code itself. PA_BOOL: masks. */
#define PA_DTYPE_CODE(CODE, sfx, name, size, compute, c, s, w, ...) PA_##CODE,
#define PA_DTYPE_NCOMPUTE(CODE, sfx, name, size, compute, c, s, w, ...) + c
enum { PA_DTYPES(PA_DTYPE_CODE, _) PA_NDTYPES };
enum { PA_NCOMPUTE = 0 PA_DTYPES(PA_DTYPE_NCOMPUTE, _) };
#undef PA_DTYPE_CODE
#undef PA_DTYPE_NCOMPUTE

typedef struct {
    const char *name;       /* NumPy's name: "float32" */
    size_t size;            /* bytes of one stored element */
    int compute;            /* the dtype its arithmetic runs in (PA_F32 / PA_F64; -1: bool) */
} pa_dtype_info;

extern const pa_dtype_info pa_dtypes[PA_NDTYPES];   /* ops/common.c, from PA_DTYPES */

static inline size_t pa_elsize(int dtype) { return pa_dtypes[dtype].size; }

/* 16-bit -> float32, exactly (portable C; the families have SIMD twins). */
static inline float pa_bits_f32(uint32_t u)
{
    union { uint32_t u; float f; } c;
    c.u = u;
    return c.f;
}
static inline float pa_bf16_to_f32(uint16_t h) { return pa_bits_f32((uint32_t)h << 16); }
static inline float pa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (ex == 0x1f) return pa_bits_f32(sign | 0x7f800000u | (man << 13));   /* inf, NaN */
    if (ex != 0) return pa_bits_f32(sign | ((ex + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    const float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
}

/* THE bfloat16 rounding: float32 bits u -> a word whose high 16 bits are u
 * rounded to bfloat16, to nearest even (NaN stays a quiet NaN); the low 16
 * bits are garbage. Integer operations only, so loops over it vectorise. */
static inline uint32_t pa_bf16_round(uint32_t u)
{
    return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : u + 0x7fffu + ((u >> 16) & 1u);
}
/* float32 -> bfloat16 bits (pa_bf16_round). */
static inline uint16_t pa_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } c;
    c.f = f;
    return (uint16_t)(pa_bf16_round(c.u) >> 16);
}

/* The bits of a float32. */
static inline uint32_t pa_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);   /* a register move: loops over it vectorise */
    return u;
}
/* Two float32 values rounded to bfloat16 (pa_bf16_round) as one pair word
 * of the bfloat16 products' panels: lo (the even element) in the low half. */
static inline uint32_t pa_bf16_pair(float lo, float hi)
{
    return (pa_bf16_round(pa_f32_bits(hi)) & 0xffff0000u) | (pa_bf16_round(pa_f32_bits(lo)) >> 16);
}

/* Element idx of an operand stored as sd, as float (sd: PA_F32, PA_F16, PA_BF16). */
static inline float pa_load_f32(const void *p, pa_ssize idx, int sd)
{
    if (sd == PA_F32) return ((const float *)p)[idx];
    const uint16_t h = ((const uint16_t *)p)[idx];
    return sd == PA_BF16 ? pa_bf16_to_f32(h) : pa_f16_to_f32(h);
}

/* THE min, max and round-up of sizes and indices (never of values: the
 * frame's float max keeps the NaN order of the kernels' vmax) */
static inline pa_ssize pa_min(pa_ssize a, pa_ssize b) { return a < b ? a : b; }
static inline pa_ssize pa_max(pa_ssize a, pa_ssize b) { return a > b ? a : b; }
/* x rounded up to a multiple of m (x >= 0, m >= 1) */
static inline pa_ssize pa_round_up(pa_ssize x, pa_ssize m) { return (x + m - 1) / m * m; }

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

/* The key range of query row i: the causal rule and a sliding window.
 * Row i sits at position d(i) = i / div + qoff on the key axis (qoff = S - L
 * for bottom-right causal attention and for a KV cache, else 0; div > 1
 * when the rows are div query heads per position, stacked). Keys lie in
 * [0, S); causal keeps j <= d(i); the window keeps d(i) - left <= j <=
 * d(i) + right (a negative left/right: unbounded on that side). Both ends
 * are nondecreasing in i, which the frames use to skip whole tiles. */
typedef struct {
    pa_ssize S, qoff;
    int causal;                 /* nonzero: j <= d(i) */
    pa_ssize left, right;       /* window; < 0: unbounded */
    pa_ssize div;               /* rows per position (>= 1) */
} pa_keyrule;

/* a + b, clamped to [PTRDIFF_MIN, PTRDIFF_MAX] instead of overflowing (the
 * key range compares its ends with [0, S], so a clamped end decides alike) */
static inline pa_ssize pa_add_sat(pa_ssize a, pa_ssize b)
{
    if (b > 0 && a > PTRDIFF_MAX - b) return PTRDIFF_MAX;
    if (b < 0 && a < PTRDIFF_MIN - b) return PTRDIFF_MIN;
    return a + b;
}

/* Windows and positions near 2**63 (the binding bounds qoff by PA_POS_MAX and
 * turns a window side wider than S + L + |qoff| into "unbounded"), so that
 * no end of a key range overflows; the sums saturate besides. */
#define PA_POS_MAX ((pa_ssize)1 << 62)

static inline void pa_key_range(const pa_keyrule *r, pa_ssize i, pa_ssize *lo, pa_ssize *hi)
{
    const pa_ssize d = pa_add_sat(i / r->div, r->qoff);
    pa_ssize a = 0, b = r->S;
    if (r->causal && d < b) b = pa_add_sat(d, 1);
    if (r->right >= 0) {
        const pa_ssize e = pa_add_sat(pa_add_sat(d, r->right), 1);
        if (e < b) b = e;
    }
    if (r->left >= 0) {
        const pa_ssize s = pa_add_sat(d, -r->left);
        if (s > a) a = s;
    }
    if (b < a) b = a;
    if (b < 0) a = b = 0;
    if (a > r->S) a = b = r->S;
    *lo = a;
    *hi = b;
}

/* THE key range of a block of query rows [i0, i1) (i0 < i1): the keys some
 * row of the block may see, the union of the rows' ranges. Both ends grow
 * with the row and a row's range starts at or before the previous row's end,
 * so the union is [lo(i0), hi(i1 - 1)); it is empty (*lo >= *hi) exactly
 * when no row of the block sees a key -- also after both ends are clipped to
 * keys [kb, ke) (checked against the row-by-row union on every rule with
 * S <= 7, |qoff| <= 12, window sides <= 4, div <= 3). */
static inline void pa_block_keys(const pa_keyrule *r, pa_ssize i0, pa_ssize i1, pa_ssize *lo, pa_ssize *hi)
{
    pa_ssize unused;
    pa_key_range(r, i0, lo, &unused);
    pa_key_range(r, i1 - 1, &unused, hi);
}

/* Number of keys query row i may see under the causal mode (keys 0..n-1):
 * the key range above without a window.
 * top-left:     j <= i            (torch.tril(ones(L, S)))
 * bottom-right: j <= i + (S - L)  (FlashAttention, decoding with a cache) */
static inline pa_ssize pa_causal_limit(int causal, pa_ssize i, pa_ssize L, pa_ssize S)
{
    const pa_keyrule r = {S, causal == PA_CAUSAL_BOTTOM_RIGHT ? S - L : 0, causal != PA_CAUSAL_NONE, -1, -1, 1};
    pa_ssize lo, hi;
    pa_key_range(&r, i, &lo, &hi);
    return hi;
}

/* A mask operand: element (i, j) at p + (i*rs + j*cs) elements; bool masks
 * are bytes (True: may attend), additive ones are of the compute dtype. */
typedef struct {
    const void *p;
    pa_ssize rs, cs;
    int kind;               /* PA_MASK_*; p is NULL for PA_MASK_NONE */
} pa_mask;

/* THE admissibility rule of a score, written once for every frame and
 * kernel: key j of query row i counts when it lies in the row's key range
 * [lo, hi) (the causal limit; next, a sliding window) and a bool mask is
 * True there; an additive mask is added to the scaled score. Applied to n
 * scores s[t*ss] (t = 0..n-1) of keys j0 + t of row i, with lo and hi
 * relative to j0: an inadmissible score becomes -inf, which every softmax
 * step reads as "weight exactly 0". */
#define PA_DEFINE_ADMIT(T, DT)                                                      \
    static inline void pa_admit_##DT(const pa_mask *mk, pa_ssize i, pa_ssize j0,    \
                                     T *s, pa_ssize ss, pa_ssize n,                 \
                                     pa_ssize lo, pa_ssize hi)                      \
    {                                                                               \
        if (lo < 0) lo = 0;                                                         \
        if (lo > n) lo = n;                                                         \
        if (hi > n) hi = n;                                                         \
        if (hi < lo) hi = lo;                                                       \
        for (pa_ssize t = 0; t < lo; t++) s[t * ss] = (T)-INFINITY;                 \
        const pa_ssize off = i * mk->rs + j0 * mk->cs;                              \
        if (mk->kind == PA_MASK_BOOL) {                                             \
            const uint8_t *m = (const uint8_t *)mk->p + off;                        \
            for (pa_ssize t = lo; t < hi; t++)                                      \
                if (!m[t * mk->cs]) s[t * ss] = (T)-INFINITY;                       \
        } else if (mk->kind == PA_MASK_ADD) {                                       \
            const T *m = (const T *)mk->p + off;                                    \
            for (pa_ssize t = lo; t < hi; t++) s[t * ss] += m[t * mk->cs];          \
        }                                                                           \
        for (pa_ssize t = hi; t < n; t++) s[t * ss] = (T)-INFINITY;                 \
    }
PA_DEFINE_ADMIT(float, f32)
PA_DEFINE_ADMIT(double, f64)
#undef PA_DEFINE_ADMIT

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

/* ---- softmax arguments: n rows of length S ------------------------------ */
typedef struct {
    pa_ssize S;                             /* row length */
    const void *x; pa_ssize x_cs;           /* row of x */
    pa_mask mask;                           /* this row of the mask (rs unused) */
    pa_ssize limit;                         /* columns >= limit are masked (causal); S if none */
    double scale;
    void *out; pa_ssize o_cs;
} pa_softmax_row;

#endif
