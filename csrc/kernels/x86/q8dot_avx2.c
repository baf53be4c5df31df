/*
 * q8dot_avx2.c -- precision "int8"'s key products (the q8rowdot contract,
 * family.h and csrc/README.md) on AVX2 integer vectors: the x86 families
 * (avx2, avx512, avx512emu) call it for even group sizes and head dims
 * that are multiples of 16 up to PA_Q8_MAXE (kernels/vec/quant_vec.inc). Exports
 * pa_q8dot_i16_avx2.
 *
 * Shapes: Q (R, E) int8 query rows (row stride qrs), qs (R, E / G) their
 * float32 scales (qsrs), K (nj, E) int8 or int4 key rows (krs bytes), ks
 * (nj, E / G) the keys' scales (ksrs), s (R, nj) the scores (ss).
 *
 * The integer part: a block of 8 keys widened to int16 (int4: nibbles
 * unpacked and sign-extended) and transposed (8 x 8 dwords per 16 values:
 * lane c = 2 values of key c), then per group vpmaddwd of the broadcast
 * query pairs (int16) against it, added in int32 (|q k| <= 128 * 128: no
 * overflow, no saturation): lane c ends at key c's exact group sum, with no
 * horizontal sums. Up to 4 query rows per pass share the block. The float
 * part runs across the 8 keys' lanes in the portable kernel's order:
 * t = qs[g] * ks[g] (one rounding), acc = fma((float)isum, t, acc) from +0,
 * per group in order, then s = acc * scale: the same bits as
 * pa_q8rowdot_ref (kernels/ref/quant_ref.c). Even group sizes, head dims
 * that are multiples of 16 (others go portable).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include <immintrin.h>

#define PA_Q8_TGT __attribute__((target("avx2,fma")))
/* bytes of key rows ahead to prefetch (as quant_vec.inc's decode kernels) */
#define Q8_PFB 32768

/* 16 values of a key row from value e as int16: int8 bytes, or int4 pairs
 * (value e in byte e / 2, the even one in the low nibble, two's complement) */
static inline __attribute__((always_inline)) PA_Q8_TGT __m256i q8_key16(const char *k, pa_ssize e, const int bits)
{
    if (bits == 8) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(k + e)));
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(k + e / 2));
    const __m128i m = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m128i v = _mm_unpacklo_epi8(lo, hi);                     /* values e .. e + 15 as nibbles */
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_xor_si128(v, eight), eight));   /* sign-extended */
}

