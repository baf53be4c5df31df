/*
 * kernel_check.c -- every kernel kind of a family run on its own against
 * its portable twin (kernel_check.h). The twin is the contract of
 * csrc/README.md written as scalar C, case by case, with the arithmetic the
 * family promises: the generic family's multiply-then-add and C library
 * exp, or the SIMD families' one FMA per term and the shared vector exp
 * (computed here operation by operation), so every output element is
 * compared bit for bit -- a NaN matches any NaN (payloads and signs are the
 * contract's one freedom); the decode step's running max is compared by
 * value (the sign of a zero max may follow the lane order, and nothing
 * reads it). Where the contract relates two computations without fixing
 * bits (the vector exp against the C library's), the rule checked is stated
 * where it is checked. A failure names the family, the kernel's symbol and
 * the case. The per-dtype checks are a template: kernel_check.inc.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernel_check.h"
#include "kernels/kernels.h"

#define KC_STR_(x) #x
#define KC_STR(x) KC_STR_(x)

typedef struct {
    const pa_family *f;
    pa_kc_result *res;
    const char *isa;                    /* the family's word in kernel symbols ("ref" for generic) */
    pa_vocab_fn vocab[PA_NCOMPUTE];     /* its vocabulary hook; NULL: no vector vocabulary */
    int vl[PA_NCOMPUTE];                /* lanes; 0: every column portable */
    uint64_t rng;
    int oom;
} kc_ctx;

static uint64_t kc_next(kc_ctx *k)      /* splitmix64: a fixed sequence per kind */
{
    uint64_t z = (k->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void *kc_alloc(kc_ctx *k, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) k->oom = 1;
    return p;
}

static void kc_fail(kc_ctx *k, const char *sym, const char *fmt, ...)
{
    pa_kc_result *r = k->res;
    r->failures++;
    if (r->nlines >= PA_KC_MAXLINES) return;
    char *line = r->lines[r->nlines++];
    int used = snprintf(line, PA_KC_LINE, "%s %s: ", k->f->name, sym);
    if (used < 0 || used >= PA_KC_LINE) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + used, (size_t)(PA_KC_LINE - used), fmt, ap);
    va_end(ap);
}

/* the twin's own 16-bit decoders, written from the IEEE formats (not
 * pyattn.h's: the widen kind checks those too) */
static float kc_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static float kc_f16(uint16_t h)
{
    const int sign = h >> 15, ex = (h >> 10) & 31, man = h & 1023;
    float v;
    if (ex == 31) {
        if (man == 0) v = INFINITY;
        else {                          /* NaN: the payload moved up, the quiet bit as it was */
            const uint32_t u = 0x7f800000u | (uint32_t)man << 13;
            memcpy(&v, &u, sizeof v);
        }
    } else
        v = ex ? ldexpf((float)(1024 + man), ex - 25) : ldexpf((float)man, -24);
    return sign ? -v : v;
}

static const char *const kc_sd_name[3] = {"", "f16_", "bf16_"};   /* decode storage variants */

#define PA_TEMPLATE "kernel_check.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE

/* ---- widen: every 16-bit pattern, and ragged lengths ---------------------
 * Exact: a number widens to its value bit for bit. A NaN widens to a NaN of
 * the same sign and payload; F16C / fcvtl quiet a signalling float16 NaN
 * (the quiet bit set), the portable conversion keeps it: the bits are
 * compared with the quiet bit ignored. */
static int kc_widen_same(float got, float want)
{
    uint32_t a, b;
    memcpy(&a, &got, 4);
    memcpy(&b, &want, 4);
    if (want != want) return got != got && (a | 0x00400000u) == (b | 0x00400000u);
    return a == b;
}

static void kc_widen(kc_ctx *k)
{
    enum { N = 65536 };
    uint16_t *src = kc_alloc(k, (N + 64) * sizeof(uint16_t));
    float *dst = kc_alloc(k, (N + 64) * sizeof(float));
    char sym[96];
    if (k->oom) goto done;
    for (int w = 0; w < 2; w++) {
        const pa_widen_fn fn = k->f->widen[w].fn;
        snprintf(sym, sizeof sym, "pa_widen_%s_f32_%s", w ? "bf16" : "f16", k->isa);
        for (int i = 0; i < N; i++) src[i] = (uint16_t)i;
        fn(dst, src, N);
        for (int i = 0; i < N; i++) {
            k->res->cases++;
            const float want = w ? kc_bf16((uint16_t)i) : kc_f16((uint16_t)i);
            if (!kc_widen_same(dst[i], want)) {
                uint32_t a, b;
                memcpy(&a, &dst[i], 4);
                memcpy(&b, &want, 4);
                kc_fail(k, sym, "n=65536: 0x%04x -> %.9g (0x%08x) != %.9g (0x%08x)", i, (double)dst[i],
                        (unsigned)a, (double)want, (unsigned)b);
            }
        }
        /* ragged: n = 0 .. 40 from offsets 0 .. 3; nothing past n written */
        for (int off = 0; off < 4; off++)
            for (int n = 0; n <= 40; n++) {
                for (int i = 0; i < 48; i++) {
                    src[off + i] = (uint16_t)kc_next(k);
                    dst[i] = -555.0f;
                }
                fn(dst, src + off, n);
                k->res->cases++;
                for (int i = 0; i < 48; i++) {
                    const float want = i >= n ? -555.0f : w ? kc_bf16(src[off + i]) : kc_f16(src[off + i]);
                    if (!kc_widen_same(dst[i], want)) {
                        kc_fail(k, sym, "n=%d offset=%d: dst[%d] %.9g != %.9g%s", n, off, i, (double)dst[i],
                                (double)want, i >= n ? " (past n: must be untouched)" : "");
                        break;
                    }
                }
            }
    }
done:
    free(src); free(dst);
}

