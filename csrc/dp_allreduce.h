/* dp_allreduce.h - the all-reduce over a shared-memory group (dp_sync.h): every worker's flat
 * buffer of one role replaced by the scaled sum of all of them, the gradient exchange of the
 * thread and process transports (dptrain._core.ShmGroup.allreduce, whose twin is
 * dptrain.reference.allreduce).
 *
 *   dp_allreduce_f32 / _f64 / _bf16   one worker's part of the collective: arrival, entry
 *                                     barrier, the group's algorithm, exit
 *   dp_allreduce_slice                native: after a barrier, worker r of n sums its slice of
 *                                     every worker's buffer in rank order and writes the scaled
 *                                     sum back into all of them (reduce-scatter + all-gather in
 *                                     one pass over shared memory); a second barrier publishes
 *                                     the result
 *   dp_allreduce_ring, _tree          the point-to-point schedules, for comparing algorithms
 *
 * Letters: n workers (and k buffers), [start, stop) the element range reduced, [lo, hi) one
 * worker's slice of it (dp_slice). Bodies: dp_allreduce_tmpl.h (the vector kernels, a build
 * per ISA: dp_vec.h), instantiated for float and double by dp_allreduce.c, which also holds the
 * group entry points. The plain-C tests run them on pthreads (csrc/tests/test_core.c:
 * test_sync, test_group_allreduce).
 *
 * Leaves out on purpose: the barrier and the group handle (dp_sync.h), and the buffer sum the
 * native algorithm with `out` uses (dp_sum_buffers, dp_sum_bf16: dp_buffers.h).
 */
#ifndef DP_ALLREDUCE_H
#define DP_ALLREDUCE_H

#include "dp_common.h"
#include "dp_sync.h"
#include "dp_vec.h"

/* The point-to-point all-reduce algorithms over shared memory, for comparing algorithms on one
 * machine (the same schedules as dptrain.comm.algorithms runs over MPI messages). A "message" from
 * worker q is worker q's buffer itself: the receiver reads it in place after a barrier, so a
 * step costs one barrier (alpha) plus the bytes it reads (beta). The group-wide barrier is
 * stronger than the pairwise synchronization the schedules need; with 2 to 8 workers on one
 * machine it costs the same.
 *
 * Worker `rank` of n calls it once every buffer is complete (after a barrier); it returns after
 * a final barrier, with bufs[rank][start:stop] = scale * the sum over the n buffers.
 * - ring: reduce-scatter then all-gather around the ring, 2 (n - 1) steps; part j of the range
 *   is summed along one chain and then copied, so every worker ends with identical bits.
 * - tree: recursive doubling (log2 n rounds of whole-range exchanges, partner = rank ^ mask;
 *   x + y on one side, y + x on the other: identical bits); a world that is not a power of
 *   two first folds its extra workers into the others and copies the result back to them.
 *   tmp is this worker's scratch of stop - start elements (tree only; ring may pass NULL).
 * Returns 0, or DP_EABORT / DP_ETIMEOUT from a barrier (abort code in *code).
 *
 * dp_allreduce_slice: the native algorithm's share of one worker, bufs[0..k)[lo:hi] = scale *
 * (bufs[0] + ... + bufs[k-1])[lo:hi], summed in index order. */
#define DP_ALLREDUCE_VEC(X, T, S)                                                                \
    X(void, dp_allreduce_slice, S, (T *const *bufs, int k, ptrdiff_t lo, ptrdiff_t hi, T scale), \
      (bufs, k, lo, hi, scale))                                                                  \
    X(int, dp_allreduce_ring, S,                                                                 \
      (T *const *bufs, int n, int rank, ptrdiff_t start, ptrdiff_t stop, T scale, dp_barrier *b, \
       const dp_wait_policy *policy, uint32_t *code),                                            \
      (bufs, n, rank, start, stop, scale, b, policy, code))                                      \
    X(int, dp_allreduce_tree, S,                                                                 \
      (T *const *bufs, T *tmp, int n, int rank, ptrdiff_t start, ptrdiff_t stop, T scale,        \
       dp_barrier *b, const dp_wait_policy *policy, uint32_t *code),                             \
      (bufs, tmp, n, rank, start, stop, scale, b, policy, code))

