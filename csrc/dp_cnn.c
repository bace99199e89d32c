/* dp_cnn.c - see dp_cnn.h: the layer plan, the contexts, and dp_cnn_tmpl.h for both dtypes. */
#include "dp_cnn.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* *off += n, or -1 when the flat layout would not fit a ptrdiff_t (each n < 2^62). */
static int grow(ptrdiff_t *off, ptrdiff_t n)
{
    if (*off > PTRDIFF_MAX - n) return -1;
    *off += n;
    return 0;
}

int dp_cnn_init(dp_cnn *net, int C, int H, int W, const int *channels, int n_conv, int kernel,
                int pad, const int *dense, int n_dense, int threads)
{
    memset(net, 0, sizeof *net);
    net->bad_layer = -1;
    if (n_conv < 0 || n_conv > DP_CNN_MAX_CONV || n_dense < 1 || n_dense > DP_CNN_MAX_DENSE)
        return DP_EVALUE;
    net->n_conv = n_conv;
    net->n_dense = n_dense;
    net->n_layers = n_conv + n_dense;
    if ((long long)C * H * W > INT_MAX || C < 1 || H < 1 || W < 1) {
        net->bad_layer = 0;
        return DP_EVALUE;
    }
    net->width[0] = C * H * W;
    ptrdiff_t off = 0;
    for (int l = 0; l < n_conv; l++) {
        dp_conv_geom *g = &net->conv[l];
        g->C = C; g->H = H; g->W = W;
        g->OC = channels[l]; g->KH = kernel; g->KW = kernel; g->pad = pad;
        net->bad_layer = l;
        int OH, OW;
        if (dp_conv_out(g, &OH, &OW)) return DP_EVALUE;
        if (OH < 2 || OW < 2) return DP_EVALUE;   /* nothing to pool */
        C = g->OC;
        H = OH / 2;
        W = OW / 2;
        net->conv_h[l] = 2 * H;
        net->conv_w[l] = 2 * W;
        net->width[l + 1] = C * H * W;
        net->w_off[l] = off;
        if (grow(&off, (ptrdiff_t)g->OC * g->C * kernel * kernel)) return DP_EVALUE;
        net->b_off[l] = off;
        if (grow(&off, g->OC)) return DP_EVALUE;
    }
    for (int j = 0; j < n_dense; j++) {
        int l = n_conv + j;
        net->bad_layer = l;
        if (dense[j] < 1 || (j == n_dense - 1 && dense[j] < 2)) return DP_EVALUE;
        net->width[l + 1] = dense[j];
        net->w_off[l] = off;
        if (grow(&off, (ptrdiff_t)dense[j] * net->width[l])) return DP_EVALUE;
        net->b_off[l] = off;
        if (grow(&off, dense[j])) return DP_EVALUE;
    }
    net->bad_layer = -1;
    net->n_params = off;
    if (threads < 1) threads = 1;
    if (threads > DP_MAX_THREADS) threads = DP_MAX_THREADS;
    net->threads = threads;
    net->th = calloc((size_t)threads, sizeof *net->th);
    if (!net->th) return DP_ENOMEM;
    for (int t = 0; t < threads; t++) {
        int rc = dp_ctx_init(&net->th[t].ctx, 1);
        if (rc) return rc;
    }
    return dp_ctx_init(&net->ctx, threads);
}

void dp_cnn_free(dp_cnn *net)
{
    dp_ctx_free(&net->ctx);
    if (net->th) {
        for (int t = 0; t < net->threads; t++) {
            dp_ctx_free(&net->th[t].ctx);
            dp_scratch_free(&net->th[t].col);
            dp_scratch_free(&net->th[t].conv);
            dp_scratch_free(&net->th[t].grad);
        }
        free(net->th);
        net->th = NULL;
    }
    dp_scratch_free(&net->acts);
    dp_scratch_free(&net->codes);
    dp_scratch_free(&net->grad_io);
}

#define T float
#define S _f32
#include "dp_cnn_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_cnn_tmpl.h"
#undef S
#undef T
