/* dp_threads.c - see dp_threads.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity and CPU_COUNT (glibc) */
#endif
#include "dp_threads.h"
#include "dp_common.h"

#include <stdlib.h>

int dp_threads_for(int threads, long long work, long long min_work)
{
    long long most = work / min_work;
    return most >= threads ? threads : most > 1 ? (int)most : 1;
}

void dp_threads_part(ptrdiff_t total, ptrdiff_t unit, int t, int n, ptrdiff_t *lo, ptrdiff_t *hi)
{
    ptrdiff_t units = (total + unit - 1) / unit;
    ptrdiff_t q = units / n, r = units % n;
    ptrdiff_t u0 = t * q + (t < r ? t : r);
    ptrdiff_t u1 = u0 + q + (t < r ? 1 : 0);
    *lo = u0 * unit < total ? u0 * unit : total;
    *hi = u1 * unit < total ? u1 * unit : total;
}

#if defined(DP_NO_PTHREADS) || defined(_WIN32)

struct dp_threads {
    int threads;
};

int dp_threads_create(dp_threads **out, int threads)
{
    dp_threads *p = malloc(sizeof *p);
    if (!p) return DP_ENOMEM;
    p->threads = 1;
    (void)threads;
    *out = p;
    return DP_OK;
}
void dp_threads_destroy(dp_threads *team) { free(team); }
int dp_threads_size(const dp_threads *team) { return team ? team->threads : 1; }
void dp_threads_run(dp_threads *team, int n, dp_task_fn fn, void *arg)
{
    (void)team;
    for (int t = 0; t < n; t++) fn(arg, t, n);
}

#else

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

struct dp_threads {
    int threads;        /* parts it can run: helpers + the caller */
    pid_t owner;        /* the process whose threads these are: a fork()ed child has
                                   none of them, so there the team runs everything inline */
    pthread_t *helpers; /* threads - 1 of them */
    pthread_mutex_t mutex;
    pthread_cond_t wake;    /* helpers sleep here between jobs */
    pthread_cond_t done_cv; /* the caller sleeps here until the job is done */
    atomic_uint generation; /* bumped once per job; helpers wait for a change */
    atomic_int remaining;   /* helpers still working on this job */
    int stop;
    _Atomic int64_t spin_ns; /* how long to spin before sleeping: adapted, see spin_until */
    atomic_uint waits;       /* spin-waits so far (every DP_THREADS_SPIN_PROBE-th spins long) */
    /* the job */
    dp_task_fn fn;
    void *arg;
    int n;
};

typedef struct {
    dp_threads *team;
    int t;
} helper_arg;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* the spin-wait hint: frees the core's shared resources for its SMT sibling */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* How long a helper waits for the next job, and the caller for the helpers, spinning before
 * it sleeps on the condition variable: long enough to span the gaps between one step's
 * kernels (bias, activation, loss: tens of microseconds), short enough not to hold a core for
 * long once the step is over. A wake-up from the condition variable costs tens of microseconds
 * under a hypervisor: with a spin of about 10 us the MLP step ran slower at 2 threads than at
 * 1, with a spin of up to 200 us faster. Measured in time, not iterations, so that it does
 * not depend on the CPU's speed or its pause instruction's latency.
 * Spinning hurts where threads outnumber cores: a spinning thread holds the core that the
 * thread it waits for needs. So the spin adapts: a wait that outlasts it halves it (down to
 * DP_THREADS_SPIN_MIN_NS), a wait that ends while spinning doubles it (up to
 * DP_THREADS_SPIN_NS); it starts at the maximum, or at DP_THREADS_SPIN_OVERSUBSCRIBED_NS where
 * the team has more threads than the CPUs this process may run on. */
#define DP_THREADS_SPIN_NS 200000
#define DP_THREADS_SPIN_OVERSUBSCRIBED_NS 2000
#define DP_THREADS_SPIN_MIN_NS 1000
#define DP_THREADS_SPIN_PROBE 64

/* Spins while waiting(team, arg) holds, for at most team->spin_ns (the clock read once per 64
 * spins), and adapts the spin: 1 if the wait ended while spinning (the spin doubles what this
 * wait spun, up to DP_THREADS_SPIN_NS), 0 if it outlasted the spin and the caller must sleep
 * (the spin halves, down to DP_THREADS_SPIN_MIN_NS). */
static int spin_until(dp_threads *team, int (*waiting)(dp_threads *, unsigned), unsigned arg)
{
    /* every DP_THREADS_SPIN_PROBE-th wait spins the whole DP_THREADS_SPIN_NS: a spin halved
     * down to its minimum would otherwise only grow back from waits shorter than a few us */
    int64_t cur = atomic_load_explicit(&team->spin_ns, memory_order_relaxed), until = 0;
    unsigned wait = atomic_fetch_add_explicit(&team->waits, 1u, memory_order_relaxed);
    int64_t ns = wait % DP_THREADS_SPIN_PROBE == 0 ? DP_THREADS_SPIN_NS : cur;
    for (unsigned spins = 0; waiting(team, arg); spins++) {
        if ((spins & 63) == 0) {
            int64_t t = now_ns();
            if (!until) {
                until = t + ns;
            } else if (t >= until) {
                atomic_store_explicit(&team->spin_ns,
                                      cur / 2 > DP_THREADS_SPIN_MIN_NS ? cur / 2
                                                                       : DP_THREADS_SPIN_MIN_NS,
                                      memory_order_relaxed);
                return 0;
            }
        }
        cpu_relax();
    }
    if (cur < DP_THREADS_SPIN_NS)
        atomic_store_explicit(&team->spin_ns,
                              2 * ns < DP_THREADS_SPIN_NS ? 2 * ns : DP_THREADS_SPIN_NS,
                              memory_order_relaxed);
    return 1;
}

