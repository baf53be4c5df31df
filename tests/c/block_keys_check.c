/* block_keys_check.c -- pa_block_keys (csrc/pyattn.h), the key range of a
 * block of query rows taken from its two end rows, against the union of its
 * rows' ranges (pa_key_range row by row), clipped to a key span [kb, ke) as
 * the frame clips it (key_begin, key_end): equal ends wherever the union is
 * nonempty, and empty exactly when it is. The tiled paths visit only the key
 * tiles of that range, so a key rule whose ranges stop growing with the row
 * (or jump past the previous row's end) fails here, naming the rule.
 *
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -Icsrc tests/c/block_keys_check.c -o /tmp/bkc && /tmp/bkc
 */
#include <stdio.h>
#include "pyattn.h"

int main(void)
{
    long cases = 0, bad = 0;
    for (pa_ssize S = 0; S <= 7; S++)
    for (pa_ssize qoff = -12; qoff <= 12; qoff++)
    for (int causal = 0; causal < 2; causal++)
    for (pa_ssize left = -1; left <= 4; left++)
    for (pa_ssize right = -1; right <= 4; right++)
    for (pa_ssize div = 1; div <= 3; div++) {
        const pa_keyrule r = {S, qoff, causal, left, right, div};
        for (pa_ssize kb = 0; kb <= S + 1; kb++)
        for (pa_ssize ke = kb; ke <= S + 1; ke++)
        for (pa_ssize i0 = 0; i0 < 14; i0++)
        for (pa_ssize i1 = i0 + 1; i1 <= 14; i1++) {
            pa_ssize ulo = ke, uhi = kb;            /* the union, row by row */
            for (pa_ssize i = i0; i < i1; i++) {
                pa_ssize a, b;
                pa_key_range(&r, i, &a, &b);
                a = pa_max(a, kb);
                b = pa_min(b, ke);
                if (a < b) { ulo = pa_min(ulo, a); uhi = pa_max(uhi, b); }
            }
            pa_ssize lo, hi;
            pa_block_keys(&r, i0, i1, &lo, &hi);
            lo = pa_max(lo, kb);
            hi = pa_min(hi, ke);
            cases++;
            const int uempty = ulo >= uhi, empty = lo >= hi;
            if (uempty != empty || (!empty && (lo != ulo || hi != uhi))) {
                if (bad++ < 10)
                    printf("S=%td qoff=%td causal=%d window=(%td, %td) div=%td keys [%td, %td) rows [%td, %td): "
                           "pa_block_keys [%td, %td) != union [%td, %td)\n",
                           S, qoff, causal, left, right, div, kb, ke, i0, i1, lo, hi, ulo, uhi);
            }
        }
    }
    printf("pa_block_keys: %ld cases, %ld wrong\n", cases, bad);
    return bad != 0;
}
