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
#include "families_api.h"
#include "kernel_check.h"
#include "kernels/kernels.h"

#define KC_STR_(x) #x
#define KC_STR(x) KC_STR_(x)

typedef struct {
    const pa_families_api *api;         /* what _C lends (families_api.h) */
    const pa_family *f;
    const char *fam;                    /* its PYATTN_ISA word */
    pa_kc_result *res;
    const char *isa;                    /* its word in kernel symbols ("ref" for generic) */
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
    int used = snprintf(line, PA_KC_LINE, "%s %s: ", k->fam, sym);
    if (used < 0 || used >= PA_KC_LINE) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + used, (size_t)(PA_KC_LINE - used), fmt, ap);
    va_end(ap);
}

/* records that the check ran kernel `sym` (a name from the family's table) */
static void kc_used(kc_ctx *k, const char *sym)
{
    pa_kc_result *r = k->res;
    for (int i = 0; i < r->nused; i++)
        if (r->used[i] == sym) return;
    if (sym && r->nused < (int)(sizeof r->used / sizeof r->used[0])) r->used[r->nused++] = sym;
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

/* the decode kernels' cases: query rows, keys, head dims around every vector width and 16 */
static const pa_ssize kc_Rs[] = {1, 2, 3, 4, 5, 8, 9};
static const pa_ssize kc_njs[] = {1, 2, 3, 5, 8, 9, 15, 16, 17, 33, 60};
static const pa_ssize kc_Es[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 67, 100, 129};
#define KC_N(a) (sizeof a / sizeof a[0])
enum { KC_RMAX = 9, KC_NJMAX = 60, KC_EMAX = 129, KC_LDE = KC_EMAX + 16 + 4, KC_SS = KC_NJMAX + 3 };

#define PA_TEMPLATE "check/kernel_check.inc"
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

/* the dtypes of the registry's rows with the W flag (widened by a widen kernel) */
#define KC_W(CODE, sfx, name, size, compute, c, s, w, ...) [PA_##CODE] = w,
static const char kc_widened[PA_NDTYPES] = {PA_DTYPES(KC_W, _)};
#undef KC_W

static void kc_widen(kc_ctx *k)
{
    enum { N = 65536 };
    uint16_t *src = kc_alloc(k, (N + 64) * sizeof(uint16_t));
    float *dst = kc_alloc(k, (N + 64) * sizeof(float));
    char sym[96];
    if (k->oom) goto done;
    for (int code = 0; code < PA_NDTYPES; code++) {
        if (!kc_widened[code]) continue;
        const pa_widen_fn fn = k->f->widen[code].fn;
        const int w = code == PA_BF16;
        snprintf(sym, sizeof sym, "%s", k->f->widen[code].name ? k->f->widen[code].name : "widen");
        if (code != PA_F16 && code != PA_BF16) {
            kc_fail(k, sym, "no twin for widening %s: add one to kernel_check.c", k->api->dtypes[code].name);
            continue;
        }
        if (!fn) {
            kc_fail(k, sym, "no kernel for %s", k->api->dtypes[code].name);
            continue;
        }
        kc_used(k, k->f->widen[code].name);
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
 * result), then C = acc or C += acc; on operands with DAZ / FTZ cases, then
 * on operands of normal range only. */
static float kc_daz(uint16_t h)
{
    return (h & 0x7f80u) ? kc_bf16(h) : kc_bf16((uint16_t)(h & 0x8000u));
}
static float kc_ftz(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }

/* normal: only finite values around 1, whose products and sums stay normal
 * (the kernels that emulate the instruction on FMAs run them on their fast
 * path; the other operands make them take their exact loop) */
static uint16_t kc_bf16_operand(kc_ctx *k, int normal)
{
    const uint64_t r = kc_next(k);
    const unsigned sign = (unsigned)(r & 1) << 15, man = (unsigned)(r >> 8) & 0x7f;
    const unsigned pick = normal ? 39 : (unsigned)(r >> 20) % 40;
    unsigned ex = 120 + (unsigned)(r >> 28) % 14;            /* around 1 */
    if (pick == 0) ex = 0;                                    /* subnormal: read as 0 */
    else if (pick == 1) ex = 1 + (unsigned)(r >> 36) % 8;     /* tiny: products underflow (FTZ) */
    else if (pick == 2) return (uint16_t)sign;                /* +-0 */
    else if (pick == 3) return (uint16_t)(sign | 0x7f80u);    /* +-inf (inf 0 -> NaN: any NaN matches) */
    return (uint16_t)(sign | ex << 7 | man);
}

static void kc_gemm_bf16(kc_ctx *k)
{
    const pa_gemm_kernel *g = &k->f->gemm_bf16;
    const int MR = g->mr, NR = g->nr;
    const char *sym = g->name;
    kc_used(k, sym);
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
    for (int ki = 0; ki < 8; ki++) {
        const pa_ssize kc = kcs[ki % 4];
        for (pa_ssize t = 0; t < KMAX * MR; t++) A[t] = kc_bf16_operand(k, ki >= 4);
        for (pa_ssize t = 0; t < KMAX * NR; t++) B[t] = kc_bf16_operand(k, ki >= 4);
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

/* ---- precision "bf16"'s P packer (family parameter bf16_pack_p) ------------
 * Against pa_bf16_round's rule word by word: weights of every kind (ties
 * of both parities, NaN with only low payload bits, infinities, subnormals,
 * zeros of both signs), panels of MR queries over 1..3 row panels, key pairs
 * 1, 2, 15, 30; nothing written outside the panels. A family without one
 * (NULL: the frame's portable loop) counts -1. */
static void kc_bf16_pack_p(kc_ctx *k)
{
    const pa_bf16_pack_fn fn = k->f->bf16_pack_p;
    const char *sym = "bf16_pack_p";
    if (!fn) {
        k->res->cases = -1;
        return;
    }
    const int MR = k->f->gemm_bf16.mr;
    const pa_ssize NP = 30, QC = 3 * (pa_ssize)MR, LD = QC + 5, PAD = 16;
    uint32_t *St = kc_alloc(k, (size_t)(2 * NP * LD) * sizeof(uint32_t));
    uint32_t *P = kc_alloc(k, (size_t)(QC * NP + PAD) * sizeof(uint32_t));
    if (k->oom) goto done;
    static const uint32_t special[] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f800000u, 0xff800000u,
                                       0x00000001u, 0x80000000u, 0x00000000u, 0x3f808000u, 0x3f818000u,
                                       0x7f7f8000u, 0x7f7fffffu, 0x0000ffffu, 0x807f8000u, 0x7fffffffu};
    static const pa_ssize nps[] = {1, 2, 15, 30};
    for (int round = 0; round < 8; round++) {
        for (pa_ssize t = 0; t < 2 * NP * LD; t++) {
            const uint64_t r = kc_next(k);
            St[t] = (r & 7) == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])] : (uint32_t)(r >> 16);
        }
        for (int panels = 1; panels <= 3; panels++)
            for (int ni = 0; ni < 4; ni++) {
                const pa_ssize np = nps[ni], qc = panels * (pa_ssize)MR;
                for (pa_ssize t = 0; t < QC * NP + PAD; t++) P[t] = 0xdeadbeefu;
                fn((const float *)(const void *)St, LD, qc, 2 * np, MR, P);
                k->res->cases++;
                for (pa_ssize t = 0; t < QC * NP + PAD; t++) {
                    uint32_t want = 0xdeadbeefu;
                    if (t < qc * np) {
                        const pa_ssize r0 = t / (np * MR) * MR, q = t % (np * MR) / MR, i = t % MR;
                        const uint32_t x = St[2 * q * LD + r0 + i], y = St[(2 * q + 1) * LD + r0 + i];
                        want = (pa_bf16_round(y) & 0xffff0000u) | (pa_bf16_round(x) >> 16);
                    }
                    if (P[t] != want) {
                        kc_fail(k, sym, "MR=%d qc=%lld pairs=%lld: word %lld 0x%08x != 0x%08x", MR, (long long)qc,
                                (long long)np, (long long)t, P[t], want);
                        goto done;
                    }
                }
            }
    }
done:
    free(St); free(P);
}

