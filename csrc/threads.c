/*
 * threads.c -- the process-wide worker pool (see threads.h).
 *
 * One job at a time owns the pool (run_lock). Workers sleep on a condition
 * variable until the job generation changes, then claim task indices from
 * one atomic word that holds the job's generation beside the next index (a
 * claim is a compare-and-swap that fails once the job is over or replaced).
 * The caller returns as soon as every task has run: it never waits for a
 * worker that woke too late to find a task (a sleeping thread's wake-up can
 * take longer than a small job), and such a worker, finding the word of
 * another generation or no index left, claims nothing. Before sleeping, a
 * worker spins for a short while (and the caller likewise before it waits
 * for the tasks): an op runs several jobs
 * back to back (the GEMM's pack/compute passes per K panel), and waking a
 * sleeping thread costs far more than that spin -- on virtual machines up to
 * a millisecond, measured here. Which thread runs a task changes from run to run; what a
 * task computes does not, which is what makes results thread-count invariant.
 *
 * Stopping (threads.h): the job carries its caller's stop flag; a thread
 * about to claim a task that finds the flag set claims every index left in
 * one compare-and-swap instead and counts them as done, so the caller's wait
 * ends as soon as the tasks already running have returned. A thread runs a
 * job's tasks with the job's flag as its own (pa_stop_get), for the loops
 * inside them.
 */
#include "threads.h"

#if defined(_WIN32) || defined(PYATTN_NO_THREADS)

/* Portable fallback: no pool, everything runs on the caller. */
static int pa_nthreads = 1;
static _Thread_local pa_stop_flag *tls_stop = NULL;
void pa_stop_set(pa_stop_flag *flag) { tls_stop = flag; }
pa_stop_flag *pa_stop_get(void) { return tls_stop; }
void pa_parallel_for(pa_ssize ntasks, pa_task_fn fn, void *ctx, int max_threads)
{
    (void)max_threads;
    for (pa_ssize t = 0; t < ntasks && !pa_stopping(tls_stop); t++) fn(ctx, t, 0);
}
int pa_get_num_threads(void) { return pa_nthreads; }
int pa_set_num_threads(int n) { (void)n; pa_nthreads = 1; return n == 1 ? 0 : -1; }

#else

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define PA_SPIN_NS 200000        /* how long a thread spins before it sleeps */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spin until done(arg) or PA_SPIN_NS have passed; returns done(arg). */
static int spin_until(int (*done)(const void *), const void *arg)
{
    const long long t0 = now_ns();
    for (unsigned i = 1;; i++) {
        if (done(arg)) return 1;
        cpu_relax();
        if ((i & 63) == 0 && now_ns() - t0 > PA_SPIN_NS) return done(arg);
    }
}

/* the stop flag of the call this thread runs (its own, or the job's) */
static _Thread_local pa_stop_flag *tls_stop = NULL;

void pa_stop_set(pa_stop_flag *flag) { tls_stop = flag; }
pa_stop_flag *pa_stop_get(void) { return tls_stop; }

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;  /* owns the pool */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;        /* guards the job */
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;

static int n_threads = 1;        /* requested count, caller included */
static int n_workers = 0;        /* started workers (n_threads - 1 once started) */
static pthread_t *workers = NULL;
static atomic_int shutting_down = 0;

/* the current job: its fields and generation are set under mu, and read
 * together under mu by a worker; generation is also read while spinning,
 * job_word and job_done are claimed and counted without the lock (atomics) */
static atomic_ulong generation = 0;
static pa_task_fn job_fn;
static void *job_ctx;
static pa_stop_flag *job_stop;     /* the caller's stop flag, or NULL */
static pa_ssize job_ntasks;
static int job_nthreads;         /* participating threads, caller included */
static unsigned long spawn_generation;  /* generation when the workers started */

/* The claim word: the low PA_IDX_BITS bits are the next task index, the
 * 24 bits above them the low bits of the job's generation (a worker would
 * have to stall between reading a job and claiming from it through 2^24
 * later jobs to mistake one for another). */
#define PA_IDX_BITS 40
#define PA_IDX_MASK ((1ULL << PA_IDX_BITS) - 1)
static atomic_ullong job_word;
static atomic_llong job_done;    /* tasks of this job finished */

typedef struct {                 /* what a thread knows of the job it runs */
    pa_task_fn fn;
    void *ctx;
    pa_ssize ntasks;
    unsigned long long tag;      /* generation << PA_IDX_BITS */
    pa_stop_flag *stop;
} job_view;

static unsigned long long gen_tag(unsigned long g) { return (unsigned long long)g << PA_IDX_BITS; }

/* Claim and run tasks of the job `j` until none is left (or the word has
 * moved on to another job). A task counts as done only after it ran, and the
 * caller waits for every task, so a claimed task's job is alive while it
 * runs. */
static void count_done(const job_view *j, pa_ssize n)
{
    if (atomic_fetch_add(&job_done, n) + n == j->ntasks) {        /* the last ones */
        pthread_mutex_lock(&mu);
        pthread_cond_signal(&cv_done);
        pthread_mutex_unlock(&mu);
    }
}