/* the helpers' wait: no job after generation `seen` yet */
static int no_new_job(dp_threads *team, unsigned seen)
{ return atomic_load_explicit(&team->generation, memory_order_acquire) == seen; }

/* the caller's wait: helpers still on the job */
static int helpers_busy(dp_threads *team, unsigned unused)
{
    (void)unused;
    return atomic_load_explicit(&team->remaining, memory_order_acquire) > 0;
}

static void *helper_main(void *p)
{
    helper_arg ha = *(helper_arg *)p;
    free(p);
    dp_threads *team = ha.team;
    /* The team is created at generation 0 and no job can be posted before dp_threads_create
     * returns; reading the counter here instead would race with the first job and skip it. */
    unsigned seen = 0;
    for (;;) {
        if (!spin_until(team, no_new_job, seen)) {
            pthread_mutex_lock(&team->mutex);
            while (atomic_load(&team->generation) == seen && !team->stop)
                pthread_cond_wait(&team->wake, &team->mutex);
            pthread_mutex_unlock(&team->mutex);
        }
        if (team->stop) return NULL;
        seen = atomic_load(&team->generation);
        if (ha.t < team->n) team->fn(team->arg, ha.t, team->n);
        if (atomic_fetch_sub_explicit(&team->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&team->mutex);
            pthread_cond_signal(&team->done_cv);
            pthread_mutex_unlock(&team->mutex);
        }
    }
}

int dp_threads_create(dp_threads **out, int threads)
{
    if (threads < 1) threads = 1;
    dp_threads *team = calloc(1, sizeof *team);
    if (!team) return DP_ENOMEM;
    team->threads = threads;
    team->owner = getpid();
    atomic_init(&team->spin_ns, DP_THREADS_SPIN_NS);
    atomic_init(&team->waits, 1u);
#ifdef CPU_COUNT
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) < threads)
        atomic_store(&team->spin_ns, DP_THREADS_SPIN_OVERSUBSCRIBED_NS);
#endif
    pthread_mutex_init(&team->mutex, NULL);
    pthread_cond_init(&team->wake, NULL);
    pthread_cond_init(&team->done_cv, NULL);
    atomic_init(&team->generation, 0u);
    atomic_init(&team->remaining, 0);
    if (threads > 1) {
        team->helpers = calloc((size_t)threads - 1, sizeof(pthread_t));
        if (!team->helpers) {
            dp_threads_destroy(team);
            return DP_ENOMEM;
        }
        for (int t = 1; t < threads; t++) {
            helper_arg *ha = malloc(sizeof *ha);
            if (!ha) {
                team->threads = t;
                dp_threads_destroy(team);
                return DP_ENOMEM;
            }
            ha->team = team;
            ha->t = t;
            if (pthread_create(&team->helpers[t - 1], NULL, helper_main, ha) != 0) {
                free(ha);
                team->threads = t; /* destroy joins only the helpers that exist */
                dp_threads_destroy(team);
                return DP_ETHREAD;
            }
        }
    }
    *out = team;
    return DP_OK;
}

void dp_threads_destroy(dp_threads *team)
{
    if (!team) return;
    if (team->helpers && team->owner != getpid()) {
        /* after fork(): the helpers do not exist here, and the mutex may have been copied
         * locked; leak them rather than wait forever */
        free(team->helpers);
        free(team);
        return;
    }
    if (team->helpers) {
        pthread_mutex_lock(&team->mutex);
        team->stop = 1;
        atomic_fetch_add(&team->generation, 1u);
        pthread_cond_broadcast(&team->wake);
        pthread_mutex_unlock(&team->mutex);
        for (int t = 1; t < team->threads; t++) pthread_join(team->helpers[t - 1], NULL);
        free(team->helpers);
    }
    pthread_mutex_destroy(&team->mutex);
    pthread_cond_destroy(&team->wake);
    pthread_cond_destroy(&team->done_cv);
    free(team);
}

int dp_threads_size(const dp_threads *team) { return team ? team->threads : 1; }

void dp_threads_run(dp_threads *team, int n, dp_task_fn fn, void *arg)
{
    if (!team || team->threads == 1 || n <= 1 || team->owner != getpid()) {
        for (int t = 0; t < n; t++) fn(arg, t, n);
        return;
    }
    if (n > team->threads) n = team->threads;
    team->fn = fn;
    team->arg = arg;
    team->n = n;
    atomic_store(&team->remaining, team->threads - 1);
    pthread_mutex_lock(&team->mutex);
    atomic_fetch_add_explicit(&team->generation, 1u, memory_order_release);
    pthread_cond_broadcast(&team->wake);
    pthread_mutex_unlock(&team->mutex);
    fn(arg, 0, n);
    if (!spin_until(team, helpers_busy, 0)) {
        pthread_mutex_lock(&team->mutex);
        while (atomic_load(&team->remaining) > 0) pthread_cond_wait(&team->done_cv, &team->mutex);
        pthread_mutex_unlock(&team->mutex);
    }
}

#endif
