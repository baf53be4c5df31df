/* cpu.h -- what the machine is (cpu.c): the best kernel family it supports,
 * AVX512_BF16, and its cache sizes in bytes, per core or shared, as the OS
 * reports them (0 where it does not say). */
#ifndef PYATTN_CPU_H
#define PYATTN_CPU_H

#include <stddef.h>

#include "family.h"

/* The best family this CPU and OS support (PA_ISA_*), detected once. */
int pa_isa_machine(void);

/* Whether the CPU has AVX512_BF16 (vdpbf16ps) with AVX-512 usable. */
int pa_cpu_has_avx512bf16(void);
/* Whether the CPU has AVX512_VNNI (vpdpbusd) with AVX-512 usable. */
int pa_cpu_has_avx512vnni(void);

/* How decode reads a float cache here (PA_READ_*, family.h): PYATTN_DECODE_READ
 * ("hw", "nta", "gather") or the CPU's vendor. */
int pa_cpu_decode_read(void);

void pa_cache_sizes(size_t *l1d, size_t *l2, size_t *l3);

#endif
