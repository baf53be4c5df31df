/*
 * dispatch.h -- choosing a kernel family. Nothing else: the families are
 * const structs (family.h), and the binding passes the chosen one to the ops.
 */
#ifndef PYATTN_DISPATCH_H
#define PYATTN_DISPATCH_H

#include "cpu.h"      /* pa_isa_machine, pa_cpu_has_avx512bf16: what the machine is */
#include "family.h"

/* PYATTN_ISA's word for a family code ("generic", "avx2", ...). */
const char *pa_isa_name(int isa);

/* Whether this build has the family of a code (its architecture's). */
int pa_isa_built(int isa);

/* The family for a request: -1 = the best the machine has; an x86 level is
 * capped at the machine's; avx512emu needs AVX2; a family of another
 * architecture, or one not built here, gives the machine's best. */
const pa_family *pa_choose_family(int requested);

#endif
