/* dp_threads.h - a small fork-join team of pthreads for intra-worker parallelism (the threads
 * one worker's kernels split a GEMM or a batch over; not the data-parallel workers, and
 * nothing to do with max-pooling, which is dp_maxpool2_* in dp_pool.h).
 *
 * dp_threads_run(team, n, fn, arg) calls fn(arg, t, n) for t = 0..n-1, t = 0 on the calling
 * thread, and returns when all have finished. The team is owned by one context (one Python
 * object) and is not re-entrant: one caller at a time (the module serializes with a mutex).
 * Helpers spin briefly on a generation counter and then sleep on a condition variable, so an
 * idle team costs no CPU. Without pthreads (DP_NO_PTHREADS) everything runs on the caller.
 * We use our own threads instead of OpenMP on purpose: the team can notice that it was
 * inherited through fork() (its threads are not) and then runs inline instead of hanging,
 * which libgomp does not; and it is one runtime less to ship.
 */
#ifndef DP_THREADS_H
#define DP_THREADS_H

#include <stddef.h>

typedef void (*dp_task_fn)(void *arg, int t, int n);

typedef struct dp_threads dp_threads;

/* Creates a team that can run up to `threads` parts (threads - 1 helper threads). */
int dp_threads_create(dp_threads **out, int threads);
void dp_threads_destroy(dp_threads *team);
/* The parts the team can run at once (1 for a NULL team). */
int dp_threads_size(const dp_threads *team);
/* Runs fn over n parts (n <= dp_threads_size; team may be NULL, then n must be 1). Called from
 * inside a part of a job (any team's), it runs the n parts one after the other on the caller:
 * a kernel that splits itself over the team also works inside a region (below). */
void dp_threads_run(dp_threads *team, int n, dp_task_fn fn, void *arg);

/* A parallel region: fn(arg, t, n) on every thread at once, n = dp_threads_region_size, the
 * parts meeting at dp_threads_barrier(team, n) between phases (all n parts must reach every
 * barrier, so a part that fails records it and goes on to the next barrier). Where the team
 * cannot run its parts at the same time (NULL, one thread, after fork(), already inside a
 * job) the size is 1 and a barrier does nothing: the region is then one plain call. A region
 * replaces a fork/join per kernel by one per call: the parts wait at the barriers as the
 * helpers wait for a job (a spin that adapts, then sleep), and a part that finished its share
 * goes straight on to the next phase instead of back to sleep until the next kernel. */
int dp_threads_region_size(const dp_threads *team);
void dp_threads_region(dp_threads *team, dp_task_fn fn, void *arg);
void dp_threads_barrier(dp_threads *team, int n);

/* The jobs the team's helpers have run so far (the fork/joins: calls of dp_threads_run and
 * dp_threads_region that did not run inline); 0 for a NULL team. */
unsigned long long dp_threads_jobs(const dp_threads *team);

/* How a job is cut (the GEMM's blocks, the SGD step's elements): of `threads`, how many
 * `work` keeps busy with min_work each at least, and one (a small job runs on fewer threads
 * than its synchronization would cost); and part t of n of [0, total) in whole `unit`s, as
 * even as whole units go (the first units % n parts one unit more): [*lo, *hi). */
int dp_threads_for(int threads, long long work, long long min_work);
void dp_threads_part(ptrdiff_t total, ptrdiff_t unit, int t, int n, ptrdiff_t *lo, ptrdiff_t *hi);

#endif
