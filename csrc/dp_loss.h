/* dp_loss.h - losses on logits, and what is counted from them (argmax, correct predictions).
 *
 * Letters: B batch rows, C classes, IN features (dp_logistic_grad). Layout: logits (B, C)
 * row-major (binary losses: (B,), one logit per row); labels int64 (B,), in [0, C), or in
 * {0, 1} for the binary ones. Signatures: outputs first (dlogits may be NULL: loss only),
 * then const inputs, then sizes and scalars. Loss sums are returned in double whatever the
 * dtype (a sum, not a mean: the caller divides). Gradients are scaled by grad_scale (1/B for
 * the mean loss). A label out of range returns DP_ELABEL before anything is written.
 * Bodies: dp_loss_tmpl.h, instantiated for float and double by dp_loss.c.
 * Reference twins: dptrain.reference.softmax_xent, sigmoid_bce, argmax, count_correct.
 *
 * Leaves out on purpose: label smoothing, class weights, and any loss the models do not use.
 */
#ifndef DP_LOSS_H
#define DP_LOSS_H

#include "dp_common.h"
#include "dp_vec.h"

/* The losses a model is trained with (dp_model.h says what each takes and counts). */
typedef enum { DP_LOSS_SOFTMAX_XENT = 0, DP_LOSS_SIGMOID_BCE = 1, DP_LOSS_MSE = 2 } dp_loss;

/* The vector kernels (dp_vec.h: a build per ISA and the public function that picks one):
 * - softmax_xent: sum_i logsumexp(z_i) - z_i[y_i]; dlogits = (softmax(z) - onehot(y)) *
 *   grad_scale; dlogits may be logits (in place);
 * - sigmoid_bce: sum_i softplus(z_i) - y_i z_i (without overflow); dlogits = (sigmoid(z) - y) *
 *   grad_scale;
 * - logistic_grad: logistic regression's forward, loss and backward fused in one pass over
 *   x (B, IN): z = x w + b with w (1, IN), b (1,); the sigmoid_bce loss sum and the count of
 *   (z > 0) == label; dw (IN,) and db (1,) ACCUMULATE the gradient of grad_scale * the loss
 *   sum. The dense path (dp_dense_forward, dp_sigmoid_bce, dp_dense_backward) computes the
 *   same; its two halves are the GEMM's matrix-vector blocks (dp_gemm_gemv_tmpl.h). */
#define DP_LOSS_VEC(X, T, S)                                                                       \
    X(int, dp_softmax_xent, S,                                                                     \
      (T *dlogits, double *loss_sum, const T *logits, const int64_t *labels, int B, int C,         \
       T grad_scale),                                                                              \
      (dlogits, loss_sum, logits, labels, B, C, grad_scale))                                       \
    X(int, dp_sigmoid_bce, S,                                                                      \
      (T *dlogits, double *loss_sum, const T *logits, const int64_t *labels, int B, T grad_scale), \
      (dlogits, loss_sum, logits, labels, B, grad_scale))                                          \
    X(int, dp_logistic_grad, S,                                                                    \
      (T *dw, T *db, double *loss_sum, int64_t *correct, const T *x, const T *w, const T *b,       \
       const int64_t *labels, int B, int IN, T grad_scale),                                        \
      (dw, db, loss_sum, correct, x, w, b, labels, B, IN, grad_scale))

/* The concrete symbols, for grep: dp_softmax_xent_f32 dp_softmax_xent_f64 dp_sigmoid_bce_f32
 * dp_sigmoid_bce_f64 dp_logistic_grad_f32 dp_logistic_grad_f64. */
DP_LOSS_VEC(DP_VEC_PROTO, float, _f32)
DP_LOSS_VEC(DP_VEC_PROTO, double, _f64)

/* out[i] = argmax of row i of x (B, C): the first maximum, a NaN counting as the maximum
 * (NumPy's rule) */
void dp_argmax_f32(int64_t *out, const float *x, int B, int C);
void dp_argmax_f64(int64_t *out, const double *x, int B, int C);

/* *correct = rows whose argmax is the label; C == 1 is a binary logit (predicted 1 when
 * z > 0, labels in {0, 1}) */
int dp_count_correct_f32(int64_t *correct, const float *logits, const int64_t *labels, int B,
                         int C);
int dp_count_correct_f64(int64_t *correct, const double *logits, const int64_t *labels, int B,
                         int C);

#endif
