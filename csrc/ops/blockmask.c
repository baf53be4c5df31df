/*
 * blockmask.c -- the BlockMask builder's C part: a tile's bools (from the
 * user's mask_mod) classified as empty / full / partial and packed into
 * one 64-bit word per row (blockmask.h). Calls nothing.
 */
#include "blockmask.h"

void pa_bm_pack(const uint8_t *m, pa_ssize n, const int64_t *tq, const int64_t *tk, pa_ssize L,
                pa_ssize S, uint8_t *state, uint64_t *bits)
{
    for (pa_ssize k = 0; k < n; k++) {
        const uint8_t *t = m + k * (PA_BM_QB * PA_BM_KB);
        const pa_ssize nr = pa_min(L - tq[k] * PA_BM_QB, PA_BM_QB);
        const pa_ssize nc = pa_min(S - tk[k] * PA_BM_KB, PA_BM_KB);
        uint64_t *w = bits + k * PA_BM_QB;
        pa_ssize ones = 0;
        for (pa_ssize r = 0; r < PA_BM_QB; r++) {
            uint64_t x = 0;
            if (r < nr)
                for (pa_ssize c = 0; c < nc; c++) {
                    const uint64_t on = t[r * PA_BM_KB + c] != 0;
                    x |= on << c;
                    ones += (pa_ssize)on;
                }
            w[r] = x;
        }
        state[k] = ones == 0 ? PA_BM_EMPTY : ones == nr * nc ? PA_BM_FULL : PA_BM_PARTIAL;
    }
}
