/*
 * cpu.c -- what the machine is: the best kernel family the CPU and the OS
 * support (CPUID + XGETBV on x86-64; the architecture itself on aarch64, where
 * NEON is baseline and no optional extension is used, so there is no HWCAP to
 * read), whether it has AVX512_BF16, and its caches as the OS reports them (for
 * show_config and the benchmark's notes; the kernels' blocking is fixed per
 * family, see its table in kernels/<arch>/<isa>.c). 0 where the OS does not say.
 * Below dispatch.c and ukr_select.c, which both ask it; it asks nothing.
 *
 * Linux: the per-core description in /sys/devices/system/cpu/cpu0/cache
 * first (glibc's sysconf mis-reports the L3 of some AMD guests, e.g. 320 MiB
 * for a 32 MiB L3), sysconf where sysfs says nothing.
 */
#define _GNU_SOURCE
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

#ifdef PA_HAVE_X86_KERNELS
#include <cpuid.h>

static unsigned long long pa_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Best family this CPU *and* the OS (saved register state) support. */
static int pa_detect_isa(void)
{
#if defined(PA_HAVE_X86_KERNELS)
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return PA_ISA_GENERIC;
    unsigned long long xcr0 = pa_xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return PA_ISA_GENERIC;            /* XMM + YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1;
    int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    if (!avx2 || !fma || !f16c) return PA_ISA_GENERIC;
    if (avx512f && avx512dq && avx512bw && avx512vl && (xcr0 & 0xe6) == 0xe6)
        return PA_ISA_AVX512;                                  /* + opmask, ZMM state */
    return PA_ISA_AVX2;
#elif defined(PA_HAVE_NEON_KERNELS)
    return PA_ISA_NEON;
#else
    return PA_ISA_GENERIC;
#endif
}

/* AVX512_BF16 (CPUID leaf 7, subleaf 1, EAX bit 5) with the AVX-512 state. */
int pa_cpu_has_avx512bf16(void)
{
#if defined(PA_HAVE_X86_KERNELS)
    static int has = -1;         /* first set under the GIL, at import */
    if (has < 0) {
        unsigned int a, b, c, d;
        has = pa_isa_machine() == PA_ISA_AVX512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
              ((a >> 5) & 1);
        const char *cap = getenv("PYATTN_TEST_CPU");    /* testing hook: the emulation on any AVX-512 CPU */
        if (cap && !strcmp(cap, "nobf16")) has = 0;
    }
    return has;
#else
    return 0;
#endif
}

/* AVX512_VNNI (CPUID leaf 7, subleaf 0, ECX bit 11) with the AVX-512 state. */
int pa_cpu_has_avx512vnni(void)
{
#if defined(PA_HAVE_X86_KERNELS)
    static int has = -1;         /* first set under the GIL, at import */
    if (has < 0) {
        unsigned int a, b, c, d;
        has = pa_isa_machine() == PA_ISA_AVX512 && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
              ((c >> 11) & 1);
        const char *cap = getenv("PYATTN_TEST_CPU");    /* testing hook: without VNNI on any AVX-512 CPU */
        if (cap && strstr(cap, "novnni")) has = 0;
    }
    return has;
#else
    return 0;
#endif
}

/* How decode reads a float cache on this CPU (family.h, PA_READ_*): the
 * word of PYATTN_DECODE_READ ("hw", "t2", "nta", "gather") where it is one
 * of them, else by vendor. Measured (Intel Xeon, KVM, AVX-512, 1 thread,
 * E=128, S=16384; % of the read probe in the same run): in place with
 * prefetcht2 8 KiB ahead 79-95 %, with the hardware's prefetchers alone
 * 72-89 %, the tile copied 55-75 %, in place with prefetchnta 21-31 % --
 * Intel CPUs read in place with prefetcht2. AMD's and other CPUs' reads are not
 * measured against each other on this code: they keep the copy (what
 * pyattn did everywhere before). */
int pa_cpu_decode_read(void)
{
    const char *env = getenv("PYATTN_DECODE_READ");
    if (env && !strcmp(env, "hw")) return PA_READ_HW;
    if (env && !strcmp(env, "nta")) return PA_READ_NTA;
    if (env && !strcmp(env, "gather")) return PA_READ_GATHER;
    if (env && !strcmp(env, "t2")) return PA_READ_T2;
#if defined(PA_HAVE_X86_KERNELS)
    unsigned int a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu)
        return PA_READ_T2;                                     /* "GenuineIntel" */
#endif
    return PA_READ_GATHER;
}

int pa_isa_machine(void)
{
    static int machine = -1;     /* first set under the GIL, at import */
    if (machine < 0) {
        machine = pa_detect_isa();
        /* testing hook: PYATTN_TEST_CPU=avx2|generic lowers what the CPU is
           taken to support (tests of PYATTN_ISA's fallback warnings) */
        const char *cap = getenv("PYATTN_TEST_CPU");
        if (cap && !strcmp(cap, "generic")) machine = PA_ISA_GENERIC;
        else if (cap && !strcmp(cap, "avx2") && machine == PA_ISA_AVX512) machine = PA_ISA_AVX2;
    }
    return machine;
}

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