/* The concrete symbols, for grep: dp_allreduce_slice_f32 dp_allreduce_slice_f64
 * dp_allreduce_ring_f32 dp_allreduce_ring_f64 dp_allreduce_tree_f32 dp_allreduce_tree_f64.
 * Vector kernels (dp_vec.h); their bodies are in dp_allreduce_tmpl.h. */
DP_ALLREDUCE_VEC(DP_VEC_PROTO, float, _f32)
DP_ALLREDUCE_VEC(DP_VEC_PROTO, double, _f64)

/* ---------------------------------------------------------------- one worker's all-reduce */

/* The all-reduce algorithms of a group (see dp_allreduce_ring / dp_allreduce_tree above;
 * native: dp_allreduce_slice, or dp_sum_buffers into `out`, between two barriers). */
enum { DP_ALLREDUCE_NATIVE, DP_ALLREDUCE_RING, DP_ALLREDUCE_TREE, DP_ALLREDUCE_COUNT };
/* "native", "ring", "tree" (the names Python passes as algorithm=); NULL outside the range. */
const char *dp_allreduce_name(int algorithm);

/* Worker g->rank's part of an all-reduce of the group's buffers over [start, stop), every
 * worker calling it once its buffer is complete. Entry barrier (*waited_s = the seconds this
 * worker waited there for the others: arrival skew, not transfer), then the algorithm:
 * - native: this worker's slice (dp_slice) of scale * (bufs[0] + ... + bufs[k-1]), summed in
 *   buffer order, written into every buffer (dp_allreduce_slice), or only into out; a group of
 *   one buffer and no out only scales it. Then an exit barrier.
 * - ring / tree (k == n, no out; tree needs scratch): dp_allreduce_ring / dp_allreduce_tree,
 *   every buffer then holds the same bits (summed in another order than native's).
 * Returns 0; DP_EABORT / DP_ETIMEOUT from a barrier (abort code in *code); DP_EVALUE for a
 * handle that breaks the rules above (nothing waited for, nothing written). */
int dp_allreduce_f32(dp_group *g, ptrdiff_t start, ptrdiff_t stop, float scale, double *waited_s,
                     uint32_t *code);
int dp_allreduce_f64(dp_group *g, ptrdiff_t start, ptrdiff_t stop, double scale, double *waited_s,
                     uint32_t *code);
/* The same with flags in `publish`. Without DP_ALLREDUCE_PUBLISH (native with out only,
 * DP_EVALUE otherwise) it returns once this worker's slice of out (dp_slice) is summed, without
 * the exit barrier: the other slices may still be in progress (a sharded update: each worker
 * goes on with its own slice, and a later barrier publishes them all). DP_ALLREDUCE_ENTERED:
 * every worker has just passed a barrier of its own with its buffer complete (the
 * communicator's check of the call's arguments), so the entry barrier is left out and
 * *waited_s is 0. DP_ALLREDUCE_PUBLISH alone is dp_allreduce_f32 / _f64. */
enum { DP_ALLREDUCE_PUBLISH = 1, DP_ALLREDUCE_ENTERED = 2 };
int dp_allreduce_ex_f32(dp_group *g, ptrdiff_t start, ptrdiff_t stop, float scale, int publish,
                        double *waited_s, uint32_t *code);
int dp_allreduce_ex_f64(dp_group *g, ptrdiff_t start, ptrdiff_t stop, double scale, int publish,
                        double *waited_s, uint32_t *code);
/* The same for bfloat16 buffers (uint16_t, dp_buffers.h) and a bfloat16 out: native with
 * out only (DP_EVALUE otherwise); out[slice] = bfloat16(scale * the float sum of the buffers
 * widened, in buffer order) (dp_sum_bf16): half the bytes of a float all-reduce both ways. */
int dp_allreduce_bf16(dp_group *g, ptrdiff_t start, ptrdiff_t stop, float scale, double *waited_s,
                      uint32_t *code);

#endif
