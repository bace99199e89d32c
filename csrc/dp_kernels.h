/* dp_kernels.h - the layer, loss, optimizer and buffer kernels (plain C99 on flat arrays).
 *
 * Letters: B batch rows, IN/OUT dense-layer features, C classes, P parameters (flat length).
 * Layout: x (B, IN), w (OUT, IN) as in PyTorch's Linear, b (OUT,), y (B, OUT); labels int64.
 * Signatures: outputs first, then const inputs, then sizes and scalars. Backward kernels
 * ACCUMULATE (+=) into parameter gradients; zero_grad is one memset by the caller.
 * Every kernel is declared for float (_f32) and double (_f64) from one template
 * (dp_kernels_tmpl.h). Loss sums are returned in double whatever the dtype.
 */
#ifndef DP_KERNELS_H
#define DP_KERNELS_H

#include "dp_common.h"
#include "dp_gemm.h"

#define DP_DECLARE_KERNELS(T, S)                                                               \
    int dp_dense_forward##S(dp_ctx *ctx, T *y, const T *x, const T *w, const T *b,             \
                            int B, int IN, int OUT);                                           \
    int dp_dense_backward##S(dp_ctx *ctx, T *dw, T *db, T *dx, const T *dy, const T *x,        \
                             const T *w, int B, int IN, int OUT);                              \
    void dp_relu_forward##S(T *y, const T *x, ptrdiff_t n);                                    \
    void dp_relu_backward##S(T *dx, const T *dy, const T *y, ptrdiff_t n);                     \
    int dp_softmax_xent##S(T *dlogits, double *loss_sum, const T *logits,                      \
                           const int64_t *labels, int B, int C, T grad_scale);                 \
    int dp_sigmoid_bce##S(T *dlogits, double *loss_sum, const T *logits,                       \
                          const int64_t *labels, int B, T grad_scale);                         \
    int dp_logistic_grad##S(T *dw, T *db, double *loss_sum, int64_t *correct, const T *x,      \
                            const T *w, const T *b, const int64_t *labels, int B, int IN,      \
                            T grad_scale);                                                     \
    void dp_argmax##S(int64_t *out, const T *x, int B, int C);                                 \
    int dp_count_correct##S(int64_t *correct, const T *logits, const int64_t *labels, int B,   \
                            int C);                                                            \
    void dp_sgd_step##S(T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum, T dampening,    \
                        T weight_decay, int nesterov, int first_step);                         \
    void dp_sum_buffers##S(T *out, const T *const *ins, int k, ptrdiff_t start,                \
                           ptrdiff_t stop, T scale);                                           \
    void dp_scale##S(T *buf, ptrdiff_t n, T alpha);

DP_DECLARE_KERNELS(float, _f32)
DP_DECLARE_KERNELS(double, _f64)

#endif
