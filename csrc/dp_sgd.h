/* dp_sgd.h - the optimizer: one SGD step over the whole flat parameter buffer.
 *
 * Letters: P the flat parameter count (n below). One call updates every layer at once:
 * parameters, gradients and velocity are each one flat buffer of the same layout. The
 * update is torch.optim.SGD's (momentum, dampening, weight decay, Nesterov); grads are not
 * modified. Bodies: dp_sgd_tmpl.h, instantiated for float and double by dp_sgd.c.
 * Reference twin: dptrain.reference.sgd_step.
 *
 * Leaves out on purpose: other optimizers, and validation of the hyper-parameters (the
 * module refuses bad ones before calling).
 */
#ifndef DP_SGD_H
#define DP_SGD_H

#include "dp_common.h"
#include "dp_vec.h"

/* p, v, g (P,): d = g + weight_decay p; with momentum v = d on the first step, else
 * v = momentum v + (1 - dampening) d, then d = d + momentum v (nesterov) or v; p -= lr d.
 * v == NULL: plain SGD, no momentum buffer (the caller's momentum is 0); given, v is kept
 * even if momentum rounds to 0 in T. weight_decay == 0 adds no term (an infinite p stays). */
#define DP_SGD_VEC(X, T, S)                                                                    \
    X(void, dp_sgd_step, S, (T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum,           \
                             T dampening, T weight_decay, int nesterov, int first_step),       \
      (p, v, g, n, lr, momentum, dampening, weight_decay, nesterov, first_step))

/* The concrete symbols, for grep: dp_sgd_step_f32 dp_sgd_step_f64 (vector kernels: dp_vec.h). */
DP_SGD_VEC(DP_VEC_PROTO, float, _f32)
DP_SGD_VEC(DP_VEC_PROTO, double, _f64)

#endif
