/* dp_layers.h - the per-sample layers of the model engine that are not a GEMM: 2x2 average
 * pooling, global average pooling, dropout and layer normalization (plain C99; the compiler
 * vectorizes the loops).
 *
 * Layout NCHW, a row per sample as in dp_model.h. Gradients dx are WRITTEN (=); the
 * parameter gradients of layer normalization ACCUMULATE (+=).
 *
 * - avgpool2: `planes` H x W planes to H/2 x W/2 (an odd last row or column dropped, as
 *   PyTorch's AvgPool2d(2)): y = (((x00 + x01) + x10) + x11) * 0.25; dx = dy * 0.25 at the
 *   window's four values, 0 on a dropped row or column.
 * - gap (global average pooling): `planes` planes of n values to one each, summed in double
 *   in order and divided by n, then rounded; dx = dy / n (in double, rounded) on every value.
 * - dropout: a counter-based draw, no state: the unit u of row r keeps its value, times
 *   1 / (1 - p), where dp_dropout_bits(key(r), u) >= dp_dropout_threshold(p), and is 0
 *   elsewhere; key(r) = dp_dropout_key(seed, step, row0 + r, layer). So a sample's mask is a
 *   function of (seed, step, its global index in the step's batch, the layer) alone: the
 *   same on any number of workers and threads. The mask is kept (one byte per value) for
 *   backward: dx = dy * mask * 1 / (1 - p).
 * - layernorm: per row of n values, mean and variance (biased) in double, rstd = 1 / sqrt(var
 *   + eps); y = xhat gamma + beta with xhat = (x - mean) rstd rounded to T; (mean, rstd) kept
 *   per row (two doubles). Backward: g = dy gamma, dx = rstd (g - mean(g) - xhat mean(g xhat))
 *   (the means in double); dgamma += sum over rows of dy xhat, dbeta += sum of dy, for the
 *   columns [c0, c1) (the engine splits them over its threads, each column summed in row
 *   order: the bits of one thread).
 */
#ifndef DP_LAYERS_H
#define DP_LAYERS_H

#include "dp_common.h"

#define DP_LAYERNORM_EPS 1e-5 /* PyTorch's nn.LayerNorm default */

/* The row key of a dropout draw, and the 32 bits of unit u (splitmix64's output sequence from
 * the key: the finalizer of key + (u + 1) golden). */
uint64_t dp_dropout_key(uint64_t seed, int64_t step, int64_t row, int layer);
uint32_t dp_dropout_bits(uint64_t key, int64_t unit);
/* The smallest kept draw: floor(p 2^32) (p in [0, 1)). */
uint32_t dp_dropout_threshold(double p);

#define DP_DECLARE_LAYERS(T, S)                                                                  \
    void dp_avgpool2_forward##S(T *y, const T *x, ptrdiff_t planes, int H, int W);               \
    void dp_avgpool2_backward##S(T *dx, const T *dy, ptrdiff_t planes, int H, int W);            \
    void dp_gap_forward##S(T *y, const T *x, ptrdiff_t planes, int n);                           \
    void dp_gap_backward##S(T *dx, const T *dy, ptrdiff_t planes, int n);                        \
    /* rows [0, rows) of width n; mask (rows, n) is written */                                   \
    void dp_dropout_forward##S(T *y, uint8_t *mask, const T *x, int rows, int n, double p,       \
                               uint64_t seed, int64_t step, int64_t row0, int layer);            \
    void dp_dropout_backward##S(T *dx, const T *dy, const uint8_t *mask, int rows, int n,        \
                                double p);                                                       \
    /* stats (rows, 2): mean, rstd */                                                            \
    void dp_layernorm_forward##S(T *y, double *stats, const T *x, const T *gamma, const T *beta, \
                                 int rows, int n);                                               \
    /* dx (rows, n), written; NULL: not computed */                                              \
    void dp_layernorm_backward_dx##S(T *dx, const T *dy, const T *x, const double *stats,        \
                                     const T *gamma, int rows, int n);                           \
    /* dgamma, dbeta += over rows [0, rows), columns [c0, c1) */                                 \
    void dp_layernorm_backward_params##S(T *dgamma, T *dbeta, const T *dy, const T *x,           \
                                         const double *stats, int rows, int n, int c0, int c1);

/* The concrete symbols, for grep: dp_avgpool2_forward_f32 dp_avgpool2_forward_f64
 * dp_avgpool2_backward_f32 dp_avgpool2_backward_f64 dp_gap_forward_f32 dp_gap_forward_f64
 * dp_gap_backward_f32 dp_gap_backward_f64 dp_dropout_forward_f32 dp_dropout_forward_f64
 * dp_dropout_backward_f32 dp_dropout_backward_f64 dp_layernorm_forward_f32
 * dp_layernorm_forward_f64 dp_layernorm_backward_dx_f32 dp_layernorm_backward_dx_f64
 * dp_layernorm_backward_params_f32 dp_layernorm_backward_params_f64 */
DP_DECLARE_LAYERS(float, _f32)
DP_DECLARE_LAYERS(double, _f64)

#endif
