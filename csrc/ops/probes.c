/*
 * probes.c -- what the benchmark times to know the machine's limits and how
 * close the kernels come to them: the family's GEMM micro-kernel alone on
 * L1-resident panels, and a read of a large buffer (read bandwidth), split
 * over the thread pool in fixed chunks. Never used by the ops themselves.
 */
#include "ops.h"
#include "threads.h"

double pa_gemm_probe(const pa_family *fam, int dtype, pa_ssize kc, long long iters, double *sink)
{
    const pa_gemm_kernel g = fam->gemm[dtype];
    const size_t es = pa_elsize(dtype);
    const size_t na = (size_t)(g.mr * kc), nb = (size_t)(g.nr * kc), nc = (size_t)(g.mr * g.nr);
    char *buf = (char *)pa_alloc64((na + nb + nc) * es);
    if (!buf) return -1;
    char *A = buf, *B = buf + na * es, *C = B + nb * es;
    /* normal values: no subnormal operands to slow the FMAs down */
    for (size_t i = 0; i < na + nb + nc; i++) {
        const double x = i < na ? 0.5 : i < na + nb ? 1.0 / 1024 : 0.0;
        if (dtype == PA_F32) ((float *)buf)[i] = (float)x;
        else ((double *)buf)[i] = x;
    }
    for (long long it = 0; it < iters; it++)
        g.ukr(kc, A, 1, g.mr, B, g.nr, C, g.nr, 1, g.mr, g.nr, 1);
    *sink = dtype == PA_F32 ? (double)((float *)C)[0] : ((double *)C)[0];
    pa_free64(buf);
    return 2.0 * (double)g.mr * (double)g.nr * (double)kc * (double)iters;
}

typedef struct {
    pa_read_probe_fn fn;
    const float *p;
    size_t n, chunk;
    float *part;            /* one sum per chunk */
} read_ctx;

static void read_task(void *ctx_, pa_ssize t, int tid)
{
    const read_ctx *c = (const read_ctx *)ctx_;
    const size_t i0 = (size_t)t * c->chunk;
    const size_t n = c->n - i0 < c->chunk ? c->n - i0 : c->chunk;
    c->part[t] = c->fn(c->p + i0, n);
}

int pa_read_probe(const pa_family *fam, const float *p, size_t n, int nthreads, double *sum)
{
    read_ctx c;
    c.fn = fam->read_probe.fn;
    c.p = p;
    c.n = n;
    c.chunk = (size_t)1 << 20;                      /* 4 MB per task */
    const size_t ntasks = n == 0 ? 0 : (n + c.chunk - 1) / c.chunk;
    c.part = (float *)pa_alloc64((ntasks ? ntasks : 1) * sizeof(float));
    if (!c.part) return -1;
    pa_parallel_for((pa_ssize)ntasks, read_task, &c, nthreads);
    double s = 0;
    for (size_t t = 0; t < ntasks; t++) s += c.part[t];
    pa_free64(c.part);
    *sum = s;
    return 0;
}
