/* dp_act.h - activation functions, element-wise over n elements of any shape.
 *
 * Signatures: outputs first, then const inputs, then the element count n. The output may be
 * the very same array as an input (in place). Bodies: dp_act_tmpl.h, instantiated for float
 * and double by dp_act.c (memory-bound: DP_CLONES builds an AVX2 clone beside the baseline).
 * Reference twins: dptrain.reference.relu_forward / relu_backward.
 *
 * Leaves out on purpose: activations the models do not use.
 */
#ifndef DP_ACT_H
#define DP_ACT_H

#include "dp_common.h"

/* y = max(x, 0); a NaN stays NaN */
void dp_relu_forward_f32(float *y, const float *x, ptrdiff_t n);
void dp_relu_forward_f64(double *y, const double *x, ptrdiff_t n);

/* dx = dy * (y > 0), y the forward OUTPUT (relu'(x) = 1[x > 0] = 1[y > 0]) */
void dp_relu_backward_f32(float *dx, const float *dy, const float *y, ptrdiff_t n);
void dp_relu_backward_f64(double *dx, const double *dy, const double *y, ptrdiff_t n);

#endif
