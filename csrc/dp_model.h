/* dp_model.h - one network engine for an architecture given as a list of layers.
 *
 * A model is a list of layer specs (dp_layer) on an input of shape (C, H, W) or (F,), and a
 * loss. dp_model_plan checks the list and compiles it into STAGES, the units the engine runs:
 *
 *   DENSE [act]                  y = act(x W^T + b) on the flattened input (GEMM), act in place
 *   CONV [act]                   2-D convolution, zero padding, a stride, the images split over
 *                                the threads; y = act(conv(x) + b) in place
 *   CONV MAXPOOL2 [act]          the fused conv block: conv, 2x2 max-pool, then the bias and the
 *   CONV RELU MAXPOOL2           act on the pooled map (relu(max(a) + b) = max(relu(a + b)), the
 *                                same argmax and gradient), and of the conv output only the
 *                                2 (OH/2) x 2 (OW/2) block the pooling reads is computed
 *   MAXPOOL2                     2x2 max-pool, stride 2, argmax codes kept for backward
 *   AVGPOOL2 | GAP               2x2 average pooling, stride 2; global average pooling (C, H, W)
 *                                -> (C,) (dp_layers.h)
 *   DROPOUT                      training (loss_grad, forward_loss): a mask keyed on (rng_seed,
 *                                rng_step, rng_row0 + row, the layer's index), kept (a byte per
 *                                value) for backward; evaluate: its input passed on
 *   LAYERNORM                    a parameterized stage of its own: per row, normalized over
 *                                its features, then gamma and beta per feature; (mean, rstd)
 *                                kept per row
 *   BATCHNORM                    parameterized, a stage of its own: training sums each row's
 *                                channels (x, x^2), part 0 adds the rows in row order, the
 *                                caller's exchange (if any) adds the workers', then every
 *                                row is normalized by the batch's mean and variance; the
 *                                running statistics (state) move after the call succeeds.
 *                                Backward: the rows' (dy, dy xhat) sums likewise, exchanged,
 *                                for dx; dgamma and dbeta are this call's rows' sums
 *   RES_BEGIN                    a copy of its input: the skip connection's source
 *   RES_END [act]                the block's output plus RES_BEGIN's copy, projected by a 1x1
 *                                conv (a stride, a bias; parameterized) where the shapes
 *                                differ; backward leaves d as the block output's gradient and
 *                                puts the skip's into a buffer of its own, which RES_BEGIN's
 *                                backward adds
 *   RELU | TANH | SIGMOID | GELU an activation on its own (a GELU always is: its backward needs
 *                                its input, which an in-place activation would overwrite)
 *
 * where [act] is an optional RELU, TANH or SIGMOID right after (their derivatives come from
 * the output, see dp_act.h). FLATTEN is a no-op on the flat row layout (a row of a (C, H, W)
 * activation is its C H W values in that order, torch.flatten's) and only changes the shape
 * that the next layers see; a DENSE layer flattens implicitly.
 *
 * So the studies' CNN, [CONV(32,3,0) RELU MAXPOOL2 CONV(64,3,0) RELU MAXPOOL2 FLATTEN DENSE(128)
 * RELU DENSE(10)], runs as four stages (two fused conv blocks, a dense stage with its ReLU, a
 * dense stage) and an MLP [DENSE(256) RELU DENSE(128) RELU DENSE(10)] as three dense stages; a
 * single DENSE(1) with the sigmoid BCE (logistic regression) takes dp_logistic_grad's one-pass
 * path in loss_grad.
 *
 * Letters: B batch rows; a stage's in_width / out_width are the flat features per row of its
 * input and output; OUT = the model's output width (the last stage's out_width). x is
 * (B, in_width of the input shape), outputs (B, OUT).
 *
 * Parameters: one flat array, per parameterized layer (DENSE, CONV, LAYERNORM) in list order
 * its W then its b: dense W (OUT, IN) row-major (PyTorch's Linear), conv W (OC, C, K, K)
 * (Conv2d), b (OUT,) / (OC,); a layer norm's gamma then beta, (F,) each (F its input's
 * features, LayerNorm(input shape)'s weight and bias flattened). Gradients: one flat array of the same layout; backward ACCUMULATES (+=).
 *
 * Losses (dp_loss, dp_loss.h), summed over the batch and scaled by grad_scale for the gradient:
 *   DP_LOSS_SOFTMAX_XENT  int64 labels in [0, OUT), OUT >= 2; correct = argmax hits
 *   DP_LOSS_SIGMOID_BCE   OUT == 1, int64 labels in {0, 1}; correct = (z > 0) == label
 *   DP_LOSS_MSE           targets of the model's dtype, (B, OUT): loss = sum over rows and
 *                         outputs of (y - t)^2, PyTorch's MSELoss(reduction='sum') (no 1/2);
 *                         with grad_scale = 1 / (B OUT) the gradient is MSELoss()'s (mean)
 *                         gradient. correct is always 0.
 * The classification losses take `labels` (targets may be NULL), MSE takes `targets` (labels
 * may be NULL).
 *
 * Entry points (per dtype; the concrete names are listed below DP_DECLARE_MODEL):
 *   loss_grad       forward, loss and backward of a batch in one call.
 *   forward_loss + backward_layer(k), k = P_L - 1 .. 0
 *                   the same sweep in steps, so that a caller can exchange layer k's gradient
 *                   while layer k - 1's is computed. k counts PARAMETERIZED layers only (the
 *                   k-th DENSE or CONV in the list, plan.param_spec[k]); step k runs the
 *                   parameter-free layers after layer k (up to the next parameterized one),
 *                   then layer k. A step out of order, or with no sweep in progress, is
 *                   DP_EORDER. loss_grad and evaluate END a sweep in progress on every path
 *                   (B == 0 and errors included): they reuse its scratch. The caller keeps x
 *                   alive during a sweep.
 *   evaluate        forward only, in chunks of eval_rows rows (the scratch stays bounded):
 *                   the outputs into `out` when not NULL; loss sum and correct count when the
 *                   loss's labels / targets are given, else both 0.
 * All return DP_OK or a negative code: DP_EVALUE (missing labels / targets), DP_ELABEL (a
 * label out of range: model->bad_row is then the first bad row, counted from the batch's
 * first row), DP_ENOMEM, DP_EORDER. B <= 0 is an empty batch: loss 0, correct 0, nothing
 * accumulated.
 *
 * Threads (dp_model_init's `threads`): each call runs as one parallel region of the model's
 * team (dp_threads_region; see the sweep in dp_model_tmpl.h), whose parts meet at barriers
 * between phases. Dense stages split each GEMM's blocks (or, for a weight gradient with too
 * few blocks, its K slices: dp_gemm_part), the bias fill and activations by rows and the bias
 * gradient by columns: the bits of one thread on any thread count. Conv stages split the
 * batch's images over the threads, each with its own GEMM context, im2col buffer and partial
 * dW^T, db, added into the gradient in thread order (the sum's order depends on the thread
 * count, not on timing); pooling and standalone activations split the rows. A model of one
 * stage, or with bfloat16 inputs, keeps a fork/join per kernel instead.
 *
 * A model is used by one caller at a time (its scratch and sweep state are the model's).
 * Dropout's key is the caller's (rng_seed, rng_step, rng_row0: the model's seed, the training
 * step and the global index of the batch's first row): a sample's mask is then its own on any
 * number of workers, threads and batch cuts. Pooling stages split rows, a layer norm's
 * parameter gradient splits its columns (each summed over the rows in row order): the bits of
 * one thread.
 *
 * Leaves out on purpose: batch norm's exchange in a fixed order across workers (the
 * caller's all-reduce sums them, so N workers give one worker's model to rounding, not bit
 * for bit).
 */
