/*
 * families_api.h -- what the shipped pyattn._C lends the test-only extension
 * of the kernel checks (csrc/check/, built by tests/kcheck.py, never
 * installed): the family tables and the few things of _C's that the checks
 * reach, as one const struct. module.c exports its address as the private
 * capsule pyattn._C._families_capsule (PA_FAMILIES_API_NAME); the checks'
 * module refuses a struct of another version or layout. Nothing here runs
 * at import: the struct is static data.
 */
#ifndef PYATTN_FAMILIES_API_H
#define PYATTN_FAMILIES_API_H

#include "family.h"
#include "kernels/vec/vocab_check.h"

#define PA_FAMILIES_API_NAME "pyattn._C._families_capsule"
#define PA_FAMILIES_API_VERSION 1   /* bump on any change of the fields below */

typedef struct {
    int version;                /* PA_FAMILIES_API_VERSION */
    int size;                   /* sizeof(pa_families_api) */
    int family_size;            /* sizeof(pa_family): the tables' layout */
    int isa_count;              /* PA_ISA_COUNT */
    int ndtypes;                /* PA_NDTYPES */
    const pa_family *(*choose_family)(int requested);   /* dispatch.h's pa_choose_family */
    const char *(*isa_name)(int isa);                   /* dispatch.h's pa_isa_name */
    int (*isa_built)(int isa);                          /* dispatch.h's pa_isa_built */
    const pa_dtype_info *dtypes;                        /* pyattn.h's pa_dtypes */
    /* a family's vocabulary test hooks pa_vocab_<dt>_<isa> (kernels/vec/vocab_check.inc),
     * by compute dtype; NULL for a family without a vector vocabulary (generic) */
    void (*vocab_hooks)(int isa, pa_vocab_fn v[PA_NCOMPUTE]);
} pa_families_api;

/* the one instance (families_api.c) */
extern const pa_families_api pa_families_api_table;

#endif
