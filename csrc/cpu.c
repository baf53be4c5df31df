/*
 * cpu.c -- what the machine's caches are, as the OS reports them (for
 * show_config and the benchmark's notes; the kernels' blocking is fixed per
 * family, see kernels/<arch>/family.c). 0 where the OS does not say.
 */
#define _GNU_SOURCE
#include "cpu.h"

#if defined(__linux__)
#include <unistd.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#if defined(__APPLE__)
static size_t sysctl_size(const char *name)
{
    int64_t v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v > 0 ? (size_t)v : 0;
}
#endif

void pa_cache_sizes(size_t *l1d, size_t *l2, size_t *l3)
{
    *l1d = *l2 = *l3 = 0;
#if defined(__linux__) && defined(_SC_LEVEL1_DCACHE_SIZE)
    long a = sysconf(_SC_LEVEL1_DCACHE_SIZE), b = sysconf(_SC_LEVEL2_CACHE_SIZE),
         c = sysconf(_SC_LEVEL3_CACHE_SIZE);
    *l1d = a > 0 ? (size_t)a : 0;
    *l2 = b > 0 ? (size_t)b : 0;
    *l3 = c > 0 ? (size_t)c : 0;
#elif defined(__APPLE__)
    *l1d = sysctl_size("hw.l1dcachesize");
    *l2 = sysctl_size("hw.l2cachesize");
    *l3 = sysctl_size("hw.l3cachesize");
#endif
}
