/* dp_net_tmpl.h - dp_net forward/backward for one dtype (T, S defined by dp_net.c). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* Rows evaluated per chunk: bounds the activation scratch whatever the data set's size. */
#define EVAL_ROWS 1024

/* Makes room for `rows` rows of activations; returns the layers' output pointers. */
static int K(net_buffers)(dp_net *net, int rows, T **out, T **g0, T **g1)
{
    ptrdiff_t width = 0, widest = 0;
    for (int l = 0; l < net->n_layers; l++) {
        width += net->sizes[l + 1];
        if (net->sizes[l + 1] > widest) widest = net->sizes[l + 1];
    }
    T *acts = dp_scratch_get(&net->acts, sizeof(T) * (size_t)rows * (size_t)width);
    T *gio = dp_scratch_get(&net->grad_io, sizeof(T) * 2 * (size_t)rows * (size_t)widest);
    if (!acts || !gio) return DP_ENOMEM;
    for (int l = 0; l < net->n_layers; l++) {
        out[l] = acts;
        acts += (ptrdiff_t)rows * net->sizes[l + 1];
    }
    *g0 = gio;
    *g1 = gio + (ptrdiff_t)rows * widest;
    return DP_OK;
}

/* Forward through every layer; out[L-1] holds the logits (B, OUT_last). */
static int K(net_forward)(dp_net *net, T **out, const T *params, const T *x, int B)
{
    const T *h = x;
    for (int l = 0; l < net->n_layers; l++) {
        int IN = net->sizes[l], OUT = net->sizes[l + 1];
        int rc = K(dp_dense_forward)(&net->ctx, out[l], h, params + net->w_off[l],
                                     params + net->b_off[l], B, IN, OUT);
        if (rc) return rc;
        if (l + 1 < net->n_layers) K(dp_relu_forward)(out[l], out[l], (ptrdiff_t)B * OUT);
        h = out[l];
    }
    return DP_OK;
}

static int K(net_loss)(dp_net *net, T *dlogits, double *loss_sum, int64_t *correct,
                       const T *logits, const int64_t *labels, int B, T grad_scale)
{
    int C = net->sizes[net->n_layers];
    int rc = net->loss == DP_LOSS_SOFTMAX_XENT
                 ? K(dp_softmax_xent)(dlogits, loss_sum, logits, labels, B, C, grad_scale)
                 : K(dp_sigmoid_bce)(dlogits, loss_sum, logits, labels, B, grad_scale);
    if (rc) return rc;
    return K(dp_count_correct)(correct, logits, labels, B, C);
}

int K(dp_net_loss_grad)(dp_net *net, T *grads, double *loss_sum, int64_t *correct,
                        const T *params, const T *x, const int64_t *labels, int B, T grad_scale)
{
    // x is (B, sizes[0]); grads and params are (P,); grads accumulate
    // d(grad_scale * sum_i loss_i) / d params
    net->pending_rows = 0;   /* a whole sweep: one in progress ends here, on every path */
    if (B <= 0) { *loss_sum = 0; *correct = 0; return DP_OK; }
    int L = net->n_layers;
    if (L == 1 && net->sizes[1] == 1 && net->loss == DP_LOSS_SIGMOID_BCE)
        /* logistic regression: a GEMM with one output column wastes the micro-kernel;
         * the fused kernel reads x once */
        return K(dp_logistic_grad)(grads + net->w_off[0], grads + net->b_off[0], loss_sum,
                                   correct, x, params + net->w_off[0], params + net->b_off[0],
                                   labels, B, net->sizes[0], grad_scale);
    int rc = K(dp_net_forward_loss)(net, loss_sum, correct, params, x, labels, B, grad_scale);
    for (int l = L - 1; l >= 0 && rc == DP_OK; l--) rc = K(dp_net_backward_layer)(net, grads, params, l);
    return rc;
}