/* ---- precision "bf16"'s row narrower (family parameter bf16_narrow) ---------
 * Against pa_bf16_round's rule value by value, float32 and float16 sources
 * (the latter widened by pyattn.h's exact pa_f16_to_f32): values of every
 * kind (ties of both parities, NaN with only low payload bits, infinities,
 * subnormals, zeros of both signs), every n from 0 to 70 at offsets 0..3
 * (the vector steps and their tails); nothing written past n. A family without one
 * (NULL: the frame's portable loop) counts -1. */
static void kc_bf16_narrow(kc_ctx *k)
{
    const pa_bf16_narrow_fn fn = k->f->bf16_narrow;
    const char *sym = "bf16_narrow";
    if (!fn) {
        k->res->cases = -1;
        return;
    }
    const pa_ssize N = 80, PAD = 8;
    uint32_t *src = kc_alloc(k, (size_t)N * sizeof(uint32_t));
    uint16_t *dst = kc_alloc(k, (size_t)(N + PAD) * sizeof(uint16_t));
    if (k->oom) goto done;
    static const uint32_t special[] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f800000u, 0xff800000u,
                                       0x00000001u, 0x80000000u, 0x00000000u, 0x3f808000u, 0x3f818000u,
                                       0x7f7f8000u, 0x7f7fffffu, 0x0000ffffu, 0x807f8000u, 0x7fffffffu};
    static const uint16_t special16[] = {0x7c01u, 0xfc01u, 0x7e00u, 0x7c00u, 0xfc00u, 0x0001u, 0x8000u,
                                         0x0000u, 0x03ffu, 0x7bffu, 0x3c01u, 0x0401u};
    for (int round = 0; round < 8; round++)
        for (int f16 = 0; f16 < 2; f16++) {
            uint16_t *h = (uint16_t *)(void *)src;
            for (pa_ssize t = 0; t < N; t++) {
                const uint64_t r = kc_next(k);
                if (f16) h[t] = (r & 3) == 0 ? special16[(r >> 8) % (sizeof special16 / sizeof special16[0])]
                                             : (uint16_t)(r >> 16);
                else src[t] = (r & 3) == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])]
                                           : (uint32_t)(r >> 16);
            }
            for (pa_ssize off = 0; off < 4; off++)
                for (pa_ssize n = 0; n + off <= 70; n++) {
                    for (pa_ssize t = 0; t < N + PAD; t++) dst[t] = 0xbeefu;
                    fn(dst + off, f16 ? (const void *)(h + off) : (const void *)(src + off), n, f16);
                    k->res->cases++;
                    for (pa_ssize t = 0; t < N + PAD; t++) {
                        const int in = t >= off && t < off + n;
                        const uint32_t x = in ? (f16 ? pa_f32_bits(pa_f16_to_f32(h[t])) : src[t]) : 0;
                        const uint16_t want = in ? (uint16_t)(pa_bf16_round(x) >> 16) : (uint16_t)0xbeefu;
                        if (dst[t] != want) {
                            kc_fail(k, sym, "f16=%d n=%lld off=%lld: value %lld 0x%04x != 0x%04x", f16,
                                    (long long)n, (long long)off, (long long)t, dst[t], want);
                            goto done;
                        }
                    }
                }
        }