#ifndef DP_MODEL_H
#define DP_MODEL_H

#include "dp_conv.h"
#include "dp_pool.h"
#include "dp_gemm.h"
#include "dp_loss.h" /* dp_loss */

#define DP_MODEL_MAX_LAYERS 64

typedef enum {
    DP_LAYER_DENSE = 0, /* out: output features */
    DP_LAYER_CONV = 1,  /* out: output channels; kernel: K (K x K); pad: zeros per side */
    DP_LAYER_MAXPOOL2 = 2,
    DP_LAYER_RELU = 3,
    DP_LAYER_TANH = 4,
    DP_LAYER_SIGMOID = 5,
    DP_LAYER_GELU = 6, /* erf form: PyTorch's nn.GELU() default (see dp_act.h) */
    DP_LAYER_FLATTEN = 7,
    DP_LAYER_AVGPOOL2 = 8,   /* 2x2 average, stride 2 */
    DP_LAYER_GAP = 9,        /* global average pooling: (C, H, W) -> (C,) */
    DP_LAYER_DROPOUT = 10,   /* rate: the probability of a zero */
    DP_LAYER_LAYERNORM = 11, /* over every feature of a row, with a scale and a shift each */
    /* a residual block: RES_BEGIN, the block's layers, RES_END, whose output is the block's
     * plus the block's input, through a 1x1 convolution (a stride, a bias) where the shapes
     * differ; the plan sets RES_END's out (channels), stride and kernel (1: projected) */
    DP_LAYER_RES_BEGIN = 12,
    DP_LAYER_RES_END = 13,
    DP_LAYER_BATCHNORM = 14 /* per channel ((C, H, W)) or feature ((F,)), the batch's statistics */
} dp_layer_kind;