int K(dp_net_forward_loss)(dp_net *net, double *loss_sum, int64_t *correct, const T *params,
                           const T *x, const int64_t *labels, int B, T grad_scale)
{
    // x is (B, sizes[0]): forward and loss; d(grad_scale * loss)/d(logits) is kept for the
    // backward steps that follow
    net->pending_rows = 0;
    if (B <= 0) { *loss_sum = 0; *correct = 0; return DP_OK; }
    T *out[DP_MAX_LAYERS], *d, *dnext;
    int L = net->n_layers;
    int rc = K(net_buffers)(net, B, out, &d, &dnext);
    if (rc) return rc;
    rc = K(net_forward)(net, out, params, x, B);
    if (rc) return rc;
    rc = K(net_loss)(net, d, loss_sum, correct, out[L - 1], labels, B, grad_scale);
    if (rc) return rc;
    net->pending_rows = B;
    net->pending_x = x;
    net->next_layer = L - 1;
    net->d_second = 0;
    return DP_OK;
}

int K(dp_net_backward_layer)(dp_net *net, T *grads, const T *params, int layer)
{
    // one step of the backward sweep: layer's dW, db accumulate into grads, and the gradient
    // w.r.t. its input (through the ReLU) is left for layer - 1
    int B = net->pending_rows;
    if (B == 0 || layer != net->next_layer) return DP_EORDER;
    T *out[DP_MAX_LAYERS], *g0, *g1;
    int rc = K(net_buffers)(net, B, out, &g0, &g1);   /* the same scratch: no allocation */
    if (rc) return rc;
    T *d = net->d_second ? g1 : g0, *dnext = net->d_second ? g0 : g1;
    int IN = net->sizes[layer], OUT = net->sizes[layer + 1];
    const T *h = layer > 0 ? out[layer - 1] : (const T *)net->pending_x;
    rc = K(dp_dense_backward)(&net->ctx, grads + net->w_off[layer], grads + net->b_off[layer],
                              layer > 0 ? dnext : NULL, d, h, params + net->w_off[layer], B, IN,
                              OUT);
    if (rc) return rc;
    if (layer > 0) {
        K(dp_relu_backward)(dnext, dnext, out[layer - 1], (ptrdiff_t)B * IN);
        net->d_second = !net->d_second;
    }
    net->next_layer = layer - 1;
    if (layer == 0) net->pending_rows = 0;
    return DP_OK;
}

int K(dp_net_evaluate)(dp_net *net, T *logits, double *loss_sum, int64_t *correct,
                       const T *params, const T *x, const int64_t *labels, int B)
{
    // x is (B, sizes[0]); logits (B, OUT) is optional, labels optional (then no loss/correct)
    int L = net->n_layers, IN0 = net->sizes[0], C = net->sizes[L];
    double total = 0;
    int64_t right = 0;
    net->pending_rows = 0;     /* the scratch is reused: a sweep in progress is abandoned */
    for (int r0 = 0; r0 < B; r0 += EVAL_ROWS) {
        int rows = B - r0 < EVAL_ROWS ? B - r0 : EVAL_ROWS;
        T *out[DP_MAX_LAYERS], *g0, *g1;
        int rc = K(net_buffers)(net, rows, out, &g0, &g1);
        if (rc) return rc;
        rc = K(net_forward)(net, out, params, x + (ptrdiff_t)r0 * IN0, rows);
        if (rc) return rc;
        if (labels) {
            double part;
            int64_t ok;
            rc = K(net_loss)(net, NULL, &part, &ok, out[L - 1], labels + r0, rows, (T)1);
            if (rc) return rc;
            total += part;
            right += ok;
        }
        if (logits)
            memcpy(logits + (ptrdiff_t)r0 * C, out[L - 1], sizeof(T) * (size_t)rows * (size_t)C);
    }
    *loss_sum = total;
    *correct = right;
    return DP_OK;
}

#undef K
