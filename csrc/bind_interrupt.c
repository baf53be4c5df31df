/*
 * bind_interrupt.c -- Ctrl-C: stopping a long call (bind_interrupt.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if (defined(__linux__) || defined(__APPLE__)) && !defined(__STDC_NO_ATOMICS__)
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#else
#include <pthread.h>
#endif
#define PA_STOPPABLE 1
#endif

#include "bind_interrupt.h"
#include "threads.h"

/* ---- Ctrl-C: stopping a long call ----------------------------------------
 *
 * With the GIL released, Python's SIGINT handler only notes the signal; its
 * Python-level handler (KeyboardInterrupt) would run after the call. So a
 * call from the main thread (where Python runs signal handlers) puts
 * on_sigint in front of the handler in place, for the time the GIL is
 * released: it sets sigint_hit, which the op's threads see between tasks and
 * tiles (threads.h: pa_stop_set), and calls the previous handler, so
 * Python's own handling (its flag, set_wakeup_fd, a user's
 * signal.signal(SIGINT, ...)) still happens. Afterwards the previous
 * handler is put back and, if the signal came, PyErr_CheckSignals runs the
 * Python handlers: one that raises (KeyboardInterrupt) ends the call with
 * that exception and its outputs are discarded; one that returns lets the
 * call run again from the start (its outputs are incomplete), as if the
 * signal had arrived between two Python statements. Nothing is installed
 * when SIGINT is ignored or has its default action (the process ends), nor
 * off the main thread (those calls run to the end, as before). */
#ifdef PA_STOPPABLE
static pa_stop_flag sigint_hit;             /* the stop flag of main-thread calls */
static struct sigaction sigint_prev;        /* what on_sigint chains to */

static void on_sigint(int sig, siginfo_t *info, void *uc)
{
    const int saved = errno;
    atomic_store(&sigint_hit, 1);
    if (sigint_prev.sa_flags & SA_SIGINFO) sigint_prev.sa_sigaction(sig, info, uc);
    else if (sigint_prev.sa_handler != SIG_DFL && sigint_prev.sa_handler != SIG_IGN)
        sigint_prev.sa_handler(sig);
    errno = saved;
}

/* the thread Python runs signal handlers in: the process's first thread, in
 * the main interpreter */
static int on_main_thread(void)
{
#if defined(__linux__)
    if ((pid_t)syscall(SYS_gettid) != getpid()) return 0;
#else
    if (!pthread_main_np()) return 0;
#endif
    return PyInterpreterState_Get() == PyInterpreterState_Main();
}
#endif

/* Calls of fewer multiply-adds (or element steps) than this end within
 * milliseconds anyway (Python then handles the signal): they skip the four
 * system calls of arming, about a microsecond. */
#define PA_STOP_MIN_WORK 16777216.0

/* Before releasing the GIL: arm the SIGINT wrapper where it applies. */
void pa_stop_begin(pa_stop_scope *s, double work)
{
    s->armed = 0;
    pa_stop_set(NULL);
#ifdef PA_STOPPABLE
    if (work < PA_STOP_MIN_WORK || !on_main_thread()) return;
    struct sigaction cur, ours;
    if (sigaction(SIGINT, NULL, &cur) != 0) return;
    if (cur.sa_flags & SA_SIGINFO) {
        if (cur.sa_sigaction == on_sigint) return;              /* never twice */
    } else if (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
        return;
    }
    sigint_prev = cur;
    ours = cur;                                  /* its mask and flags */
    ours.sa_flags |= SA_SIGINFO;
    ours.sa_sigaction = on_sigint;
    atomic_store(&sigint_hit, 0);
    if (sigaction(SIGINT, &ours, NULL) != 0) return;
    pa_stop_set(&sigint_hit);
    s->armed = 1;
#else
    (void)work;
#endif
}

/* After taking the GIL back: 0 the call ran through; 1 it was stopped and a
 * Python handler raised (the exception is set); 2 it was stopped and the
 * handlers returned: run the call again. */
int pa_stop_end(pa_stop_scope *s)
{
    pa_stop_set(NULL);
#ifdef PA_STOPPABLE
    if (!s->armed) return 0;
    s->armed = 0;
    sigaction(SIGINT, &sigint_prev, NULL);
    if (!atomic_load(&sigint_hit)) return 0;
    return PyErr_CheckSignals() < 0 ? 1 : 2;
#else
    return 0;
#endif
}
