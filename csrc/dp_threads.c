/* dp_threads.c - see dp_threads.h. */
#include "dp_threads.h"
#include "dp_common.h"

#include <stdlib.h>

#if defined(DP_NO_PTHREADS) || defined(_WIN32)

struct dp_threads { int threads; };

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
#include <unistd.h>

struct dp_threads {
    int threads;                /* parts it can run: helpers + the caller */
    pid_t owner;                /* the process whose threads these are: a fork()ed child has
                                   none of them, so there the team runs everything inline */
    pthread_t *helpers;         /* threads - 1 of them */
    pthread_mutex_t mutex;
    pthread_cond_t wake;        /* helpers sleep here between jobs */
    pthread_cond_t done_cv;     /* the caller sleeps here until the job is done */
    atomic_uint generation;     /* bumped once per job; helpers wait for a change */
    atomic_int remaining;       /* helpers still working on this job */
    int stop;
    /* the job */
    dp_task_fn fn;
    void *arg;
    int n;
};

typedef struct { dp_threads *team; int t; } helper_arg;

/* Spin this many times before sleeping: long enough to catch back-to-back kernels of one
 * step, short enough not to steal a core from another process for long. */
#define DP_THREADS_SPINS 20000

static void *helper_main(void *p)
{
    helper_arg ha = *(helper_arg *)p;
    free(p);
    dp_threads *team = ha.team;
    /* The team is created at generation 0 and no job can be posted before dp_threads_create
     * returns; reading the counter here instead would race with the first job and skip it. */
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&team->generation, memory_order_acquire) == seen
               && spins < DP_THREADS_SPINS)
            spins++;
        if (atomic_load_explicit(&team->generation, memory_order_acquire) == seen) {
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
    pthread_mutex_init(&team->mutex, NULL);
    pthread_cond_init(&team->wake, NULL);
    pthread_cond_init(&team->done_cv, NULL);
    atomic_init(&team->generation, 0u);
    atomic_init(&team->remaining, 0);
    if (threads > 1) {
        team->helpers = calloc((size_t)threads - 1, sizeof(pthread_t));
        if (!team->helpers) { dp_threads_destroy(team); return DP_ENOMEM; }
        for (int t = 1; t < threads; t++) {
            helper_arg *ha = malloc(sizeof *ha);
            if (!ha) { team->threads = t; dp_threads_destroy(team); return DP_ENOMEM; }
            ha->team = team;
            ha->t = t;
            if (pthread_create(&team->helpers[t - 1], NULL, helper_main, ha) != 0) {
                free(ha);
                team->threads = t;    /* destroy joins only the helpers that exist */
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
    int spins = 0;
    while (atomic_load_explicit(&team->remaining, memory_order_acquire) > 0 && spins < DP_THREADS_SPINS)
        spins++;
    if (atomic_load(&team->remaining) > 0) {
        pthread_mutex_lock(&team->mutex);
        while (atomic_load(&team->remaining) > 0) pthread_cond_wait(&team->done_cv, &team->mutex);
        pthread_mutex_unlock(&team->mutex);
    }
}

#endif