/* 8 rows of 8 dwords -> T[d] (d = 0..7): lane c = dword d of row c */
static inline __attribute__((always_inline)) PA_Q8_TGT void q8_transpose8(const __m256i r[8], __m256i *T)
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {           /* u[4i + j] half h: rows 4i..4i+3, dword 4h + j */
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        T[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        T[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* rb query rows (a literal; widened to int16 in qw) against a block's
 * transposed keys T (E / 2 dwords, lane c = 2 values of key c) and the
 * groups' key scales kt */
static inline __attribute__((always_inline)) PA_Q8_TGT void
q8_block_rows(const int16_t (*qw)[PA_Q8_MAXE], const float *qs, pa_ssize qsrs, const __m256i *T, const __m256 *kt,
              pa_ssize E, pa_ssize G, int nb, __m256 vscale, float *s, pa_ssize ss, const int rb)
{
    __m256 acc[4];
    for (int r = 0; r < rb; r++) acc[r] = _mm256_setzero_ps();
    const pa_ssize dg = G / 2;
    for (pa_ssize g = 0, d0 = 0; d0 < E / 2; g++, d0 += dg) {
        __m256i a[4];
        for (int r = 0; r < rb; r++) a[r] = _mm256_setzero_si256();
        for (pa_ssize d = d0; d < d0 + dg; d++)
            for (int r = 0; r < rb; r++) {
                int32_t w;
                __builtin_memcpy(&w, qw[r] + 2 * d, 4);
                a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_set1_epi32(w), T[d]));
            }
        for (int r = 0; r < rb; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(_mm256_set1_ps(qs[r * qsrs + g]), kt[g]),
                                     acc[r]);
    }
    for (int r = 0; r < rb; r++) {
        float out[8];
        _mm256_storeu_ps(out, _mm256_mul_ps(acc[r], vscale));
        for (int c = 0; c < nb; c++) s[r * ss + c] = out[c];
    }
}

static inline __attribute__((always_inline)) PA_Q8_TGT void
q8dot_rows(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R, const char *K, pa_ssize krs,
           const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G, const int bits, float scale,
           float *s, pa_ssize ss)
{
    int16_t qw[4][PA_Q8_MAXE] __attribute__((aligned(32)));
    __m256i T[PA_Q8_MAXE / 2];
    __m256 kt[PA_Q8_MAXE / 2];
    const pa_ssize rowb = bits == 8 ? E : E / 2, ng = E / G;
    const pa_ssize pfk = Q8_PFB / rowb > 8 ? Q8_PFB / rowb : 8;    /* keys ahead to prefetch */
    const __m256 vscale = _mm256_set1_ps(scale);
    for (pa_ssize r0 = 0; r0 < R; r0 += 4) {                      /* rows 4 at a time */
        const int rb = R - r0 >= 4 ? 4 : (int)(R - r0);
        for (int r = 0; r < rb; r++)
            for (pa_ssize e = 0; e < E; e += 16)
                _mm256_store_si256((__m256i *)(void *)(qw[r] + e),
                                   _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(Q + (r0 + r) * qrs + e))));
        for (pa_ssize j0 = 0; j0 < nj; j0 += 8) {
            const int nb = nj - j0 < 8 ? (int)(nj - j0) : 8;
            const char *kb = K + j0 * krs;
            if (r0 == 0)
                for (int c = 0; c < 8; c++) {            /* the rows pfk keys ahead (a hint) */
                    for (pa_ssize o = 0; o < rowb; o += 64) __builtin_prefetch(kb + (pfk + c) * krs + o, 0, 1);
                    __builtin_prefetch(ks + (j0 + pfk + c) * ksrs, 0, 1);
                }
            for (pa_ssize e = 0; e < E; e += 16) {      /* the keys as int16, transposed */
                __m256i rows[8];
                for (int c = 0; c < 8; c++) rows[c] = c < nb ? q8_key16(kb + c * krs, e, bits) : _mm256_setzero_si256();
                q8_transpose8(rows, T + e / 2);
            }
            for (pa_ssize g = 0; g < ng; g++) {
                float k8[8];
                for (int c = 0; c < 8; c++) k8[c] = c < nb ? ks[(j0 + c) * ksrs + g] : 0.0f;
                kt[g] = _mm256_loadu_ps(k8);
            }
            const float *qsr = qs + r0 * qsrs;
            float *sr = s + r0 * ss + j0;
            if (rb == 4) q8_block_rows((const int16_t (*)[PA_Q8_MAXE])qw, qsr, qsrs, T, kt, E, G, nb, vscale, sr, ss, 4);
            else if (rb == 3) q8_block_rows((const int16_t (*)[PA_Q8_MAXE])qw, qsr, qsrs, T, kt, E, G, nb, vscale, sr, ss, 3);
            else if (rb == 2) q8_block_rows((const int16_t (*)[PA_Q8_MAXE])qw, qsr, qsrs, T, kt, E, G, nb, vscale, sr, ss, 2);
            else q8_block_rows((const int16_t (*)[PA_Q8_MAXE])qw, qsr, qsrs, T, kt, E, G, nb, vscale, sr, ss, 1);
        }
    }
}

PA_Q8_TGT void pa_q8dot_i16_avx2(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R,
                                 const void *K, pa_ssize krs, const float *ks, pa_ssize ksrs, pa_ssize nj,
                                 pa_ssize E, pa_ssize G, int bits, float scale, float *s, pa_ssize ss)
{
    if (G % 2 != 0 || E % 16 != 0 || E > PA_Q8_MAXE) {
        pa_q8rowdot_ref(Q, qrs, qs, qsrs, R, K, krs, ks, ksrs, nj, E, G, bits, scale, s, ss);
        return;
    }
    if (bits == 8) q8dot_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 8, scale, s, ss);
    else q8dot_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 4, scale, s, ss);
}
#endif
