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
int dp_threads_region_size(const dp_threads *team)
{
    (void)team;
    return 1;
}
void dp_threads_region(dp_threads *team, dp_task_fn fn, void *arg)
{
    (void)team;
    fn(arg, 0, 1);
}
void dp_threads_barrier(dp_threads *team, int n) { (void)team, (void)n; }
unsigned long long dp_threads_jobs(const dp_threads *team)
{
    (void)team;
    return 0;
}

#else

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* how long a wait spins before it sleeps: adapted, see spin_until */
typedef struct {
    _Atomic int64_t ns;
    atomic_uint waits; /* spin-waits so far (every DP_THREADS_SPIN_PROBE-th spins long) */
} spin_policy;

struct dp_threads {
    int threads;        /* parts it can run: helpers + the caller */
    pid_t owner;        /* the process whose threads these are: a fork()ed child has
                                   none of them, so there the team runs everything inline */
    pthread_t *helpers; /* threads - 1 of them */
    pthread_mutex_t mutex;
    pthread_cond_t wake;     /* helpers sleep here between jobs */
    pthread_cond_t done_cv;  /* the caller sleeps here until the job is done */
    atomic_uint generation;  /* bumped once per job; helpers wait for a change */
    unsigned long long jobs; /* jobs posted (dp_threads_jobs): written by the one caller */
    atomic_int remaining;    /* helpers still working on this job */
    int stop;
    spin_policy job_spin; /* the waits for a job and for its end */
    spin_policy bar_spin; /* the waits at a region's barriers: apart, so that the long waits
                                between two calls do not shorten the short ones within a call */
    /* the barrier of a region: arrivals in this round, rounds completed, parts asleep */
    atomic_int bar_count;
    atomic_uint bar_round;
    atomic_int bar_sleepers;
    pthread_cond_t bar_cv;
    /* the job */
    dp_task_fn fn;
    void *arg;
    int n;
};

typedef struct {
    dp_threads *team;
    int t;
} helper_arg;

/* > 0 while this thread runs a part of a job: a dp_threads_run from there runs inline */
static _Thread_local int in_job;

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

/* Spins while waiting(team, arg) holds, for at most sp->ns (the clock read once per 64
 * spins), and adapts the spin: 1 if the wait ended while spinning (the spin doubles what this
 * wait spun, up to DP_THREADS_SPIN_NS), 0 if it outlasted the spin and the caller must sleep
 * (the spin halves, down to DP_THREADS_SPIN_MIN_NS). */
static int spin_until(spin_policy *sp, dp_threads *team, int (*waiting)(dp_threads *, unsigned),
                      unsigned arg)
{
    /* every DP_THREADS_SPIN_PROBE-th wait spins the whole DP_THREADS_SPIN_NS: a spin halved
     * down to its minimum would otherwise only grow back from waits shorter than a few us */
    int64_t cur = atomic_load_explicit(&sp->ns, memory_order_relaxed), until = 0;
    unsigned wait = atomic_fetch_add_explicit(&sp->waits, 1u, memory_order_relaxed);
    int64_t ns = wait % DP_THREADS_SPIN_PROBE == 0 ? DP_THREADS_SPIN_NS : cur;
    for (unsigned spins = 0; waiting(team, arg); spins++) {
        if ((spins & 63) == 0) {
            int64_t t = now_ns();
            if (!until) {
                until = t + ns;
            } else if (t >= until) {
                atomic_store_explicit(
                    &sp->ns, cur / 2 > DP_THREADS_SPIN_MIN_NS ? cur / 2 : DP_THREADS_SPIN_MIN_NS,
                    memory_order_relaxed);
                return 0;
            }
        }
        cpu_relax();
    }
    if (cur < DP_THREADS_SPIN_NS)
        atomic_store_explicit(&sp->ns, 2 * ns < DP_THREADS_SPIN_NS ? 2 * ns : DP_THREADS_SPIN_NS,
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
        if (!spin_until(&team->job_spin, team, no_new_job, seen)) {
            pthread_mutex_lock(&team->mutex);
            while (atomic_load(&team->generation) == seen && !team->stop)
                pthread_cond_wait(&team->wake, &team->mutex);
            pthread_mutex_unlock(&team->mutex);
        }
        if (team->stop) return NULL;
        seen = atomic_load(&team->generation);
        if (ha.t < team->n) {
            in_job++;
            team->fn(team->arg, ha.t, team->n);
            in_job--;
        }
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
    int64_t spin = DP_THREADS_SPIN_NS;
#ifdef CPU_COUNT
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) < threads)
        spin = DP_THREADS_SPIN_OVERSUBSCRIBED_NS;
