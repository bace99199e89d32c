/* dp_sgd.h - the optimizer: one SGD step over the whole flat parameter buffer.
 *
 * Letters: P the flat parameter count (n below). One call updates every layer at once:
 * parameters, gradients and velocity are each one flat buffer of the same layout. The
 * update is torch.optim.SGD's (momentum, dampening, weight decay, Nesterov); grads are not
 * modified. Bodies: dp_sgd_tmpl.h, instantiated for float and double by dp_sgd.c.
 * Reference twin: dptrain.reference.sgd_step.
 *
 * dp_zero_team clears the gradient for the next step (zero_grad) on the same threads.
 *
 * Leaves out on purpose: other optimizers, and validation of the hyper-parameters (the
 * module refuses bad ones before calling).
 */
#ifndef DP_SGD_H
#define DP_SGD_H

#include "dp_common.h"
#include "dp_threads.h"
#include "dp_vec.h"

/* p, v, g (P,): d = g + weight_decay p; with momentum v = d on the first step, else
 * v = momentum v + (1 - dampening) d, then d = d + momentum v (nesterov) or v; p -= lr d.
 * v == NULL: plain SGD, no momentum buffer (the caller's momentum is 0); given, v is kept
 * even if momentum rounds to 0 in T. weight_decay == 0 adds no term (an infinite p stays). */
#define DP_SGD_VEC(X, T, S)                                                                \
    X(void, dp_sgd_step, S,                                                                \
      (T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum, T dampening, T weight_decay, \
       int nesterov, int first_step),                                                      \
      (p, v, g, n, lr, momentum, dampening, weight_decay, nesterov, first_step))

/* The concrete symbols, for grep: dp_sgd_step_f32 dp_sgd_step_f64 (vector kernels: dp_vec.h). */
DP_SGD_VEC(DP_VEC_PROTO, float, _f32)
DP_SGD_VEC(DP_VEC_PROTO, double, _f64)

/* The same step split over a thread team (NULL: the caller alone) in parts of whole
 * DP_SGD_UNITs, at least DP_SGD_MIN_PART elements each (fewer threads for a small buffer).
 * The update is elementwise, so the bits do not depend on the split. Where a model's threads
 * computed the gradient, a step on one of them was slower than on one thread alone: half the
 * gradient sat in the other core's cache. */
#define DP_SGD_UNIT 1024
#define DP_SGD_MIN_PART 32768
void dp_sgd_step_team_f32(dp_threads *team, float *p, float *v, const float *g, ptrdiff_t n,
                          float lr, float momentum, float dampening, float weight_decay,
                          int nesterov, int first_step);
void dp_sgd_step_team_f64(dp_threads *team, double *p, double *v, const double *g, ptrdiff_t n,
                          double lr, double momentum, double dampening, double weight_decay,
                          int nesterov, int first_step);
/* memset(p, 0, n * size) (zero_grad) of n elements of `size` bytes, split the same way: each
 * thread clears the part of the gradient that its sgd_step read. On one thread, after a
 * 2-thread step, the memset had to take every line back from the other core. */
void dp_zero_team(dp_threads *team, void *p, ptrdiff_t n, size_t size);

#endif
