/* dp_dense.h - the dense (fully connected) layer, forward and backward, on our GEMM.
 *
 * Letters: B batch rows, IN/OUT features. Layout as PyTorch's Linear: x (B, IN),
 * w (OUT, IN), b (OUT,), y (B, OUT). Signatures: the context, outputs, const inputs, sizes.
 * Backward ACCUMULATES (+=) into dw and db (zero_grad is one memset by the caller); dx is
 * WRITTEN. Bodies: dp_dense_tmpl.h, instantiated for float and double by dp_dense.c.
 * Reference twins: dptrain.reference.dense_forward / dense_backward.
 *
 * Leaves out on purpose: the one-output layer fused with its sigmoid loss (logistic
 * regression in one pass over x) is dp_logistic_grad in dp_loss.h, beside the BCE block it
 * shares with dp_sigmoid_bce.
 */
#ifndef DP_DENSE_H
#define DP_DENSE_H

#include "dp_common.h"
#include "dp_gemm.h"

/* y = x w^T + b */
int dp_dense_forward_f32(dp_ctx *ctx, float *y, const float *x, const float *w, const float *b,
                         int B, int IN, int OUT);
int dp_dense_forward_f64(dp_ctx *ctx, double *y, const double *x, const double *w, const double *b,
                         int B, int IN, int OUT);

/* dw += dy^T x, db += sum over rows of dy, and dx = dy w when dx is not NULL */
int dp_dense_backward_f32(dp_ctx *ctx, float *dw, float *db, float *dx, const float *dy,
                          const float *x, const float *w, int B, int IN, int OUT);
int dp_dense_backward_f64(dp_ctx *ctx, double *dw, double *db, double *dx, const double *dy,
                          const double *x, const double *w, int B, int IN, int OUT);

#endif
