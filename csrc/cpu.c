/*
 * cpu.c -- what the machine's caches are, as the OS reports them (for
 * show_config and the benchmark's notes; the kernels' blocking is fixed per
 * family, see its table in kernels/<arch>/<isa>.c). 0 where the OS does not say.
 *
 * Linux: the per-core description in /sys/devices/system/cpu/cpu0/cache
 * first (glibc's sysconf mis-reports the L3 of some AMD guests, e.g. 320 MiB
 * for a 32 MiB L3), sysconf where sysfs says nothing.
 */
#define _GNU_SOURCE
#include "cpu.h"

#if defined(__linux__)
#include <stdio.h>
#include <string.h>
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

#if defined(__linux__)
/* The first line of a sysfs file, without its newline; 0 if unreadable. */
static int read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    int ok = 0;
    if (f == NULL)
        return 0;
    if (fgets(buf, (int)n, f) != NULL) {
        buf[strcspn(buf, "\n")] = '\0';
        ok = 1;
    }
    fclose(f);
    return ok;
}

/* "32K", "1024K", "32M" or a plain byte count; 0 if it is none of these. */
static size_t parse_size(const char *s)
{
    size_t v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (v > ((size_t)1 << 40))
            return 0;
        v = v * 10 + (size_t)(*s - '0');
    }
    if (!digits)
        return 0;
    if (*s == 'K')
        return v << 10;
    if (*s == 'M')
        return v << 20;
    return *s == '\0' ? v : 0;
}

static void sysfs_caches(size_t *l1d, size_t *l2, size_t *l3)
{
    char path[96], level[16], type[32], size[32];
    for (int i = 0; i < 16; i++) {
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!read_line(path, level, sizeof level))
            break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!read_line(path, type, sizeof type) || strcmp(type, "Instruction") == 0)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!read_line(path, size, sizeof size))
            continue;
        size_t bytes = parse_size(size);
        if (strcmp(level, "1") == 0)
            *l1d = bytes;
        else if (strcmp(level, "2") == 0)
            *l2 = bytes;
        else if (strcmp(level, "3") == 0)
            *l3 = bytes;
    }
}
#endif

void pa_cache_sizes(size_t *l1d, size_t *l2, size_t *l3)
{
    *l1d = *l2 = *l3 = 0;
#if defined(__linux__)
    sysfs_caches(l1d, l2, l3);
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    long a = sysconf(_SC_LEVEL1_DCACHE_SIZE), b = sysconf(_SC_LEVEL2_CACHE_SIZE),
         c = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (*l1d == 0 && a > 0)
        *l1d = (size_t)a;
    if (*l2 == 0 && b > 0)
        *l2 = (size_t)b;
    if (*l3 == 0 && c > 0)
        *l3 = (size_t)c;
#endif
#elif defined(__APPLE__)
    *l1d = sysctl_size("hw.l1dcachesize");
    *l2 = sysctl_size("hw.l2cachesize");
    *l3 = sysctl_size("hw.l3cachesize");
#endif
}