#endif
    atomic_init(&team->job_spin.ns, spin);
    atomic_init(&team->job_spin.waits, 1u);
    atomic_init(&team->bar_spin.ns, spin);
    atomic_init(&team->bar_spin.waits, 1u);
    pthread_mutex_init(&team->mutex, NULL);
    pthread_cond_init(&team->wake, NULL);
    pthread_cond_init(&team->done_cv, NULL);
    pthread_cond_init(&team->bar_cv, NULL);
    atomic_init(&team->bar_count, 0);
    atomic_init(&team->bar_round, 0u);
    atomic_init(&team->bar_sleepers, 0);
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
    pthread_cond_destroy(&team->bar_cv);
    free(team);
}

int dp_threads_size(const dp_threads *team) { return team ? team->threads : 1; }

/* the team can run parts at once: it has helpers, they exist in this process, and the caller
 * is not one of a job's parts (whose team is busy with it) */
static int team_usable(const dp_threads *team)
{ return team && team->threads > 1 && team->owner == getpid() && !in_job; }

void dp_threads_run(dp_threads *team, int n, dp_task_fn fn, void *arg)
{
    if (n <= 1 || !team_usable(team)) {
        for (int t = 0; t < n; t++) fn(arg, t, n);
        return;
    }
    if (n > team->threads) n = team->threads;
    team->fn = fn;
    team->arg = arg;
    team->n = n;
    team->jobs++;
    atomic_store(&team->remaining, team->threads - 1);
    pthread_mutex_lock(&team->mutex);
    atomic_fetch_add_explicit(&team->generation, 1u, memory_order_release);
    pthread_cond_broadcast(&team->wake);
    pthread_mutex_unlock(&team->mutex);
    in_job++;
    fn(arg, 0, n);
    in_job--;
    if (!spin_until(&team->job_spin, team, helpers_busy, 0)) {
        pthread_mutex_lock(&team->mutex);
        while (atomic_load(&team->remaining) > 0) pthread_cond_wait(&team->done_cv, &team->mutex);
        pthread_mutex_unlock(&team->mutex);
    }
}

int dp_threads_region_size(const dp_threads *team) { return team_usable(team) ? team->threads : 1; }

unsigned long long dp_threads_jobs(const dp_threads *team) { return team ? team->jobs : 0; }

void dp_threads_region(dp_threads *team, dp_task_fn fn, void *arg)
{ dp_threads_run(team, dp_threads_region_size(team), fn, arg); }

/* the barrier's wait: round `round` not completed yet */
static int round_open(dp_threads *team, unsigned round)
{ return atomic_load(&team->bar_round) == round; }

void dp_threads_barrier(dp_threads *team, int n)
{
    if (n <= 1) return;
    unsigned round = atomic_load(&team->bar_round);
    if (atomic_fetch_add(&team->bar_count, 1) == n - 1) {
        /* the last to arrive: the count is reset before the round ends, so no part can
         * arrive at the next barrier before it */
        atomic_store(&team->bar_count, 0);
        atomic_fetch_add(&team->bar_round, 1u);
        /* a sleeper counts itself before it reads the round (both sequentially consistent):
         * either it sees the new round, or this sees it */
        if (atomic_load(&team->bar_sleepers) > 0) {
            pthread_mutex_lock(&team->mutex);
            pthread_cond_broadcast(&team->bar_cv);
            pthread_mutex_unlock(&team->mutex);
        }
        return;
    }
    /* an adaptive spin (spin_until): on a machine whose cores are time-shared with other
     * processes a part that spins holds the core the part it waits for needs */
    if (spin_until(&team->bar_spin, team, round_open, round)) return;
    pthread_mutex_lock(&team->mutex);
    atomic_fetch_add(&team->bar_sleepers, 1);
    while (round_open(team, round)) pthread_cond_wait(&team->bar_cv, &team->mutex);
    atomic_fetch_sub(&team->bar_sleepers, 1);
    pthread_mutex_unlock(&team->mutex);
}

#endif
