/* dp_net.h - a stack of dense layers with ReLU between them, trained as one call.
 *
 * This is the fused path the Python models drive: one call does forward, loss and backward
 * for a batch, so a training step crosses the Python/C boundary (and the GIL) once.
 * Flat parameter layout, layer by layer: W_l (OUT_l, IN_l) row-major, then b_l (OUT_l,).
 * The network owns its scratch (activations, gradient ping-pong buffers, GEMM packing
 * buffers and intra-worker threads); parameters and gradients are the caller's flat arrays.
 * Leaves out on purpose: other activations and layer types (the CNN issue adds its own).
 */
#ifndef DP_NET_H
#define DP_NET_H

#include "dp_gemm.h"
#include "dp_act.h"
#include "dp_dense.h"
#include "dp_loss.h"

#define DP_MAX_LAYERS 16

typedef struct {
    int n_layers;
    int sizes[DP_MAX_LAYERS + 1];
    ptrdiff_t w_off[DP_MAX_LAYERS], b_off[DP_MAX_LAYERS];
    ptrdiff_t n_params;
    dp_loss loss;
    dp_ctx ctx;
    dp_scratch acts;         /* post-activation outputs of every layer, rows x sum(OUT_l) */
    dp_scratch grad_io;      /* two rows x max(OUT_l) buffers for the backward sweep */
    /* a backward sweep in progress (dp_net_forward_loss, then dp_net_backward_layer for
     * layers L-1 .. 0, so that a caller can start exchanging a layer's gradient while the
     * next one is computed) */
    int pending_rows;        /* rows of the batch in flight; 0 when none */
    int next_layer;          /* the layer the next backward step must be */
    int d_second;            /* which grad_io half holds d(loss)/d(layer output) */
    const void *pending_x;   /* the batch's input (the caller keeps it alive) */
} dp_net;

/* Parameter count of the layout above, or -1 when a size is < 1 or there are too many layers. */
ptrdiff_t dp_net_param_count(const int *sizes, int n_layers);
int dp_net_init(dp_net *net, const int *sizes, int n_layers, dp_loss loss, int threads);
void dp_net_free(dp_net *net);

#define DP_DECLARE_NET(T, S)                                                                   \
    int dp_net_loss_grad##S(dp_net *net, T *grads, double *loss_sum, int64_t *correct,         \
                            const T *params, const T *x, const int64_t *labels, int B,         \
                            T grad_scale);                                                     \
    int dp_net_forward_loss##S(dp_net *net, double *loss_sum, int64_t *correct,                \
                               const T *params, const T *x, const int64_t *labels, int B,      \
                               T grad_scale);                                                  \
    int dp_net_backward_layer##S(dp_net *net, T *grads, const T *params, int layer);           \
    int dp_net_evaluate##S(dp_net *net, T *logits, double *loss_sum, int64_t *correct,         \
                           const T *params, const T *x, const int64_t *labels, int B);

/* Declared above for float and double (bodies: dp_net_tmpl.h), that is:
 * dp_net_loss_grad_f32, dp_net_loss_grad_f64, dp_net_forward_loss_f32,
 * dp_net_forward_loss_f64, dp_net_backward_layer_f32, dp_net_backward_layer_f64,
 * dp_net_evaluate_f32, dp_net_evaluate_f64. */
DP_DECLARE_NET(float, _f32)
DP_DECLARE_NET(double, _f64)

#endif