/* ---- the bfloat16 GEMM kernel: every edge tile, DAZ / FTZ ----------------
 * The twin: vdpbf16ps as the contract states it (pairs in order of q, the
 * odd element first, each a fused multiply-add of DAZ inputs with an FTZ
 * result), then C = acc or C += acc. */
static float kc_daz(uint16_t h)
{
    return (h & 0x7f80u) ? kc_bf16(h) : kc_bf16((uint16_t)(h & 0x8000u));
}
static float kc_ftz(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }

static uint16_t kc_bf16_operand(kc_ctx *k)
{
    const uint64_t r = kc_next(k);
    const unsigned sign = (unsigned)(r & 1) << 15, man = (unsigned)(r >> 8) & 0x7f;
    const unsigned pick = (unsigned)(r >> 20) % 40;
    unsigned ex = 120 + (unsigned)(r >> 28) % 14;            /* around 1 */
    if (pick == 0) ex = 0;                                    /* subnormal: read as 0 */
    else if (pick == 1) ex = 1 + (unsigned)(r >> 36) % 8;     /* tiny: products underflow (FTZ) */
    else if (pick == 2) return (uint16_t)sign;                /* +-0 */
    return (uint16_t)(sign | ex << 7 | man);
}

static void kc_gemm_bf16(kc_ctx *k)
{
    const pa_gemm_kernel *g = &k->f->gemm_bf16;
    const int MR = g->mr, NR = g->nr;
    char sym[160];
    snprintf(sym, sizeof sym, "%s", g->name);
    if (g->kc != PA_GEMM_KC_BF16) kc_fail(k, sym, "kc blocking %d != PA_GEMM_KC_BF16 %d", g->kc, PA_GEMM_KC_BF16);
    if (MR < 1 || NR < 1 || MR > 64 || NR > 64 || !g->ukr) {
        kc_fail(k, sym, "tile %dx%d out of range or no kernel", MR, NR);
        return;
    }
    const pa_ssize KMAX = PA_GEMM_KC_BF16, CS = (MR + 2) * (NR + 2);
    const pa_ssize kcs[4] = {2, 4, 6, PA_GEMM_KC_BF16};      /* 1, 2, 3 and 256 pairs */
    uint16_t *A = kc_alloc(k, KMAX * MR * sizeof(uint16_t)), *B = kc_alloc(k, KMAX * NR * sizeof(uint16_t));
    float *acc = kc_alloc(k, MR * NR * sizeof(float)), *C = kc_alloc(k, CS * sizeof(float));
    float *C0 = kc_alloc(k, CS * sizeof(float)), *X = kc_alloc(k, CS * sizeof(float));
    if (k->oom) goto done;
    for (int ki = 0; ki < 4; ki++) {
        const pa_ssize kc = kcs[ki];
        for (pa_ssize t = 0; t < KMAX * MR; t++) A[t] = kc_bf16_operand(k);
        for (pa_ssize t = 0; t < KMAX * NR; t++) B[t] = kc_bf16_operand(k);
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) {
                float s = 0;
                for (pa_ssize q = 0; q < kc / 2; q++) {
                    const uint16_t *a = A + (q * MR + i) * 2, *b = B + (q * NR + j) * 2;
                    s = kc_ftz(fmaf(kc_daz(a[1]), kc_daz(b[1]), s));
                    s = kc_ftz(fmaf(kc_daz(a[0]), kc_daz(b[0]), s));
                }
                acc[i * NR + j] = s;
            }
        for (int accu = 0; accu < 2; accu++)
            for (int colmajor = 0; colmajor < 2; colmajor++) {
                const pa_ssize rs = colmajor ? 1 : NR + 2, cs = colmajor ? MR + 2 : 1;
                for (pa_ssize t = 0; t < CS; t++) C0[t] = kc_rnd_f32(k);
                for (int m = 1; m <= MR; m++)
                    for (int n = 1; n <= NR; n++) {
                        memcpy(C, C0, CS * sizeof(float));
                        memcpy(X, C0, CS * sizeof(float));
                        for (int i = 0; i < m; i++)
                            for (int j = 0; j < n; j++) {
                                float *x = X + i * rs + j * cs;
                                *x = accu ? *x + acc[i * NR + j] : acc[i * NR + j];
                            }
                        g->ukr(kc, A, MR, 1, B, NR, C, rs, cs, m, n, accu);
                        k->res->cases++;
                        const pa_ssize d = kc_diff_f32(C, X, CS);
                        if (d < 0) continue;
                        const int i = (int)(colmajor ? d % cs : d / rs), j = (int)(colmajor ? d / cs : d % rs);
                        kc_fail(k, sym, "m=%d n=%d kc=%lld accumulate=%d C=%s: C[%d,%d] %.9g != %.9g%s", m, n,
                                (long long)kc, accu, colmajor ? "col-major" : "row-major", i, j, (double)C[d],
                                (double)X[d], i < m && j < n ? "" : " (outside the m x n corner)");
                    }
            }
    }
