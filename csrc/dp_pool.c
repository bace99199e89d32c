/* dp_pool.c - see dp_pool.h. Also home of the aligned allocation helpers of dp_common.h. */
#include "dp_pool.h"
#include "dp_common.h"

#include <stdlib.h>
#include <string.h>

void *dp_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = DP_ALIGN;
#if defined(_WIN32)
    p = _aligned_malloc(bytes, DP_ALIGN);
#else
    if (posix_memalign(&p, DP_ALIGN, bytes) != 0) p = NULL;
#endif
    return p;
}

void dp_aligned_free(void *p)
{
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

void *dp_scratch_get(dp_scratch *s, size_t bytes)
{
    if (bytes <= s->cap && s->ptr) return s->ptr;
    dp_aligned_free(s->ptr);
    s->ptr = dp_aligned_alloc(bytes);
    s->cap = s->ptr ? bytes : 0;
    return s->ptr;
}

void dp_scratch_free(dp_scratch *s)
{
    dp_aligned_free(s->ptr);
    s->ptr = NULL;
    s->cap = 0;
}

#if defined(DP_NO_PTHREADS) || defined(_WIN32)

struct dp_pool { int threads; };

int dp_pool_create(dp_pool **out, int threads)
{
    dp_pool *p = malloc(sizeof *p);
    if (!p) return DP_ENOMEM;
    p->threads = 1;
    (void)threads;
    *out = p;
    return DP_OK;
}
void dp_pool_destroy(dp_pool *pool) { free(pool); }
int dp_pool_threads(const dp_pool *pool) { return pool ? pool->threads : 1; }
void dp_pool_run(dp_pool *pool, int n, dp_task_fn fn, void *arg)
{
    (void)pool;
    for (int t = 0; t < n; t++) fn(arg, t, n);
}

#else

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

struct dp_pool {
    int threads;                /* parts it can run: helpers + the caller */
    pid_t owner;                /* the process whose threads these are: a fork()ed child has
                                   none of them, so there the pool runs everything inline */
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

typedef struct { dp_pool *pool; int t; } helper_arg;

/* Spin this many times before sleeping: long enough to catch back-to-back kernels of one
 * step, short enough not to steal a core from another process for long. */
#define DP_POOL_SPINS 20000

static void *helper_main(void *p)
{
    helper_arg ha = *(helper_arg *)p;
    free(p);
    dp_pool *pool = ha.pool;
    /* The pool is created at generation 0 and no job can be posted before dp_pool_create
     * returns; reading the counter here instead would race with the first job and skip it. */
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen
               && spins < DP_POOL_SPINS)
            spins++;
        if (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen) {
            pthread_mutex_lock(&pool->mutex);
            while (atomic_load(&pool->generation) == seen && !pool->stop)
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (pool->stop) return NULL;
        seen = atomic_load(&pool->generation);
        if (ha.t < pool->n) pool->fn(pool->arg, ha.t, pool->n);
        if (atomic_fetch_sub_explicit(&pool->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done_cv);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
}

int dp_pool_create(dp_pool **out, int threads)
{
    if (threads < 1) threads = 1;
    dp_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return DP_ENOMEM;
    pool->threads = threads;
    pool->owner = getpid();
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    atomic_init(&pool->generation, 0u);
    atomic_init(&pool->remaining, 0);
    if (threads > 1) {
        pool->helpers = calloc((size_t)threads - 1, sizeof(pthread_t));
        if (!pool->helpers) { dp_pool_destroy(pool); return DP_ENOMEM; }
        for (int t = 1; t < threads; t++) {
            helper_arg *ha = malloc(sizeof *ha);
            if (!ha) { pool->threads = t; dp_pool_destroy(pool); return DP_ENOMEM; }
            ha->pool = pool;
            ha->t = t;
            if (pthread_create(&pool->helpers[t - 1], NULL, helper_main, ha) != 0) {
                free(ha);
                pool->threads = t;    /* destroy joins only the helpers that exist */
                dp_pool_destroy(pool);
                return DP_ETHREAD;
            }
        }
    }
    *out = pool;
    return DP_OK;
}

void dp_pool_destroy(dp_pool *pool)
{
    if (!pool) return;
    if (pool->helpers && pool->owner != getpid()) {
        /* after fork(): the helpers do not exist here, and the mutex may have been copied
         * locked; leak them rather than wait forever */
        free(pool->helpers);
        free(pool);
        return;
    }
    if (pool->helpers) {
        pthread_mutex_lock(&pool->mutex);
        pool->stop = 1;
        atomic_fetch_add(&pool->generation, 1u);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
        for (int t = 1; t < pool->threads; t++) pthread_join(pool->helpers[t - 1], NULL);
        free(pool->helpers);
    }
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done_cv);
    free(pool);
}

int dp_pool_threads(const dp_pool *pool) { return pool ? pool->threads : 1; }

void dp_pool_run(dp_pool *pool, int n, dp_task_fn fn, void *arg)
{
    if (!pool || pool->threads == 1 || n <= 1 || pool->owner != getpid()) {
        for (int t = 0; t < n; t++) fn(arg, t, n);
        return;
    }
    if (n > pool->threads) n = pool->threads;
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    atomic_store(&pool->remaining, pool->threads - 1);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1u, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    fn(arg, 0, n);
    int spins = 0;
    while (atomic_load_explicit(&pool->remaining, memory_order_acquire) > 0 && spins < DP_POOL_SPINS)
        spins++;
    if (atomic_load(&pool->remaining) > 0) {
        pthread_mutex_lock(&pool->mutex);
        while (atomic_load(&pool->remaining) > 0) pthread_cond_wait(&pool->done_cv, &pool->mutex);
        pthread_mutex_unlock(&pool->mutex);
    }
}

#endif