done:
    free(src); free(dst);
}

/* ---- the read probe: the sum of n floats -----------------------------------
 * Its order is free (a benchmark probe), so it is checked on small integers,
 * whose sums are exact in any order: bit for bit, every n around the
 * vector widths. */
static void kc_read_probe(kc_ctx *k)
{
    const pa_read_probe_fn fn = k->f->read_probe.fn;
    const char *sym = k->f->read_probe.name;
    kc_used(k, sym);
    enum { N = 4096 + 67 };
    float *p = kc_alloc(k, N * sizeof(float));
    if (k->oom) goto done;
    for (size_t n = 0; n <= N; n += n < 140 ? 1 : 997) {
        double want = 0;
        for (size_t i = 0; i < n; i++) {
            p[i] = (float)((int)(kc_next(k) % 2001) - 1000);
            want += p[i];
        }
        const float got = fn(p, n);
        k->res->cases++;
        if (got != (float)want)
            kc_fail(k, sym, "n=%zu: %.9g != %.9g (integers: exact in any order)", n, (double)got, want);
    }
done:
    free(p);
}

#include "kernel_check_quant.inc"       /* qrowdot, qrowpv, qwiden, q8rowdot */

/* ---- the kinds: one check each, generated from the registry -------------- */
/* the kernels that read operands stored in a dtype (rowdot, rowpv): every
 * registry row with the S flag, checked in its compute dtype */
