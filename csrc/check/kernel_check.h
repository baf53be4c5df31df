/*
 * kernel_check.h -- every kernel of a family checked on its own against its
 * portable twin (kernel_check.c): the contract of csrc/README.md written as
 * scalar C, case by case (edge tiles, ragged widths, special values), bit
 * for bit where the contract fixes the bits. Test-only: not in the shipped
 * pyattn._C; built with kcheck_module.c as the extension _kcheck
 * (tests/kcheck.py, tests/test_kernels.py) or with tests/c/kernel_check_main.c
 * as a C program. What it needs of _C's it gets through families_api.h.
 */
#ifndef PYATTN_KERNEL_CHECK_H
#define PYATTN_KERNEL_CHECK_H

#include "families_api.h"

#define PA_KC_LINE 360        /* bytes of one failure line */
#define PA_KC_MAXLINES 12     /* failure lines kept per kind (the rest counted) */

typedef struct {
    long long cases;          /* cases checked; -1: the kind does not apply to this family */
    long long failures;       /* cases that failed (one line each, the first PA_KC_MAXLINES kept) */
    int nlines;
    char lines[PA_KC_MAXLINES][PA_KC_LINE];   /* "<family> <kernel>: <case>: <what differs>" */
    int nused;
    const char *used[8];      /* the kernels it ran (their symbols, from the family's table) */
} pa_kc_result;

/* The kinds checked, in order: pa_kc_nkinds() of them, named by pa_kc_kind_name. */
int pa_kc_nkinds(void);
const char *pa_kc_kind_name(int kind);

/* Checks kind `kind` (0 <= kind < pa_kc_nkinds()) of family f (from
 * api->choose_family) into *res. Returns 0, or -1 when out of memory. Reads
 * no global state; runs no threads. */
int pa_kernel_check(const pa_families_api *api, const pa_family *f, int kind, pa_kc_result *res);

/* The shared vector exp of f (its vocabulary's vexp) on n values (n a
 * multiple of 16) of compute dtype `dtype`: returns VL, 0 where f has no
 * vector exp, -1 for a bad n. A test hook (_kcheck.vexp). */
int pa_kc_vexp(const pa_families_api *api, const pa_family *f, int dtype, const void *x, void *y, pa_ssize n);


#endif
