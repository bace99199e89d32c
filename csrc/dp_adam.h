/* dp_adam.h - the adaptive optimizers, Adam, AdamW and RMSprop: one step over the whole flat
 * parameter buffer.
 *
 * Letters: P the flat parameter count (n below). As dp_sgd.h, one call updates every layer:
 * parameters, gradients, the first moment m, the second moment v (and its running maximum
 * vmax for AMSGrad) are each one flat buffer of the same layout. The update is
 * torch.optim.Adam's / AdamW's (Kingma & Ba, 2015; Loshchilov & Hutter, 2019; AMSGrad: Reddi
 * et al., 2018), as its single-tensor code writes it; grads are not modified. Bodies:
 * dp_adam_tmpl.h, instantiated for float and double by dp_adam.c. Reference twin:
 * dptrain.reference.adam_step.
 *
 * Leaves out on purpose: validation of the hyper-parameters (the module refuses bad ones),
 * `maximize`, complex parameters and a step count held as a tensor (PyTorch's capturable).
 */
#ifndef DP_ADAM_H
#define DP_ADAM_H

#include "dp_common.h"
#include "dp_sgd.h"
#include "dp_threads.h"
#include "dp_vec.h"

/* The step's scalars in the buffers' dtype, computed in double from the hyper-parameters and
 * the step number by dp_adam_prepare_* as PyTorch computes them in Python floats, then rounded
 * once (PyTorch hands its kernels Python floats, which they round to the tensor's dtype):
 *   step_size = lr / (1 - beta1^t), inv_bias2_sqrt = 1 / (1 - beta2^t)^0.5,
 *   one_minus_beta1 = 1 - beta1, one_minus_beta2 = 1 - beta2,
 *   weight_decay: Adam's L2 term (g += weight_decay p), 0 for AdamW or none,
 *   decay: AdamW's decoupled factor 1 - lr weight_decay on p, 1 for Adam or none. */
#define DP_ADAM_HYPER_FIELDS(T)                                                       \
    T step_size, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_bias2_sqrt, \
        weight_decay, decay;
typedef struct {
    DP_ADAM_HYPER_FIELDS(float)
} dp_adam_hyper_f32;
typedef struct {
    DP_ADAM_HYPER_FIELDS(double)
} dp_adam_hyper_f64;

/* step t >= 1 (1-based: the first step is 1); decoupled: AdamW */
void dp_adam_prepare_f32(dp_adam_hyper_f32 *h, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int decoupled, long long t);
void dp_adam_prepare_f64(dp_adam_hyper_f64 *h, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int decoupled, long long t);

/* p, m, v, vmax, g (P,): g' = g + weight_decay p (Adam) or p *= decay first (AdamW);
 * m = beta1 m + (1 - beta1) g'; v = beta2 v + (1 - beta2) g'^2; vmax = max(vmax, v) and vmax
 * replaces v below (vmax != NULL: AMSGrad); p -= step_size m / (sqrt(v) inv_bias2_sqrt + eps).
 * PyTorch divides sqrt(v) by (1 - beta2^t)^0.5; the product by its reciprocal rounds up to an
 * ulp otherwise and leaves one division per element, not two: on buffers in cache the
 * division and the square root set the step's time (bench/README.md, "Adam").
 * weight_decay == 0 adds no term and decay == 1 multiplies by nothing (an infinite p stays,
 * as in PyTorch, which skips both when its weight_decay is 0). */
#define DP_ADAM_VEC(X, T, S)                               \
    X(void, dp_adam_step, S,                               \
      (T *p, T *m, T *v, T *vmax, const T *g, ptrdiff_t n, \
       const DP_VEC_CAT(dp_adam_hyper, S) * h),            \
      (p, m, v, vmax, g, n, h))

/* The concrete symbols, for grep: dp_adam_step_f32 dp_adam_step_f64 (vector kernels: dp_vec.h). */
DP_ADAM_VEC(DP_VEC_PROTO, float, _f32)
DP_ADAM_VEC(DP_VEC_PROTO, double, _f64)

/* The same step split over a thread team (NULL: the caller alone) in the parts that
 * dp_sgd_step_team and dp_zero_team use (DP_SGD_UNIT, DP_SGD_MIN_PART): each thread updates
 * the part of the gradient that it cleared and computed. Elementwise: the bits do not depend
 * on the split. */
void dp_adam_step_team_f32(dp_threads *team, float *p, float *m, float *v, float *vmax,
                           const float *g, ptrdiff_t n, const dp_adam_hyper_f32 *h);
void dp_adam_step_team_f64(dp_threads *team, double *p, double *m, double *v, double *vmax,
                           const double *g, ptrdiff_t n, const dp_adam_hyper_f64 *h);

/* RMSprop (Hinton's lecture 6e; torch.optim.RMSprop, as its single-tensor code writes it):
 * g' = g + weight_decay p; sq = alpha sq + (1 - alpha) g'^2; centered: gavg = gavg + (1 -
 * alpha) (g' - gavg) (torch's lerp) and avg = sqrt(max(sq - gavg^2, 0)) + eps, else avg =
 * sqrt(sq) + eps; momentum > 0: buf = momentum buf + g' / avg, p -= lr buf; else p -= lr g' /
 * avg. The variance sq - gavg^2 can round below 0 where it is about 0 (a gradient that stays
 * the same), which would make torch's sqrt a NaN that ends the run: it is taken as 0 here.
 * The step's scalars in the buffers' dtype (torch rounds its Python floats once likewise). */
#define DP_RMSPROP_HYPER_FIELDS(T) T lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
typedef struct {
    DP_RMSPROP_HYPER_FIELDS(float)
} dp_rmsprop_hyper_f32;
typedef struct {
    DP_RMSPROP_HYPER_FIELDS(double)
} dp_rmsprop_hyper_f64;

/* p, sq, gavg, buf, g (P,): gavg NULL unless centered, buf NULL unless momentum > 0 */
#define DP_RMSPROP_VEC(X, T, S)                               \
    X(void, dp_rmsprop_step, S,                               \
      (T *p, T *sq, T *gavg, T *buf, const T *g, ptrdiff_t n, \
       const DP_VEC_CAT(dp_rmsprop_hyper, S) * h),            \
      (p, sq, gavg, buf, g, n, h))

/* The concrete symbols, for grep: dp_rmsprop_step_f32 dp_rmsprop_step_f64 (vector kernels). */
DP_RMSPROP_VEC(DP_VEC_PROTO, float, _f32)
DP_RMSPROP_VEC(DP_VEC_PROTO, double, _f64)

/* Split over a thread team as dp_adam_step_team (elementwise: the bits do not depend on it). */
void dp_rmsprop_step_team_f32(dp_threads *team, float *p, float *sq, float *gavg, float *buf,
                              const float *g, ptrdiff_t n, const dp_rmsprop_hyper_f32 *h);
void dp_rmsprop_step_team_f64(dp_threads *team, double *p, double *sq, double *gavg, double *buf,
                              const double *g, ptrdiff_t n, const dp_rmsprop_hyper_f64 *h);

#endif
