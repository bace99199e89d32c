/* dp_allreduce.c - instantiates dp_allreduce_tmpl.h for float and double, and the group entry
 * points dp_allreduce_f32 / _f64 / _bf16 (see dp_allreduce.h). */
#include "dp_allreduce.h"
#include "dp_buffers.h"

#include <string.h>

#define T float
#define S _f32
#include "dp_allreduce_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_allreduce_tmpl.h"
#undef S
#undef T

#ifndef DP_VEC_PASS
/* ---------------------------------------------------------------- one worker's all-reduce */

static const char *const ALLREDUCE_NAMES[DP_ALLREDUCE_COUNT] = {"native", "ring", "tree"};

const char *dp_allreduce_name(int algorithm)
{ return algorithm >= 0 && algorithm < DP_ALLREDUCE_COUNT ? ALLREDUCE_NAMES[algorithm] : NULL; }

/* The handle's rules (see dp_allreduce_f32 in dp_allreduce.h). */
static int group_valid(const dp_group *g, ptrdiff_t start, ptrdiff_t stop)
{
    if (g->n < 1 || g->rank < 0 || g->rank >= g->n || g->k < 1 || !g->barrier || !g->bufs ||
        start < 0 || start > stop)
        return 0;
    if (g->algorithm == DP_ALLREDUCE_NATIVE) return g->out || g->k == g->n;
    if (g->algorithm == DP_ALLREDUCE_RING) return !g->out && g->k == g->n;
    if (g->algorithm == DP_ALLREDUCE_TREE)
        return !g->out && g->k == g->n && (g->scratch || start == stop);
    return 0;
}

#define GROUP_ALLREDUCE(T, S)                                                                     \
    int dp_allreduce##S(dp_group *g, ptrdiff_t start, ptrdiff_t stop, T scale, double *waited_s,  \
                        uint32_t *code)                                                           \
    { return dp_allreduce_ex##S(g, start, stop, scale, 1, waited_s, code); }                      \
    int dp_allreduce_ex##S(dp_group *g, ptrdiff_t start, ptrdiff_t stop, T scale, int publish,    \
                           double *waited_s, uint32_t *code)                                      \
    {                                                                                             \
        *waited_s = 0;                                                                            \
        int entered = publish & DP_ALLREDUCE_ENTERED;                                             \
        publish &= DP_ALLREDUCE_PUBLISH;                                                          \
        if (!group_valid(g, start, stop) ||                                                       \
            (!publish && (g->algorithm != DP_ALLREDUCE_NATIVE || !g->out)))                       \
            return DP_EVALUE;                                                                     \
        T *const *bufs = (T *const *)g->bufs;                                                     \
        if (!entered) { /* every buffer is complete (else the caller's barrier said so) */        \
            int rc = dp_group_barrier(g, waited_s, code);                                         \
            if (rc) return rc;                                                                    \
        }                                                                                         \
        if (g->algorithm == DP_ALLREDUCE_RING)                                                    \
            return dp_allreduce_ring##S(bufs, g->n, g->rank, start, stop, scale, g->barrier,      \
                                        &g->policy, code);                                        \
        if (g->algorithm == DP_ALLREDUCE_TREE)                                                    \
            return dp_allreduce_tree##S(bufs, (T *)g->scratch, g->n, g->rank, start, stop, scale, \
                                        g->barrier, &g->policy, code);                            \
        ptrdiff_t lo, hi;                                                                         \
        dp_slice(start, stop, g->rank, g->n, (int)sizeof(T), &lo, &hi);                           \
        if (g->k == 1 && !g->out) {                                                               \
            /* a group of one: the sum is the buffer itself, only the scale is left */            \
            if (scale != (T)1) dp_scale##S(bufs[0] + lo, hi - lo, scale);                         \
            return DP_OK;                                                                         \
        }                                                                                         \
        if (g->out)                                                                               \
            dp_sum_buffers##S((T *)g->out, (const T *const *)bufs, g->k, lo, hi, scale);          \
        else                                                                                      \
            dp_allreduce_slice##S(bufs, g->k, lo, hi, scale);                                     \
        if (!publish) return DP_OK; /* this worker's slice is reduced, the others' may not be */  \
        return dp_barrier_wait(g->barrier, &g->policy, code); /* every slice is reduced */        \
    }

/* dp_allreduce_f32, dp_allreduce_f64 */
GROUP_ALLREDUCE(float, _f32)
GROUP_ALLREDUCE(double, _f64)

int dp_allreduce_bf16(dp_group *g, ptrdiff_t start, ptrdiff_t stop, float scale, double *waited_s,
                      uint32_t *code)
{
    *waited_s = 0;
    if (!group_valid(g, start, stop) || g->algorithm != DP_ALLREDUCE_NATIVE || !g->out)
        return DP_EVALUE;
    int rc = dp_group_barrier(g, waited_s, code); /* every buffer is complete */
    if (rc) return rc;
    ptrdiff_t lo, hi;
    dp_slice(start, stop, g->rank, g->n, (int)sizeof(uint16_t), &lo, &hi);
    dp_sum_bf16((uint16_t *)g->out, (const uint16_t *const *)g->bufs, g->k, lo, hi, scale);
    return dp_barrier_wait(g->barrier, &g->policy, code); /* every slice is summed */
}
#endif /* DP_VEC_PASS */
