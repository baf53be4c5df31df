/*
 * q8dot_avx2.c -- precision "int8"'s key products (the q8rowdot contract,
 * family.h and csrc/README.md) on AVX2 integer vectors: the x86 families
 * (avx2, avx512, avx512emu) call it for group sizes that are multiples of
 * 16 and head dims up to PA_Q8_MAXE (kernels/vec/quant_vec.inc). Exports
 * pa_q8dot_i16_avx2.
 *
 * Shapes: Q (R, E) int8 query rows (row stride qrs), qs (R, E / G) their
 * float32 scales (qsrs), K (nj, E) int8 or int4 key rows (krs bytes), ks
 * (nj, E / G) the keys' scales (ksrs), s (R, nj) the scores (ss).
 *
 * The integer part: the query row widened to int16 once, each 16 values of
 * a key widened to int16 (int4: nibbles unpacked and sign-extended), then
 * vpmaddwd (pairs of int16 products summed in int32: |q k| <= 127 * 127, no
 * overflow or saturation) added into 8 int32 lanes per (key, group); 8 keys'
 * lanes summed by a horizontal tree into one vector, lane c = key c. Those
 * sums are exact, so any order gives the portable kernel's integers. The
 * float part runs across the 8 keys' lanes in the portable kernel's order:
 * t = qs[g] * ks[g] (one rounding), acc = fma((float)isum, t, acc) from +0,
 * per group in order, then s = acc * scale: the same bits as
 * pa_q8rowdot_ref (kernels/ref/quant_ref.c).
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include <immintrin.h>

#define PA_Q8_TGT __attribute__((target("avx2,fma")))

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

/* lane c of the result: the sum of the 8 int32 lanes of v[c] (exact) */
static inline __attribute__((always_inline)) PA_Q8_TGT __m256i q8_hsum8(const __m256i v[8])
{
    const __m256i h0 = _mm256_hadd_epi32(v[0], v[1]), h1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h2 = _mm256_hadd_epi32(v[4], v[5]), h3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h0, h1), b = _mm256_hadd_epi32(h2, h3);
    /* a's 128-bit halves: keys 0..3 (each half one part of the row); b: keys 4..7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

static inline __attribute__((always_inline)) PA_Q8_TGT void
q8dot_rows(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R, const char *K, pa_ssize krs,
           const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G, const int bits, float scale,
           float *s, pa_ssize ss)
{
    int16_t qw[PA_Q8_MAXE] __attribute__((aligned(32)));
    const pa_ssize rowb = bits == 8 ? E : E / 2;
    const __m256 vscale = _mm256_set1_ps(scale);
    for (pa_ssize r = 0; r < R; r++) {
        const int8_t *q = Q + r * qrs;
        const float *qsc = qs + r * qsrs;
        for (pa_ssize e = 0; e < E; e += 16)
            _mm256_store_si256((__m256i *)(void *)(qw + e),
                               _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(q + e))));
        for (pa_ssize j0 = 0; j0 < nj; j0 += 8) {
            const int nb = nj - j0 < 8 ? (int)(nj - j0) : 8;
            const char *kb = K + j0 * krs;
            if (r == 0)                                  /* the next 8 keys, once */
                for (int c = 0; c < 8 && j0 + 8 + c < nj; c++)
                    for (pa_ssize o = 0; o < rowb; o += 64) __builtin_prefetch(kb + (8 + c) * krs + o, 0, 1);
            __m256 acc = _mm256_setzero_ps();
            for (pa_ssize g0 = 0, g = 0; g0 < E; g0 += G, g++) {
                __m256i v[8];
                float kt[8];
                for (int c = 0; c < 8; c++) {
                    v[c] = _mm256_setzero_si256();
                    kt[c] = 0.0f;
                }
                for (int c = 0; c < nb; c++) {
                    const char *k = kb + c * krs;
                    __m256i a = _mm256_setzero_si256();
                    for (pa_ssize e = g0; e < g0 + G; e += 16)
                        a = _mm256_add_epi32(a, _mm256_madd_epi16(q8_key16(k, e, bits),
                                                                  _mm256_load_si256((const __m256i *)(const void *)(qw + e))));
                    v[c] = a;
                    kt[c] = ks[(j0 + c) * ksrs + g];
                }
                const __m256 t = _mm256_mul_ps(_mm256_set1_ps(qsc[g]), _mm256_loadu_ps(kt));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_hsum8(v)), t, acc);
            }
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(acc, vscale));
            for (int c = 0; c < nb; c++) s[r * ss + j0 + c] = out[c];
        }
    }
}

PA_Q8_TGT void pa_q8dot_i16_avx2(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R,
                                 const void *K, pa_ssize krs, const float *ks, pa_ssize ksrs, pa_ssize nj,
                                 pa_ssize E, pa_ssize G, int bits, float scale, float *s, pa_ssize ss)
{
    if (G % 16 != 0 || E > PA_Q8_MAXE) {
        pa_q8rowdot_ref(Q, qrs, qs, qsrs, R, K, krs, ks, ksrs, nj, E, G, bits, scale, s, ss);
        return;
    }
    if (bits == 8) q8dot_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 8, scale, s, ss);
    else q8dot_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 4, scale, s, ss);
}
#endif
