/* dp_cnn.h - a small convolutional network, trained as one call per batch (like dp_net.h).
 *
 * Architecture: n_conv blocks [conv KxK, stride 1, zero padding PAD -> ReLU -> 2x2 max-pool,
 * stride 2], the last block's (OC, PH, PW) map flattened in that order (torch.flatten), then
 * n_dense dense layers with ReLU between them (none after the last), softmax cross-entropy on
 * the logits. The default model of dptrain.models.CNN is two blocks (32 and 64 channels, 3x3,
 * no padding) and dense 128 -> 10.
 *
 * Flat parameter layout, layer by layer in PyTorch's order: a conv layer's W (OC, C, KH, KW)
 * then b (OC,); a dense layer's W (OUT, IN) then b (OUT,). Parameters and gradients are the
 * caller's flat arrays; backward ACCUMULATES into the gradient.
 *
 * Letters: B batch rows; per layer l, width[l] is the flat feature count of its input and
 * width[l + 1] of its output (a conv block's output is its pooled map, OC PH PW).
 *
 * A block pools first and adds the bias and applies the ReLU after: the bias is constant over
 * a window and ReLU is monotone, so relu(max(a) + b) = max(relu(a + b)), with the same argmax
 * and the same gradient (d reaches the window's argmax iff the pooled output is > 0), and the
 * bias and ReLU passes touch a map four times smaller. Only the pooled maps and their argmax
 * codes are kept for backward; the conv output is per-image scratch, and of it only the block
 * the pooling reads is computed: an odd last row or column (conv2's 13th of 13 in the CIFAR
 * network) cannot reach the loss, and its gradient is exactly zero.
 *
 * Threads: a conv layer's images are split over the threads; each thread has its own GEMM
 * context (no threads of its own), im2col buffer, conv-output buffer and its own partial dW^T (K, OC) and
 * db (see dp_conv_image_backward), added into the gradient after the layer in thread order
 * (so the sum's order depends on the thread count, not on timing). Dense layers run on the
 * whole batch with the threaded GEMM.
 *
 * Leaves out on purpose: other losses, strides, pooling windows and layer orders.
 */
#ifndef DP_CNN_H
#define DP_CNN_H

#include "dp_conv.h"
#include "dp_gemm.h"
#include "dp_act.h"
#include "dp_dense.h"
#include "dp_loss.h"
#include "dp_net.h"      /* DP_EORDER */

#define DP_CNN_MAX_CONV 8
#define DP_CNN_MAX_DENSE 8
#define DP_CNN_MAX_LAYERS (DP_CNN_MAX_CONV + DP_CNN_MAX_DENSE)

typedef struct {
    dp_ctx ctx;               /* threads = 1: this thread's GEMM packing buffers */
    dp_scratch col;           /* im2col patches of one image */
    dp_scratch conv;          /* one image's conv output (OC, OH, OW), or its gradient */
    dp_scratch grad;          /* this thread's dW^T and db of one conv layer */
} dp_cnn_thread;

typedef struct {
    int n_conv, n_dense, n_layers;
    dp_conv_geom conv[DP_CNN_MAX_CONV];
    /* the block of each conv output that pooling reads, 2 (OH / 2) x 2 (OW / 2): an odd last
     * row or column of the convolution is never computed (it cannot reach the loss) */
    int conv_h[DP_CNN_MAX_CONV], conv_w[DP_CNN_MAX_CONV];
    int width[DP_CNN_MAX_LAYERS + 1];
    ptrdiff_t w_off[DP_CNN_MAX_LAYERS], b_off[DP_CNN_MAX_LAYERS];
    ptrdiff_t n_params;
    int bad_layer;            /* after DP_EVALUE from dp_cnn_init: the layer that failed */
    int threads;
    dp_ctx ctx;               /* threads and packing buffers of the dense layers */
    dp_cnn_thread *th;        /* one per thread */
    dp_scratch acts;          /* every layer's output for `rows` rows (T) */
    dp_scratch codes;         /* every conv layer's argmax codes (uint8) */
    dp_scratch grad_io;       /* two rows x max(width) buffers for the backward sweep */
    /* a backward sweep in progress, as in dp_net */
    int pending_rows;
    int next_layer;
    int d_second;
    const void *pending_x;
} dp_cnn;

/* Plans the layers from the input (C, H, W), the conv channels, the square kernel size and
 * padding, and the dense widths (the last is the class count, >= 2), then allocates the
 * contexts. DP_EVALUE: a bad size, or a layer whose input is too small (net->bad_layer names
 * it; the geometry up to it is filled in for the message). dp_cnn_free is safe after failure. */
int dp_cnn_init(dp_cnn *net, int C, int H, int W, const int *channels, int n_conv, int kernel,
                int pad, const int *dense, int n_dense, int threads);
void dp_cnn_free(dp_cnn *net);

#define DP_DECLARE_CNN(T, S)                                                                   \
    int dp_cnn_loss_grad##S(dp_cnn *net, T *grads, double *loss_sum, int64_t *correct,         \
                            const T *params, const T *x, const int64_t *labels, int B,         \
                            T grad_scale);                                                     \
    int dp_cnn_forward_loss##S(dp_cnn *net, double *loss_sum, int64_t *correct,                \
                               const T *params, const T *x, const int64_t *labels, int B,      \
                               T grad_scale);                                                  \
    int dp_cnn_backward_layer##S(dp_cnn *net, T *grads, const T *params, int layer);           \
    int dp_cnn_evaluate##S(dp_cnn *net, T *logits, double *loss_sum, int64_t *correct,         \
                           const T *params, const T *x, const int64_t *labels, int B);

/* Declared above for float and double (bodies: dp_cnn_tmpl.h), that is:
 * dp_cnn_loss_grad_f32, dp_cnn_loss_grad_f64, dp_cnn_forward_loss_f32,
 * dp_cnn_forward_loss_f64, dp_cnn_backward_layer_f32, dp_cnn_backward_layer_f64,
 * dp_cnn_evaluate_f32, dp_cnn_evaluate_f64. */
DP_DECLARE_CNN(float, _f32)
DP_DECLARE_CNN(double, _f64)

#endif
