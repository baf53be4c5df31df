/*
 * kernel_check_main.c -- the per-kernel checks (csrc/check/kernel_check.c) as a
 * plain C program, without Python: every family this build has and this CPU
 * runs, every kind; prints each kind's case count and every failure line;
 * exits 1 on a failure. For machines where Python and NumPy are not at hand
 * (a cross-compiled aarch64 binary under qemu-user, the neon family):
 *
 *   SRC="csrc/check/kernel_check.c csrc/families_api.c csrc/dispatch.c csrc/cpu.c
 *        csrc/ukr_select.c csrc/ops/common.c"
 *   aarch64-linux-gnu-gcc -std=c11 -O2 -ffp-contract=off -static -Icsrc -Icsrc/check \
 *     tests/c/kernel_check_main.c $SRC csrc/kernels/ref/[a-z]*.c csrc/kernels/arm/[a-z]*.c \
 *     -lm -o build/kc_arm64
 *   qemu-aarch64-static build/kc_arm64
 *
 * (x86-64: gcc, and csrc/kernels/x86/[a-z]*.c for the arm files.) tests/test_kernels.py
 * runs the same checks through the test-only extension _kcheck (tests/kcheck.py).
 * The checks reach the family tables through families_api.h, here linked
 * directly (pa_families_api_table), in _kcheck through _C's capsule.
 */
#include <stdio.h>

#include "dispatch.h"
#include "kernel_check.h"

int main(void)
{
    static pa_kc_result res;
    int bad = 0;
    for (int isa = 0; isa < PA_ISA_COUNT; isa++) {
        if (!pa_isa_built(isa)) continue;
        const pa_family *f = pa_choose_family(isa);
        if (f->isa != isa) {
            printf("%s: this CPU cannot run it\n", pa_isa_name(isa));
            continue;
        }
        for (int k = 0; k < pa_kc_nkinds(); k++) {
            if (pa_kernel_check(&pa_families_api_table, f, k, &res) < 0) {
                printf("%s %s: out of memory\n", pa_isa_name(isa), pa_kc_kind_name(k));
                return 2;
            }
            printf("%s %-10s %8lld cases, %lld failed\n", pa_isa_name(isa), pa_kc_kind_name(k), res.cases,
                   res.failures);
            for (int i = 0; i < res.nlines; i++) printf("  %s\n", res.lines[i]);
            if (res.cases == 0) printf("  %s %s: no case checked\n", pa_isa_name(isa), pa_kc_kind_name(k));
            bad |= res.failures > 0 || res.cases == 0;
        }
    }
    printf(bad ? "FAILED\n" : "ok\n");
    return bad;
}