done:
    free(A); free(B); free(acc); free(C); free(C0); free(X);
}

/* ---- the kinds: one check each, both compute dtypes where it has them ---- */
#define KC_BOTH(kind) \
    static void kc_##kind(kc_ctx *k) { kc_##kind##_f32(k); if (!k->oom) kc_##kind##_f64(k); }
KC_BOTH(gemm)
KC_BOTH(tilesm)
KC_BOTH(tilep)
KC_BOTH(tileds)
KC_BOTH(softmax)
KC_BOTH(decode)
KC_BOTH(softcap)
KC_BOTH(exp)
#undef KC_BOTH
static void kc_vocab(kc_ctx *k)
{
    if (!k->vocab[PA_F32]) {
        if (k->f->isa != PA_ISA_GENERIC)
            kc_fail(k, "pa_vocab", "a SIMD family without a vocabulary hook in kernel_check.c's kc_hooks");
        else
            k->res->cases = -1;         /* the generic family has no vector vocabulary */
        return;
    }
    kc_vocab_f32(k);
    kc_vocab_f64(k);
}

static const struct {
    const char *name;
    void (*fn)(kc_ctx *);
} kc_kinds[] = {
    {"gemm", kc_gemm},           {"gemm_bf16", kc_gemm_bf16}, {"tilesm", kc_tilesm},
    {"tilep", kc_tilep},         {"tileds", kc_tileds},       {"softmax", kc_softmax},
    {"decode", kc_decode},       {"softcap", kc_softcap},     {"widen", kc_widen},
    {"exp", kc_exp},             {"vocab", kc_vocab},
};
#define KC_NKINDS ((int)(sizeof kc_kinds / sizeof kc_kinds[0]))

/* each SIMD family's vocabulary hook (kernels/vec/vocab_check.inc) */
static void kc_hooks(const pa_family *f, pa_vocab_fn v[PA_NCOMPUTE])
{
    v[PA_F32] = v[PA_F64] = NULL;
    switch (f->isa) {
#ifdef PA_HAVE_X86_KERNELS
    case PA_ISA_AVX2: v[PA_F32] = pa_vocab_f32_avx2; v[PA_F64] = pa_vocab_f64_avx2; break;
    case PA_ISA_AVX512: v[PA_F32] = pa_vocab_f32_avx512; v[PA_F64] = pa_vocab_f64_avx512; break;
    case PA_ISA_AVX512_EMU: v[PA_F32] = pa_vocab_f32_avx512emu; v[PA_F64] = pa_vocab_f64_avx512emu; break;
#endif
#ifdef PA_HAVE_NEON_KERNELS
    case PA_ISA_NEON: v[PA_F32] = pa_vocab_f32_neon; v[PA_F64] = pa_vocab_f64_neon; break;
#endif
    default: break;
    }
}

int pa_kc_nkinds(void) { return KC_NKINDS; }

const char *pa_kc_kind_name(int kind)
{
    return kind >= 0 && kind < KC_NKINDS ? kc_kinds[kind].name : NULL;
}

int pa_kernel_check(const pa_family *f, int kind, pa_kc_result *res)
{
    memset(res, 0, sizeof *res);
    if (kind < 0 || kind >= KC_NKINDS) return 0;
    kc_ctx k = {f, res, f->isa == PA_ISA_GENERIC ? "ref" : f->name, {NULL, NULL}, {0, 0},
                0x5eed0000ULL + (uint64_t)kind, 0};
    kc_hooks(f, k.vocab);
    for (int d = 0; d < PA_NCOMPUTE; d++)
        k.vl[d] = k.vocab[d] ? k.vocab[d](PA_VOP_LANES, NULL, NULL, NULL, NULL, 0) : 0;
    kc_kinds[kind].fn(&k);
    return k.oom ? -1 : 0;
}