typedef struct {
    dp_layer_kind kind;
    int out, kernel, pad; /* unused fields of a kind are ignored */
    int stride;           /* CONV: 0 or 1 is stride 1 */
    double rate;          /* DROPOUT: in [0, 1) */
} dp_layer;

typedef enum { DP_ACT_NONE = 0, DP_ACT_RELU, DP_ACT_TANH, DP_ACT_SIGMOID, DP_ACT_GELU } dp_act;

typedef enum {
    DP_STAGE_DENSE = 0,
    DP_STAGE_CONV,
    DP_STAGE_POOL,
    DP_STAGE_ACT,
    DP_STAGE_AVGPOOL,
    DP_STAGE_GAP,
    DP_STAGE_DROPOUT,
    DP_STAGE_NORM,     /* LAYERNORM: parameterized (gamma as its W, beta as its b) */
    DP_STAGE_RESBEGIN, /* a copy of its input: the skip connection's source */
    DP_STAGE_RESEND,   /* block output + skip (projected: parameterized, a 1x1 conv) [act] */
    DP_STAGE_BN        /* BATCHNORM: parameterized (gamma, beta); running statistics in state */
} dp_stage_op;

typedef struct {
    dp_stage_op op;
    dp_act act;              /* DENSE, CONV: applied in place after (NONE, RELU, TANH,
                              * SIGMOID); ACT: the stage's activation */
    int pool;                /* CONV: a 2x2 max-pool fused in */
    int param;               /* the parameterized layer's index (DENSE, CONV, NORM), else -1 */
    int first, last;         /* the layer specs it runs (FLATTENs between them included) */
    int in_width, out_width; /* flat features per row of its input and its output */
    dp_conv_geom g;          /* CONV: the convolution; POOL, AVGPOOL, GAP: g.C, g.H, g.W its
                              * input map */
    double rate;             /* DROPOUT */
    int skip;                /* RESEND: its RESBEGIN's stage (its output is the skip's source);
                              * RESBEGIN: its RESEND's stage */
    ptrdiff_t s_off;         /* BN: its running mean, then variance, in the model's state */
    int conv_h, conv_w;      /* CONV: the output block computed (all of it without pool) */
    ptrdiff_t w_off, b_off;  /* DENSE, CONV, NORM: where W and b start in the flat parameters */
} dp_stage;

typedef struct {
    int n_layers;
    dp_layer layer[DP_MODEL_MAX_LAYERS];
    int in_ndim, in_shape[3];          /* (C, H, W) or (F,) */
    int out_ndim[DP_MODEL_MAX_LAYERS]; /* each layer's output shape */
    int out_shape[DP_MODEL_MAX_LAYERS][3];
    int n_stages;
    dp_stage stage[DP_MODEL_MAX_LAYERS];
    int n_param_layers;                   /* P_L: DENSE, CONV and LAYERNORM layers */
    int param_stage[DP_MODEL_MAX_LAYERS]; /* parameterized layer k's stage */
    int param_spec[DP_MODEL_MAX_LAYERS];  /* ... and its index in the list */
    ptrdiff_t n_params;
    ptrdiff_t n_state; /* batch norms' running statistics: 2 C doubles each */
    int in_width, out_width;
    dp_loss loss;
    /* after DP_EVALUE: the layer at fault (-1: the input shape or the layer count; n_layers:
     * the loss against the output, or no parameterized layer) and why, in a few words */
    int bad_layer;
    const char *why;
} dp_plan;

typedef struct {
    dp_ctx ctx;      /* threads = 1: this thread's GEMM packing buffers */
    dp_scratch col;  /* im2col patches of one image */
    dp_scratch conv; /* one image's conv output block (fused blocks), or its gradient */
    dp_scratch grad; /* this thread's dW^T and db of one conv layer */
} dp_model_thread;

/* A batch norm's exchange (dp_model.exchange): buf (n doubles: per channel the batch's sums,
 * then the count) summed over the workers in place; 0, or nonzero where it failed. */
typedef int (*dp_model_exchange_fn)(void *ctx, double *buf, int n);

