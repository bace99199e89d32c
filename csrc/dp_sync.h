/* dp_sync.h - synchronization and reduction for workers that share memory (threads of one
 * process, or processes mapping the same multiprocessing.shared_memory segment).
 *
 * dp_barrier lives in the shared memory itself (it holds no pointer and no OS handle), so
 * every process that maps the segment can wait on it. Waiting spins first (a wake-up through
 * the kernel costs tens of microseconds on a time-shared VM, a spin well under one), then
 * yields the CPU
 * (oversubscribed runs, e.g. 8 workers on 2 cores, must still progress), then sleeps on a
 * futex (Linux; a short nanosleep elsewhere). Any worker can abort the barrier: every waiter,
 * present and future, returns DP_EABORT with the code the aborter left, so one failing worker
 * stops all of them instead of leaving them in a collective forever.
 *
 * dp_group: one worker's handle on a group (what a Python ShmGroup holds), and
 * dp_group_barrier, a barrier of one worker: arrival (its policy's), then the wait. The module only validates
 * and releases the GIL around it; the plain-C tests run it on pthreads.
 *
 * Leaves out on purpose: the all-reduce over the group, its own family (dp_allreduce.h).
 */
#ifndef DP_SYNC_H
#define DP_SYNC_H

#include "dp_common.h"

#define DP_EABORT (-10)   /* another worker aborted the group */
#define DP_ETIMEOUT (-11) /* the wait exceeded its timeout (the group is then aborted) */
#define DP_TIMEOUT_ABORT_CODE 0xfffffffeu /* abort code left by a worker that timed out */

#define DP_MAX_GROUP 1024 /* workers (and buffers) a group can have */

/* 64 bytes, 64-byte aligned in the caller's memory; zero-initialized memory is not enough:
 * call dp_barrier_init once, before any worker waits. */
typedef struct {
    uint32_t count;      /* arrivals in the current phase */
    uint32_t generation; /* bumped by the last arrival of each phase */
    uint32_t abort_code; /* 0, or why the group was aborted (set once) */
    uint32_t sleepers;   /* waiters that may be blocked in the kernel */
    uint32_t n;          /* workers in the group */
    uint32_t magic;      /* DP_BARRIER_MAGIC once initialized */
    uint32_t pad[10];
} dp_barrier;

#define DP_BARRIER_MAGIC 0x64706272u

typedef struct {
    double spin_s;    /* busy-wait this long first */
    double yield_s;   /* then give the CPU away with sched_yield this long */
    double timeout_s; /* <= 0: wait forever (until aborted); else fail after this long */
    /* NULL, or the barrier of the whole set of workers whose abort also ends this wait: one
     * abort of it stops every group of the set (a worker that fails before it ever meets a
     * group others already wait in still stops them); a timeout aborts it too */
    dp_barrier *world;
    /* NULL, or this worker's arrival counter's array (dp_group_arrivals) and its rank in it:
     * every wait counts an arrival first, so that a worker late at any barrier of a
     * collective, not only its first, is the one whose count lags */
    uint32_t *arrivals;
    int rank;
} dp_wait_policy;

/* A group's control block: the barrier, then (when the block is large enough) one arrival
 * counter per worker, bumped as the worker enters each collective (and at each of its later
 * barriers where the policy holds the counters), so that a worker that times out can name the
 * workers that never arrived. dp_group_control_bytes(n) is the size
 * with the counters (64-byte multiple); a block of only sizeof(dp_barrier) works untracked. */
size_t dp_group_control_bytes(int n);
/* The counters of a control block of `bytes` bytes for n workers, or NULL when too small. */
uint32_t *dp_group_arrivals(dp_barrier *b, size_t bytes, int n);
void dp_group_arrive(uint32_t *arrivals, int rank);
/* The ranks (at most max, into out) that have entered fewer collectives than `rank`; returns
 * how many there are in all. */
int dp_group_missing(const uint32_t *arrivals, int n, int rank, int *out, int max);

/* Seconds on the monotonic clock (the same clock in every process of the machine). */
double dp_clock_s(void);

int dp_barrier_init(dp_barrier *b, int n);
/* 0 when all n arrived; DP_EABORT (abort code in *code) or DP_ETIMEOUT otherwise. */
int dp_barrier_wait(dp_barrier *b, const dp_wait_policy *policy, uint32_t *code);
/* Marks the group aborted with a nonzero code (the first code wins) and wakes every waiter. */
void dp_barrier_abort(dp_barrier *b, uint32_t code);
uint32_t dp_barrier_abort_code(const dp_barrier *b);

/* Worker `rank`'s share of [start, stop) split in n parts (whole cache lines where possible). */
void dp_slice(ptrdiff_t start, ptrdiff_t stop, int rank, int n, int elem_bytes, ptrdiff_t *lo,
              ptrdiff_t *hi);

/* ---------------------------------------------------------------- one worker's group handle */

/* One worker's handle on a group. The caller owns every pointer and keeps it valid. */
typedef struct {
    dp_barrier *barrier; /* the group's control block (shared memory) */
    uint32_t *arrivals;  /* its per-worker arrival counters (dp_group_arrivals), or NULL; the
                          * policy's arrivals and rank count them (set them alike) */
    dp_wait_policy policy;
    int n;             /* workers in the group */
    int rank;          /* this worker, in [0, n) */
    int k;             /* buffers: n, or any number >= 1 for native with `out` */
    int algorithm;     /* DP_ALLREDUCE_NATIVE, _RING or _TREE (dp_allreduce.h) */
    void *const *bufs; /* k buffers (float * or double *) of one dtype and length */
    void *out;         /* NULL: the result goes into every buffer; else only here */
    void *scratch;     /* tree: this worker's scratch, as long as a buffer; else NULL */
} dp_group;

/* Waits at the group's barrier (its policy counts the arrival, where it holds the counters);
 * *waited_s = the seconds it waited. 0, or DP_EABORT / DP_ETIMEOUT (abort code in *code). */
int dp_group_barrier(dp_group *g, double *waited_s, uint32_t *code);

#endif
