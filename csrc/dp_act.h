/* dp_act.h - element-wise activations (ReLU, tanh, sigmoid, GELU) and the mean-squared-error
 * loss (the classification losses are dp_loss.h's).
 *
 * Letters: n elements of a flat array (B rows times their features), B rows, OUT outputs.
 * Forward: y = f(x), element by element; y may be x (in place).
 * Backward: dx = dy f'(.), WRITTEN (an activation has no parameters); dx may be dy. tanh and
 * sigmoid take their derivative from the forward OUTPUT y (tanh' = 1 - y^2, sigmoid' =
 * y (1 - y), as PyTorch's tanh_backward and sigmoid_backward do), GELU from its INPUT x.
 *
 *   tanh(x):     x P(x^2) / Q(x^2) for |x| < 0.55 (a Lambert continued fraction, no
 *                cancellation near 0), else sign(x) (1 - e) / (1 + e) with e = exp(-2|x|)
 *   sigmoid(x):  1 / (1 + exp(-x)) as in dp_sigmoid_bce: 1 / (1 + e) or e / (1 + e),
 *                e = exp(-|x|), so that no exp overflows
 *   GELU(x):     x Phi(x), Phi the standard normal CDF: PyTorch's default nn.GELU()
 *                (approximate='none', the erf form 0.5 x (1 + erf(x / sqrt 2))), NOT the tanh
 *                approximation. Phi(-|x|) = 0.5 erfc(|x| / sqrt 2) = 0.5 t exp(-x^2/2) g(t),
 *                t = 3 / (3 + |x| / sqrt 2), g a Chebyshev series (constants and their
 *                derivation: csrc/tests/gen_act_coeffs.py); exp(-x^2/2) is taken with x^2
 *                split exactly into a head and a tail, so that its relative error does not
 *                grow like x^2 eps. GELU'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) /
 *                sqrt(2 pi).
 * Accuracy against libm (the naive twins): a few ulp of the dtype (measured in
 * csrc/tests/test_model.c). Every exp is dp_math.h's branch-free one, so the loops vectorize.
 * NaN propagates as in NumPy (a NaN input gives a NaN output and gradient); +-inf give
 * tanh = +-1, sigmoid = 1 or 0, GELU(+inf) = +inf and GELU(-inf) = -inf * 0 = NaN, as the
 * formula x Phi(x) is in IEEE arithmetic (and PyTorch's CPU kernel); GELU'(+-inf) is NaN
 * (inf * 0) likewise.
 *
 * MSE: loss_sum = sum over the B rows and OUT outputs of (y - t)^2 (PyTorch's
 * MSELoss(reduction='sum'); no 1/2), and dy = d(grad_scale * loss_sum)/dy = 2 grad_scale
 * (y - t), written (dy may be y). PyTorch's default reduction='mean' divides by B OUT: pass
 * grad_scale = 1 / (B OUT) for its gradient and divide loss_sum by B OUT for its value. The sum
 * is taken in T over blocks of 256 values (8 partial sums) and in double across blocks.
 *
 * Every kernel has a naive twin (*_naive: plain loops on libm's tanh, exp and erfc, the
 * readable reference); both dtypes come from dp_act_tmpl.h.
 * Leaves out on purpose: the tanh approximation of GELU, softplus/ELU/leaky ReLU, and other
 * regression losses (L1, Huber): nothing asks for them yet.
 */
#ifndef DP_ACT_H
#define DP_ACT_H

#include "dp_common.h"
#include "dp_vec.h"

/* The vector kernels (dp_vec.h: a build per ISA and the public function that picks one).
 * relu: y = max(x, 0), a NaN stays NaN; dx = dy * (y > 0), y the forward OUTPUT
 * (relu'(x) = 1[x > 0] = 1[y > 0]). Reference twins: dptrain.reference.relu_forward/_backward. */
#define DP_ACT_VEC(X, T, S)                                                                        \
    X(void, dp_relu_forward, S, (T *y, const T *x, ptrdiff_t n), (y, x, n))                        \
    X(void, dp_relu_backward, S, (T *dx, const T *dy, const T *y, ptrdiff_t n), (dx, dy, y, n))    \
    X(void, dp_tanh_forward, S, (T *y, const T *x, ptrdiff_t n), (y, x, n))                        \
    X(void, dp_tanh_backward, S, (T *dx, const T *dy, const T *y, ptrdiff_t n), (dx, dy, y, n))    \
    X(void, dp_sigmoid_forward, S, (T *y, const T *x, ptrdiff_t n), (y, x, n))                     \
    X(void, dp_sigmoid_backward, S, (T *dx, const T *dy, const T *y, ptrdiff_t n), (dx, dy, y, n)) \
    X(void, dp_gelu_forward, S, (T *y, const T *x, ptrdiff_t n), (y, x, n))                        \
    X(void, dp_gelu_backward, S, (T *dx, const T *dy, const T *x, ptrdiff_t n), (dx, dy, x, n))    \
    X(void, dp_mse, S,                                                                             \
      (T *dy, double *loss_sum, const T *y, const T *target, int B, int OUT, T grad_scale),        \
      (dy, loss_sum, y, target, B, OUT, grad_scale))

#define DP_DECLARE_ACT(T, S)                                                                   \
    DP_ACT_VEC(DP_VEC_PROTO, T, S)                                                             \
    void dp_tanh_forward_naive##S(T *y, const T *x, ptrdiff_t n);                              \
    void dp_tanh_backward_naive##S(T *dx, const T *dy, const T *y, ptrdiff_t n);               \
    void dp_sigmoid_forward_naive##S(T *y, const T *x, ptrdiff_t n);                           \
    void dp_sigmoid_backward_naive##S(T *dx, const T *dy, const T *y, ptrdiff_t n);            \
    void dp_gelu_forward_naive##S(T *y, const T *x, ptrdiff_t n);                              \
    void dp_gelu_backward_naive##S(T *dx, const T *dy, const T *x, ptrdiff_t n);               \
    void dp_mse_naive##S(T *dy, double *loss_sum, const T *y, const T *target, int B, int OUT, \
                         T grad_scale);

/* The concrete symbols, for grep: dp_tanh_forward_f32 dp_tanh_forward_f64
 * dp_tanh_backward_f32 dp_tanh_backward_f64 dp_sigmoid_forward_f32 dp_sigmoid_forward_f64
 * dp_sigmoid_backward_f32 dp_sigmoid_backward_f64 dp_gelu_forward_f32 dp_gelu_forward_f64
 * dp_gelu_backward_f32 dp_gelu_backward_f64 dp_mse_f32 dp_mse_f64, and each with _naive before
 * the dtype suffix (dp_gelu_forward_naive_f32, ...). */
DP_DECLARE_ACT(float, _f32)
DP_DECLARE_ACT(double, _f64)

#endif