typedef struct {
    dp_plan plan;
    int threads;
    int eval_rows; /* rows per evaluate chunk: about 16 MiB of activations (a
                               * caller may lower it; the tests do, to get several chunks) */
    size_t col_elems, conv_elems, grad_elems; /* per-thread scratch of the conv stages */
    dp_ctx ctx;          /* thread pool and packing buffers of the dense stages */
    dp_model_thread *th; /* one per thread */
    dp_scratch acts;     /* every stage's output for `rows` rows (T) */
    dp_scratch codes;    /* pooling argmax codes (uint8) */
    dp_scratch grad_io;  /* two rows x max(out_width) buffers for the backward sweep */
    dp_scratch partials; /* a dense GEMM's K slices on a region (dp_gemm_part) */
    dp_scratch stats;    /* layer norms' (mean, rstd) per row, doubles */
    dp_scratch skips;    /* residual ends' gradients of the skip connection (backward) */
    dp_scratch bnrows;   /* a batch norm's per-row sums, then their totals */
    /* batch norms' running means and variances (plan.n_state doubles; means 0, variances 1
     * at init), updated by each training forward from the batch's statistics */
    double *state;
    /* the exchange of a batch norm's sums, forward and backward (NULL: this call's rows are
     * the batch) */
    dp_model_exchange_fn exchange;
    void *exchange_ctx;
    /* dropout's draws (dp_layers.h): the model's seed, the training step and the global index
     * of the batch's first row, set by the caller before forward_loss / loss_grad */
    uint64_t rng_seed;
    int64_t rng_step, rng_row0;
    int bad_row; /* after DP_ELABEL: the first row with a bad label */
    /* a backward sweep in progress (forward_loss, then backward_layer P_L - 1 .. 0) */
    int pending;      /* 1 while one is, whatever its rows */
    int pending_rows; /* its rows (0: a share of no rows, whose steps only exchange) */
    int next_layer;   /* the parameterized layer the next step must be */
    int d_second;     /* which grad_io half holds d(loss)/d(current output) */
    const void *pending_x;
} dp_model;

/* Checks the list and plans the stages (no allocation). DP_EVALUE with plan->bad_layer and
 * plan->why set: an unknown kind, a size < 1 or pad < 0, CONV or MAXPOOL2 on a flat input,
 * a kernel larger than the padded input, a pool on a map smaller than 2x2, a shape that does
 * not fit an int, a parameter count that overflows, more than DP_MODEL_MAX_LAYERS layers, no
 * DENSE or CONV layer, an unknown loss or one that does not fit the output width. */
int dp_model_plan(dp_plan *plan, const dp_layer *layers, int n_layers, const int *in_shape,
                  int in_ndim, dp_loss loss);
/* dp_model_plan into model->plan, then the contexts (threads clamped to [1,
 * DP_MAX_THREADS]). dp_model_free is safe after any failure. */
int dp_model_init(dp_model *model, const dp_layer *layers, int n_layers, const int *in_shape,
                  int in_ndim, dp_loss loss, int threads);
/* Mixed precision (float models only): 1 makes every GEMM of the model (dense and conv,
 * forward and backward) round its inputs to bfloat16 and accumulate in float; the parameters,
 * gradients and activations stay float (dp_ctx.bf16_inputs). After a successful init. */
void dp_model_set_bf16_inputs(dp_model *model, int on);
void dp_model_free(dp_model *model);

#define DP_DECLARE_MODEL(T, S)                                                                     \
    int dp_model_loss_grad##S(dp_model *model, T *grads, double *loss_sum, int64_t *correct,       \
                              const T *params, const T *x, const int64_t *labels,                  \
                              const T *targets, int B, T grad_scale);                              \
    int dp_model_forward_loss##S(dp_model *model, double *loss_sum, int64_t *correct,              \
                                 const T *params, const T *x, const int64_t *labels,               \
                                 const T *targets, int B, T grad_scale);                           \
    int dp_model_backward_layer##S(dp_model *model, T *grads, const T *params, int layer);         \
    int dp_model_evaluate##S(dp_model *model, T *out, double *loss_sum, int64_t *correct,          \
                             const T *params, const T *x, const int64_t *labels, const T *targets, \
                             int B);

/* The concrete symbols, for grep: dp_model_loss_grad_f32 dp_model_loss_grad_f64
 * dp_model_forward_loss_f32 dp_model_forward_loss_f64 dp_model_backward_layer_f32
 * dp_model_backward_layer_f64 dp_model_evaluate_f32 dp_model_evaluate_f64 */
DP_DECLARE_MODEL(float, _f32)
DP_DECLARE_MODEL(double, _f64)

#endif