static void kc_stored(kc_ctx *k, int code, int pv)
{
    const int sd = code == PA_F16 ? 1 : code == PA_BF16 ? 2 : 0;
    if (code != PA_F32 && code != PA_F64 && !sd) {
        kc_fail(k, pv ? "rowpv" : "rowdot", "no twin for storage dtype %s: add one to kernel_check.c",
                k->api->dtypes[code].name);
        return;
    }
    if (k->api->dtypes[code].compute == PA_F32) (pv ? kc_rowpv_f32 : kc_rowdot_f32)(k, code, sd);
    else (pv ? kc_rowpv_f64 : kc_rowdot_f64)(k, code, sd);
}
#define KC_S(CODE, sfx, name, size, compute, c, s, w, pv) PA_WHEN(s)(if (!k->oom) kc_stored(k, PA_##CODE, pv);)
static void kc_rowdot(kc_ctx *k) { PA_DTYPES(KC_S, 0) }
static void kc_rowpv(kc_ctx *k) { PA_DTYPES(KC_S, 1) }
#undef KC_S
#define KC_BOTH(kind) \
    static void kc_##kind(kc_ctx *k) { kc_##kind##_f32(k); if (!k->oom) kc_##kind##_f64(k); }
KC_BOTH(gemm)
KC_BOTH(tilesm)
KC_BOTH(tilep)
KC_BOTH(tileds)
KC_BOTH(softmax)
KC_BOTH(rowsm)
KC_BOTH(softcap)
KC_BOTH(rescale)
KC_BOTH(exp)
#undef KC_BOTH
static void kc_vocab(kc_ctx *k)
{
    if (!k->vocab[PA_F32]) {
        k->res->cases = -1;             /* the generic family has no vector vocabulary */
        return;
    }
    kc_vocab_f32(k);
    kc_vocab_f64(k);
}

/* Every kernel kind of the registry (PA_KERNEL_KINDS) has a row here, by
 * name: a kind registered without a check kc_<kind> does not compile. Then
 * what the registry does not list: the bfloat16 GEMM (a field of its own),
 * the shared vector exp, the vocabulary's rules. */
#define KC_KIND(kind, shape, ret, params, ...) {#kind, kc_##kind},
static const struct {
    const char *name;
    void (*fn)(kc_ctx *);
} kc_kinds[] = {
    PA_KERNEL_KINDS(KC_KIND, _)
    {"gemm_bf16", kc_gemm_bf16},
    {"bf16_pack_p", kc_bf16_pack_p},
    {"bf16_narrow", kc_bf16_narrow},
    {"exp", kc_exp},
    {"vocab", kc_vocab},
};
#undef KC_KIND
#define KC_NKINDS ((int)(sizeof kc_kinds / sizeof kc_kinds[0]))

#define KC_WORD(CODE, word, isa, arch, ...) case PA_ISA_##CODE: return #isa;
static const char *kc_isa_word(int isa)
{
    switch (isa) {
    PA_FAMILIES(KC_WORD, _)
    default: return "?";
    }
}
#undef KC_WORD

int pa_kc_nkinds(void) { return KC_NKINDS; }

const char *pa_kc_kind_name(int kind)
{
    return kind >= 0 && kind < KC_NKINDS ? kc_kinds[kind].name : NULL;
}

int pa_kernel_check(const pa_families_api *api, const pa_family *f, int kind, pa_kc_result *res)
{
    memset(res, 0, sizeof *res);
    if (kind < 0 || kind >= KC_NKINDS) return 0;
    kc_ctx k = {api, f, api->isa_name(f->isa), res, kc_isa_word(f->isa), {NULL, NULL}, {0, 0},
                0x5eed0000ULL + (uint64_t)kind, 0};
    api->vocab_hooks(f->isa, k.vocab);
    for (int d = 0; d < PA_NCOMPUTE; d++)
        k.vl[d] = k.vocab[d] ? k.vocab[d](PA_VOP_LANES, NULL, NULL, NULL, NULL, 0) : 0;
    kc_kinds[kind].fn(&k);
    return k.oom ? -1 : 0;
}

/* The shared vector exp of family f on n values of compute dtype `dtype`
 * (the vocabulary hook's PA_VOP_EXP), for tests/test_exp.py. Returns the
 * family's VL, 0 when the family has no vector exp (the generic family:
 * the C library's), or -1 when n is not a multiple of 16. */
int pa_kc_vexp(const pa_families_api *api, const pa_family *f, int dtype, const void *x, void *y, pa_ssize n)
{
    pa_vocab_fn v[PA_NCOMPUTE];
    api->vocab_hooks(f->isa, v);
    if (dtype < 0 || dtype >= PA_NCOMPUTE || !v[dtype]) return 0;
    if (n % 16) return -1;
    return n ? v[dtype](PA_VOP_EXP, x, x, x, y, n) : 16;
}
