/* dp_buffers.h - flat-buffer arithmetic for the gradient exchange: the sum of the workers'
 * buffers and the averaging scale.
 *
 * Letters: k buffers, [start, stop) an element range of them. Every buffer is 1-D of one
 * length; the sum is taken in the order the buffers are given, so a result does not depend
 * on how a range is split between callers. Bodies: dp_buffers_tmpl.h, instantiated for float
 * and double by dp_buffers.c.
 * Reference twins: dptrain.reference.sum_buffers / scale_.
 *
 * Leaves out on purpose: the shared-memory group's reduction, which also synchronizes
 * (dp_allreduce_slice and dp_group_allreduce in dp_sync.h).
 */
#ifndef DP_BUFFERS_H
#define DP_BUFFERS_H

#include "dp_common.h"

/* out[start:stop] = scale * (ins[0] + ins[1] + ... + ins[k-1])[start:stop], added left to
 * right; out may be one of the inputs */
void dp_sum_buffers_f32(float *out, const float *const *ins, int k, ptrdiff_t start,
                        ptrdiff_t stop, float scale);
void dp_sum_buffers_f64(double *out, const double *const *ins, int k, ptrdiff_t start,
                        ptrdiff_t stop, double scale);

/* buf[0:n] *= alpha */
void dp_scale_f32(float *buf, ptrdiff_t n, float alpha);
void dp_scale_f64(double *buf, ptrdiff_t n, double alpha);

#endif
