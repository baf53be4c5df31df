/*
 * q8dot_vnni.c -- precision "int8"'s key products (the q8rowdot contract,
 * family.h and csrc/README.md) on AVX512_VNNI's vpdpbusd: 64 int8 products
 * per instruction. The avx512 family's tables for CPUs with AVX512_VNNI
 * (dispatch.c) take it as their q8rowdot; other shapes go to the AVX2
 * integer kernel (q8dot_avx2.c), the same bits. Exports
 * pa_q8rowdot_avx512vnni.
 *
 * Shapes: Q (R, E) int8 query rows (row stride qrs), qs (R, E / G) their
 * float32 scales (qsrs), K (nj, E) int8 or int4 key rows (krs bytes), ks
 * (nj, E / G) the keys' scales (ksrs), s (R, nj) the scores (ss).
 *
 * vpdpbusd multiplies unsigned by signed bytes and adds each 4 products
 * into a 32-bit lane. A block of 16 keys is transposed once (16 x 16
 * dwords per 64 values: lane c = 4 values of key c, int4 unpacked and
 * sign-extended first), so each lane gathers one key's sum and no
 * horizontal sums are needed; the query is the unsigned side, biased
 * (q + 128, each 4 bytes broadcast), and each group's lanes start from -128
 * times the key's sum over the group (vpdpbusd of 128s, once per block):
 * the exact integer sum of the group's products, for any group size that is
 * a multiple of 4 (|sums| < 2^31: E <= 512). Then the portable kernel's
 * float steps across the 16 lanes: t = qs[g] * ks[g], acc = fma((float)isum,
 * t, acc) from +0 in group order, s = acc * scale -- pa_q8rowdot_ref's bits
 * (kernels/ref/quant_ref.c). Query rows run 4 at a time against a block.
 * Head dims that are multiples of 64.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include <immintrin.h>

#define VN_TGT __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define VN_INL static inline __attribute__((always_inline)) VN_TGT

/* 64 values of a key row from value e as signed bytes in value order
 * (int4: the nibbles unpacked and sign-extended) */
VN_INL __m512i vn_key64(const char *k, pa_ssize e, const int bits)
{
    if (bits == 8) return _mm512_loadu_si512((const void *)(k + e));
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(k + e / 2)));
    const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi16(0x000f));              /* value e + 2i */
    const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f00));   /* e + 2i + 1 */
    const __m512i eight = _mm512_set1_epi8(8);
    return _mm512_sub_epi8(_mm512_xor_si512(_mm512_or_si512(lo, hi), eight), eight);
}

/* bytes of key rows ahead to prefetch (as quant_vec.inc's decode kernels) */
#define VN_PFB 32768

#define VN_SH(x, y, d, c, b, a) _mm512_shuffle_i32x4((x), (y), _MM_SHUFFLE(d, c, b, a))

