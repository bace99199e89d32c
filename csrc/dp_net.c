/* dp_net.c - see dp_net.h; instantiates dp_net_tmpl.h for float and double. */
#include "dp_net.h"

#include <string.h>

ptrdiff_t dp_net_param_count(const int *sizes, int n_layers)
{
    if (n_layers < 1 || n_layers > DP_MAX_LAYERS) return -1;
    ptrdiff_t p = 0;
    for (int l = 0; l <= n_layers; l++)
        if (sizes[l] < 1) return -1;
    for (int l = 0; l < n_layers; l++) {
        /* OUT * (IN + 1) fits (both < 2^31); only the running sum can overflow */
        ptrdiff_t layer = (ptrdiff_t)sizes[l + 1] * ((ptrdiff_t)sizes[l] + 1);
        if (p > PTRDIFF_MAX - layer) return -1;
        p += layer;
    }
    return p;
}

int dp_net_init(dp_net *net, const int *sizes, int n_layers, dp_loss loss, int threads)
{
    memset(net, 0, sizeof *net);
    ptrdiff_t p = dp_net_param_count(sizes, n_layers);
    if (p < 0) return DP_EVALUE;
    if (loss != DP_LOSS_SOFTMAX_XENT && loss != DP_LOSS_SIGMOID_BCE) return DP_EVALUE;
    if (loss == DP_LOSS_SIGMOID_BCE && sizes[n_layers] != 1) return DP_EVALUE;
    if (loss == DP_LOSS_SOFTMAX_XENT && sizes[n_layers] < 2) return DP_EVALUE;
    net->n_layers = n_layers;
    net->loss = loss;
    net->n_params = p;
    ptrdiff_t off = 0;
    for (int l = 0; l <= n_layers; l++) net->sizes[l] = sizes[l];
    for (int l = 0; l < n_layers; l++) {
        net->w_off[l] = off;
        off += (ptrdiff_t)sizes[l + 1] * sizes[l];
        net->b_off[l] = off;
        off += sizes[l + 1];
    }
    return dp_ctx_init(&net->ctx, threads);
}

void dp_net_free(dp_net *net)
{
    dp_ctx_free(&net->ctx);
    dp_scratch_free(&net->acts);
    dp_scratch_free(&net->grad_io);
}

#define T float
#define S _f32
#include "dp_net_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_net_tmpl.h"
#undef S
#undef T
