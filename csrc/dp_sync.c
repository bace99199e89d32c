/* dp_sync.c - see dp_sync.h. */
#include "dp_sync.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if !defined(_WIN32)
#include <sched.h>
#endif

/* The fields are plain uint32_t in the struct (it is shared across processes and must have a
 * fixed layout); all accesses go through these casts to atomics of the same size. */
#define A32(field) ((_Atomic uint32_t *)&(field))

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

double dp_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sleeps until *addr may differ from `seen` or about `max_s` seconds pass. */
static void sleep_on(uint32_t *addr, uint32_t seen, double max_s)
{
#if defined(__linux__)
    struct timespec ts = {(time_t)max_s, (long)((max_s - (double)(time_t)max_s) * 1e9)};
    /* not FUTEX_PRIVATE_FLAG: the word may be shared between processes */
    syscall(SYS_futex, addr, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
    (void)addr;
    (void)seen;
    struct timespec ts = {0, max_s < 1e-4 ? (long)(max_s * 1e9) : 100000L};
    nanosleep(&ts, NULL);
#endif
}

static void wake_all(uint32_t *addr)
{
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

size_t dp_group_control_bytes(int n)
{
    size_t bytes = sizeof(dp_barrier) + 4 * (size_t)(n > 0 ? n : 0);
    return (bytes + 63) / 64 * 64;
}

uint32_t *dp_group_arrivals(dp_barrier *b, size_t bytes, int n)
{ return n >= 1 && bytes >= dp_group_control_bytes(n) ? (uint32_t *)(b + 1) : NULL; }

void dp_group_arrive(uint32_t *arrivals, int rank)
{ atomic_fetch_add_explicit(A32(arrivals[rank]), 1u, memory_order_release); }

int dp_group_missing(const uint32_t *arrivals, int n, int rank, int *out, int max)
{
    uint32_t mine = atomic_load(A32(((uint32_t *)arrivals)[rank]));
    int k = 0;
    for (int r = 0; r < n; r++)
        /* wrap-around safe: behind when the difference, read as signed, is negative */
        if ((int32_t)(atomic_load(A32(((uint32_t *)arrivals)[r])) - mine) < 0) {
            if (k < max) out[k] = r;
            k++;
        }
    return k;
}

int dp_barrier_init(dp_barrier *b, int n)
{
    if (n < 1) return DP_EVALUE;
    memset(b, 0, sizeof *b);
    b->n = (uint32_t)n;
    atomic_store(A32(b->magic), DP_BARRIER_MAGIC);
    return DP_OK;
}

uint32_t dp_barrier_abort_code(const dp_barrier *b)
{ return atomic_load(A32(((dp_barrier *)b)->abort_code)); }

void dp_barrier_abort(dp_barrier *b, uint32_t code)
{
    uint32_t zero = 0;
    atomic_compare_exchange_strong(A32(b->abort_code), &zero, code ? code : 1u);
    /* bump the generation so that sleepers see a change, then wake them all */
    atomic_fetch_add(A32(b->generation), 1u);
    wake_all(&b->generation);
}

/* The abort code of the barrier, or of the policy's world barrier; 0 when neither is aborted. */
static uint32_t aborted(dp_barrier *b, const dp_wait_policy *policy)
{
    uint32_t c = atomic_load(A32(b->abort_code));
    if (!c && policy->world) c = atomic_load(A32(policy->world->abort_code));
    return c;
}

int dp_barrier_wait(dp_barrier *b, const dp_wait_policy *policy, uint32_t *code)
{
    if (policy->arrivals) dp_group_arrive(policy->arrivals, policy->rank);
    uint32_t c = aborted(b, policy);
    if (c) {
        *code = c;
        return DP_EABORT;
    }
    uint32_t gen = atomic_load_explicit(A32(b->generation), memory_order_acquire);
    uint32_t arrived = atomic_fetch_add_explicit(A32(b->count), 1u, memory_order_acq_rel) + 1;
    if (arrived == b->n) {
        /* the last arrival opens the barrier for everyone */
        atomic_store_explicit(A32(b->count), 0u, memory_order_relaxed);
        atomic_fetch_add_explicit(A32(b->generation), 1u, memory_order_release);
        if (atomic_load(A32(b->sleepers))) wake_all(&b->generation);
        return DP_OK;
    }
    double t0 = dp_clock_s();
    for (long i = 0;; i++) {
        uint32_t g = atomic_load_explicit(A32(b->generation), memory_order_acquire);
        c = aborted(b, policy);
        if (c) {
            *code = c;
            return DP_EABORT;
        }
        if (g != gen) return DP_OK;
        if ((i & 63) != 63) {
            cpu_relax();
            continue;
        } /* read the clock every 64 spins */
        double waited = dp_clock_s() - t0;
        if (policy->timeout_s > 0 && waited > policy->timeout_s) {
            /* our arrival is counted and cannot be taken back safely: abort the group, or the
             * next phase would open one worker short */
            dp_barrier_abort(b, DP_TIMEOUT_ABORT_CODE);
            if (policy->world) dp_barrier_abort(policy->world, DP_TIMEOUT_ABORT_CODE);
            *code = DP_TIMEOUT_ABORT_CODE;
            return DP_ETIMEOUT;
        }
        if (waited < policy->spin_s) continue;
#if !defined(_WIN32)
        if (waited < policy->spin_s + policy->yield_s) {
            sched_yield();
            continue;
        }
#endif
        atomic_fetch_add(A32(b->sleepers), 1u);
        sleep_on(&b->generation, gen, 0.05); /* re-check abort and timeout every 50 ms */
        atomic_fetch_sub(A32(b->sleepers), 1u);
    }
}

void dp_slice(ptrdiff_t start, ptrdiff_t stop, int rank, int n, int elem_bytes, ptrdiff_t *lo,
              ptrdiff_t *hi)
{
    ptrdiff_t len = stop - start, line = 64 / elem_bytes;
    ptrdiff_t lines = (len + line - 1) / line;
    ptrdiff_t q = lines / n, r = lines % n;
    ptrdiff_t l0 = rank * q + (rank < r ? rank : r), l1 = l0 + q + (rank < r ? 1 : 0);
    *lo = start + l0 * line < stop ? start + l0 * line : stop;
    *hi = start + l1 * line < stop ? start + l1 * line : stop;
}

/* ---------------------------------------------------------------- one worker's group handle */

int dp_group_barrier(dp_group *g, double *waited_s, uint32_t *code)
{
    double t0 = dp_clock_s();
    int rc = dp_barrier_wait(g->barrier, &g->policy, code);
    *waited_s = dp_clock_s() - t0;
    return rc;
}