/* 16 rows of 16 dwords -> T[d] (d = 0..15): lane c = dword d of row c */
VN_INL void vn_transpose(const __m512i r[16], __m512i T[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {           /* u[4i + j] block b: rows 4i..4i+3, dword 4b + j */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {           /* the 4 x 4 transpose of 128-bit blocks */
        const __m512i P0 = VN_SH(u[j], u[4 + j], 1, 0, 1, 0), P1 = VN_SH(u[j], u[4 + j], 3, 2, 3, 2);
        const __m512i P2 = VN_SH(u[8 + j], u[12 + j], 1, 0, 1, 0), P3 = VN_SH(u[8 + j], u[12 + j], 3, 2, 3, 2);
        T[j] = VN_SH(P0, P2, 2, 0, 2, 0);
        T[4 + j] = VN_SH(P0, P2, 3, 1, 3, 1);
        T[8 + j] = VN_SH(P1, P3, 2, 0, 2, 0);
        T[12 + j] = VN_SH(P1, P3, 3, 1, 3, 1);
    }
}

/* rb query rows (a literal) against the block's transposed keys T (E / 4
 * dwords, lane c = key c), their groups' -128 * key sums nk and scales kt */
VN_INL void vn_block_rows(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, const __m512i *T,
                          const __m512i *nk, const __m512 *kt, pa_ssize E, pa_ssize G, __mmask16 live,
                          __m512 vscale, float *s, pa_ssize ss, const int rb)
{
    uint8_t qb[4][PA_Q8_MAXE] __attribute__((aligned(64)));     /* q + 128 as unsigned bytes */
    for (int r = 0; r < rb; r++)
        for (pa_ssize e = 0; e < E; e += 64)
            _mm512_store_si512((void *)(qb[r] + e), _mm512_xor_si512(_mm512_loadu_si512((const void *)(Q + r * qrs + e)),
                                                                        _mm512_set1_epi8((char)0x80)));
    __m512 acc[4];
    for (int r = 0; r < rb; r++) acc[r] = _mm512_setzero_ps();
    const pa_ssize dg = G / 4;
    for (pa_ssize g = 0, d0 = 0; d0 < E / 4; g++, d0 += dg) {
        __m512i a[4];
        for (int r = 0; r < rb; r++) a[r] = nk[g];
        for (pa_ssize d = d0; d < d0 + dg; d++)
            for (int r = 0; r < rb; r++) {
                int32_t w;
                __builtin_memcpy(&w, qb[r] + 4 * d, 4);
                a[r] = _mm512_dpbusd_epi32(a[r], _mm512_set1_epi32(w), T[d]);
            }
        for (int r = 0; r < rb; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), _mm512_mul_ps(_mm512_set1_ps(qs[r * qsrs + g]), kt[g]),
                                     acc[r]);
    }
    for (int r = 0; r < rb; r++) _mm512_mask_storeu_ps(s + r * ss, live, _mm512_mul_ps(acc[r], vscale));
}

VN_INL void vn_rows(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R, const char *K,
                    pa_ssize krs, const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G,
                    const int bits, float scale, float *s, pa_ssize ss)
{
    __m512i T[PA_Q8_MAXE / 4], nk[PA_Q8_MAXE / 4];
    __m512 kt[PA_Q8_MAXE / 4];
    const pa_ssize ng = E / G, rowb = bits == 8 ? E : E / 2;
    const pa_ssize pfk = VN_PFB / rowb > 16 ? VN_PFB / rowb : 16;   /* keys ahead to prefetch */
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ksrs));
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    for (pa_ssize j0 = 0; j0 < nj; j0 += 16) {
        const int nb = nj - j0 < 16 ? (int)(nj - j0) : 16;
        const __mmask16 live = (__mmask16)((1u << nb) - 1u);
        const char *kb = K + j0 * krs;
        for (int c = 0; c < 16; c++) {               /* the rows pfk keys ahead (a hint: never faults) */
            for (pa_ssize o = 0; o < rowb; o += 64) __builtin_prefetch(kb + (pfk + c) * krs + o, 0, 1);
            __builtin_prefetch(ks + (j0 + pfk + c) * ksrs, 0, 1);
        }
        for (pa_ssize e = 0; e < E; e += 64) {                      /* the keys, transposed */
            __m512i rows[16];
            for (int c = 0; c < 16; c++)
                rows[c] = c < nb ? vn_key64(kb + c * krs, e, bits) : _mm512_setzero_si512();
            vn_transpose(rows, T + e / 4);
        }
        for (pa_ssize g = 0; g < ng; g++) {                          /* -128 * each group's key sum */
            __m512i k = _mm512_setzero_si512();
            for (pa_ssize d = g * (G / 4); d < (g + 1) * (G / 4); d++) k = _mm512_dpbusd_epi32(k, c128, T[d]);
            nk[g] = _mm512_sub_epi32(_mm512_setzero_si512(), k);
            kt[g] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx, ks + j0 * ksrs + g, 4);
        }
        pa_ssize r = 0;
        for (; r + 4 <= R; r += 4)
            vn_block_rows(Q + r * qrs, qrs, qs + r * qsrs, qsrs, T, nk, kt, E, G, live, vscale, s + r * ss + j0, ss, 4);
        if (R - r == 3)
            vn_block_rows(Q + r * qrs, qrs, qs + r * qsrs, qsrs, T, nk, kt, E, G, live, vscale, s + r * ss + j0, ss, 3);
        else if (R - r == 2)
            vn_block_rows(Q + r * qrs, qrs, qs + r * qsrs, qsrs, T, nk, kt, E, G, live, vscale, s + r * ss + j0, ss, 2);
        else if (R - r == 1)
            vn_block_rows(Q + r * qrs, qrs, qs + r * qsrs, qsrs, T, nk, kt, E, G, live, vscale, s + r * ss + j0, ss, 1);
    }
}

VN_TGT void pa_q8rowdot_avx512vnni(const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs, pa_ssize R,
                                   const void *K, pa_ssize krs, const float *ks, pa_ssize ksrs, pa_ssize nj,
                                   pa_ssize E, pa_ssize G, int bits, float scale, float *s, pa_ssize ss)
{
    const int shape = E % 64 == 0 && E <= PA_Q8_MAXE && G > 0 && G % 4 == 0 && ksrs >= 0 &&
                      ksrs <= 0x7fffffff / 16;
    if (!shape) {
        pa_q8dot_i16_avx2(Q, qrs, qs, qsrs, R, K, krs, ks, ksrs, nj, E, G, bits, scale, s, ss);
        return;
    }
    if (bits == 8) vn_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 8, scale, s, ss);
    else vn_rows(Q, qrs, qs, qsrs, R, (const char *)K, krs, ks, ksrs, nj, E, G, 4, scale, s, ss);
}
#endif
