/* dp_pool.h - a small fork-join pthread pool for intra-worker threads.
 *
 * dp_pool_run(pool, n, fn, arg) calls fn(arg, t, n) for t = 0..n-1, t = 0 on the calling
 * thread, and returns when all have finished. The pool is owned by one context (one Python
 * object) and is not re-entrant: one caller at a time (the module serializes with a mutex).
 * Workers spin briefly on a generation counter and then sleep on a condition variable, so an
 * idle pool costs no CPU. Without pthreads (DP_NO_PTHREADS) everything runs on the caller.
 * We use our own pool instead of OpenMP on purpose: it can notice that it was inherited
 * through fork() (its threads are not) and then runs inline instead of hanging, which
 * libgomp does not; and it is one runtime less to ship.
 */
#ifndef DP_POOL_H
#define DP_POOL_H

typedef void (*dp_task_fn)(void *arg, int t, int n);

typedef struct dp_pool dp_pool;

/* Creates a pool that can run up to `threads` parts (threads - 1 helper threads). */
int dp_pool_create(dp_pool **out, int threads);
void dp_pool_destroy(dp_pool *pool);
int dp_pool_threads(const dp_pool *pool);
/* Runs fn over n parts (n <= dp_pool_threads; pool may be NULL, then n must be 1). */
void dp_pool_run(dp_pool *pool, int n, dp_task_fn fn, void *arg);

#endif