static void run_tasks(const job_view *j, int tid)
{
    pa_stop_flag *const own_stop = tls_stop;
    tls_stop = j->stop;
    unsigned long long w = atomic_load(&job_word);
    for (;;) {
        if ((w & ~PA_IDX_MASK) != j->tag || (pa_ssize)(w & PA_IDX_MASK) >= j->ntasks) break;
        const pa_ssize next = (pa_ssize)(w & PA_IDX_MASK);
        if (pa_stopping(j->stop)) {       /* claim all that is left; none of it runs */
            if (!atomic_compare_exchange_weak(&job_word, &w, j->tag | (unsigned long long)j->ntasks))
                continue;
            count_done(j, j->ntasks - next);
            break;
        }
        if (!atomic_compare_exchange_weak(&job_word, &w, w + 1)) continue;   /* w reloaded */
        j->fn(j->ctx, next, tid);
        count_done(j, 1);
        w = atomic_load(&job_word);
    }
    tls_stop = own_stop;
}

static int new_job(const void *seen)
{
    return atomic_load(&generation) != *(const unsigned long *)seen || atomic_load(&shutting_down);
}

static int job_finished(const void *ntasks)
{
    return atomic_load(&job_done) >= *(const pa_ssize *)ntasks;
}

static void *worker_main(void *arg)
{
    int tid = (int)(intptr_t)arg;        /* 1..n_workers */
    pthread_mutex_lock(&mu);
    unsigned long seen = spawn_generation;   /* jobs posted after the spawn */
    for (;;) {
        if (!new_job(&seen)) {               /* spin a while before sleeping */
            pthread_mutex_unlock(&mu);
            spin_until(new_job, &seen);
            pthread_mutex_lock(&mu);
        }
        while (generation == seen && !shutting_down) pthread_cond_wait(&cv_work, &mu);
        if (shutting_down) break;
        seen = generation;
        /* the job's fields as they stand under mu for this generation */
        const job_view j = {job_fn, job_ctx, job_ntasks, gen_tag(seen) & ~PA_IDX_MASK, job_stop};
        const int take_part = tid < job_nthreads;
        pthread_mutex_unlock(&mu);
        if (take_part) run_tasks(&j, tid);
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Called with run_lock held. */
static void stop_workers(void)
{
    pthread_mutex_lock(&mu);
    shutting_down = 1;
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
    shutting_down = 0;
}

/* Called with run_lock held: start n_threads - 1 workers. */
static void start_workers(void)
{
    int want = n_threads - 1;
    if (want <= 0 || n_workers == want) return;
    if (n_workers) stop_workers();
    workers = (pthread_t *)calloc((size_t)want, sizeof(pthread_t));
    if (!workers) { n_threads = 1; return; }
    int started = 0;
    spawn_generation = generation;   /* stable: run_lock is held, no job runs */
    for (int i = 0; i < want; i++) {
        if (pthread_create(&workers[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) break;
        started++;
    }
    n_workers = started;
    n_threads = started + 1;
}

void pa_parallel_for(pa_ssize ntasks, pa_task_fn fn, void *ctx, int max_threads)
{
    if (ntasks <= 0) return;
    pa_stop_flag *const stop = tls_stop;
    if (max_threads <= 1 || ntasks == 1 || (unsigned long long)ntasks > PA_IDX_MASK / 2 ||
        pthread_mutex_trylock(&run_lock) != 0) {
        for (pa_ssize t = 0; t < ntasks && !pa_stopping(stop); t++) fn(ctx, t, 0);
        return;
    }
    start_workers();
    int nt = n_threads < max_threads ? n_threads : max_threads;
    if ((pa_ssize)nt > ntasks) nt = (int)ntasks;
    if (nt <= 1) {
        pthread_mutex_unlock(&run_lock);
        for (pa_ssize t = 0; t < ntasks && !pa_stopping(stop); t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&mu);
    job_fn = fn; job_ctx = ctx; job_ntasks = ntasks; job_nthreads = nt; job_stop = stop;
    atomic_store(&job_done, 0);
    const unsigned long g = (unsigned long)atomic_load(&generation) + 1;
    const job_view j = {fn, ctx, ntasks, gen_tag(g) & ~PA_IDX_MASK, stop};
    atomic_store(&job_word, j.tag);
    atomic_store(&generation, g);
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);

    run_tasks(&j, 0);

    if (!spin_until(job_finished, &ntasks)) {
        pthread_mutex_lock(&mu);
        while (atomic_load(&job_done) < ntasks) pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&run_lock);
}

int pa_get_num_threads(void)
{
    return __atomic_load_n(&n_threads, __ATOMIC_RELAXED);
}

int pa_set_num_threads(int n)
{
    if (n < 1) n = 1;
    if (n > PA_MAX_THREADS) n = PA_MAX_THREADS;
    pthread_mutex_lock(&run_lock);
    if (n_workers) stop_workers();
    __atomic_store_n(&n_threads, n, __ATOMIC_RELAXED);
    /* workers start lazily on the next parallel call */
    pthread_mutex_unlock(&run_lock);
    return 0;
}

/* After fork() only the forking thread exists in the child: forget the
 * workers (they are not there) and reset the locks. */
static void atfork_child(void)
{
    pthread_mutex_init(&run_lock, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv_work, NULL);
    pthread_cond_init(&cv_done, NULL);
    workers = NULL;   /* leaked in the child: the threads do not exist there */
    n_workers = 0;
    shutting_down = 0;
}

__attribute__((constructor)) static void pa_threads_init(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

#endif
