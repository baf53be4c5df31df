/* cpu.h -- the machine's cache sizes in bytes, per core or shared, as the OS
 * reports them (cpu.c); 0 where it does not say. */
#ifndef PYATTN_CPU_H
#define PYATTN_CPU_H

#include <stddef.h>

void pa_cache_sizes(size_t *l1d, size_t *l2, size_t *l3);

#endif
