/* dp_cnn_tmpl.h - dp_cnn forward/backward for one dtype (T, S defined by dp_cnn.c). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* Rows evaluated per chunk: bounds the activation scratch whatever the data set's size. */
#define CNN_EVAL_ROWS 256

typedef struct {
    T *out[DP_CNN_MAX_LAYERS];         /* layer outputs, (rows, width[l + 1]) */
    uint8_t *code[DP_CNN_MAX_CONV];    /* conv layers' argmax codes, like their outputs */
    T *g0, *g1;                        /* the backward ping-pong buffers */
} K(cnn_bufs);

/* Makes room for `rows` rows (the network's and every thread's scratch) and returns where the
 * layers' buffers are. Growing only: the same rows again allocates nothing. */
static int K(cnn_buffers)(dp_cnn *net, int rows, K(cnn_bufs) *bf)
{
    size_t width = 0, widest = 0, coded = 0;
    for (int l = 0; l < net->n_layers; l++) {
        width += (size_t)net->width[l + 1];
        if ((size_t)net->width[l + 1] > widest) widest = (size_t)net->width[l + 1];
        if (l < net->n_conv) coded += (size_t)net->width[l + 1];
    }
    T *acts = dp_scratch_get(&net->acts, sizeof(T) * (size_t)rows * width);
    uint8_t *codes = dp_scratch_get(&net->codes, (size_t)rows * (coded ? coded : 1));
    T *gio = dp_scratch_get(&net->grad_io, sizeof(T) * 2 * (size_t)rows * widest);
    if (!acts || !codes || !gio) return DP_ENOMEM;
    size_t col = 1, conv = 1, grad = 1;
    for (int l = 0; l < net->n_conv; l++) {
        const dp_conv_geom *g = &net->conv[l];
        /* the block's patches (needed even for a 1x1 kernel when the block is cropped) */
        size_t o = (size_t)g->OC * net->conv_h[l] * net->conv_w[l];
        size_t c = (size_t)g->C * g->KH * g->KW * net->conv_h[l] * net->conv_w[l] +
                   DP_CONV_COL_SLACK(g);
        size_t p = (size_t)g->OC * g->C * g->KH * g->KW + (size_t)g->OC;
        if (c > col) col = c;
        if (o > conv) conv = o;
        if (p > grad) grad = p;
    }
    for (int t = 0; t < net->threads; t++) {
        dp_cnn_thread *th = &net->th[t];
        if (net->n_conv && (!dp_scratch_get(&th->col, sizeof(T) * col) ||
                            !dp_scratch_get(&th->conv, sizeof(T) * conv) ||
                            !dp_scratch_get(&th->grad, sizeof(T) * grad)))
            return DP_ENOMEM;
    }
    for (int l = 0; l < net->n_layers; l++) {
        bf->out[l] = acts;
        acts += (ptrdiff_t)rows * net->width[l + 1];
        if (l < net->n_conv) {
            bf->code[l] = codes;
            codes += (ptrdiff_t)rows * net->width[l + 1];
        }
    }
    bf->g0 = gio;
    bf->g1 = gio + (ptrdiff_t)rows * (ptrdiff_t)widest;
    return DP_OK;
}

/* One conv layer over a batch, its images split over the threads. */
typedef struct {
    dp_cnn *net;
    int layer, rows;
    const T *in;          /* (rows, width[layer]) */
    T *out;               /* (rows, width[layer + 1]): pooled, biased, ReLU'd */
    uint8_t *code;        /* like out */
    const T *params;
    /* backward only */
    T *d;                 /* d loss / d out (masked by the ReLU here, in place) */
    T *dnext;             /* d loss / d in (written), or NULL */
    T *grads;
    int rc[DP_MAX_THREADS];
} K(conv_job);

/* y (OC, n) = relu(y + b[o] in row o); relu_forward's rule: a NaN stays NaN. */
DP_CLONES static void K(bias_relu)(T *y, const T *b, int OC, int n)
{
    for (int o = 0; o < OC; o++) {
        T *DP_RESTRICT r = y + (ptrdiff_t)o * n, bo = b[o];
        for (int q = 0; q < n; q++) {
            T v = r[q] + bo;
            r[q] = v <= 0 ? (T)0 : v;
        }
    }
}

/* db[o] += sum of row o of d (OC, n), in 8 interleaved partial sums (the compiler may not
 * reorder one float sum into vector lanes, but 8 independent ones are a vector) */
DP_CLONES static void K(add_row_sums)(T *db, const T *d, int OC, int n)
{
    for (int o = 0; o < OC; o++) {
        const T *r = d + (ptrdiff_t)o * n;
        T a[8] = {0};
        int q = 0;
        for (; q + 8 <= n; q += 8)
            for (int k = 0; k < 8; k++) a[k] += r[q + k];
        T s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (; q < n; q++) s += r[q];
        db[o] += s;
    }
}

DP_INLINE void K(image_range)(int rows, int t, int n, int *lo, int *hi)
{
    *lo = (int)((long long)rows * t / n);
    *hi = (int)((long long)rows * (t + 1) / n);
}

static void K(conv_forward_task)(void *arg, int t, int n)
{
    K(conv_job) *job = arg;
    dp_cnn *net = job->net;
    dp_cnn_thread *th = &net->th[t];
    int l = job->layer, lo, hi;
    const dp_conv_geom *g = &net->conv[l];
    int CH = net->conv_h[l], CW = net->conv_w[l], PHW = (CH / 2) * (CW / 2);
    int win = net->width[l], wout = net->width[l + 1];
    const T *w = job->params + net->w_off[l], *b = job->params + net->b_off[l];
    T *col = th->col.ptr, *conv = th->conv.ptr;
    K(image_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    for (int i = lo; i < hi; i++) {
        int rc = K(dp_conv_image_forward)(&th->ctx, col, conv, job->in + (ptrdiff_t)i * win, w,
                                          g, CH, CW, (T)0);
        if (rc) { job->rc[t] = rc; return; }
        T *y = job->out + (ptrdiff_t)i * wout;
        K(dp_maxpool2_forward)(y, job->code + (ptrdiff_t)i * wout, conv, g->OC, CH, CW);
        K(bias_relu)(y, b, g->OC, PHW);
    }
}

static void K(conv_backward_task)(void *arg, int t, int n)
{
    K(conv_job) *job = arg;
    dp_cnn *net = job->net;
    dp_cnn_thread *th = &net->th[t];
    int l = job->layer, lo, hi;
    const dp_conv_geom *g = &net->conv[l];
    int CH = net->conv_h[l], CW = net->conv_w[l], PHW = (CH / 2) * (CW / 2);
    int win = net->width[l], wout = net->width[l + 1];
    ptrdiff_t nw = (ptrdiff_t)g->OC * g->C * g->KH * g->KW;
    const T *w = job->params + net->w_off[l];
    K(image_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    /* this thread's dw^T (K, OC) and db, summed over its images; added into grads after */
    T *dwt = th->grad.ptr, *db = dwt + nw;
    memset(dwt, 0, sizeof(T) * (size_t)(nw + g->OC));
    T *col = th->col.ptr, *dconv = th->conv.ptr;
    for (int i = lo; i < hi; i++) {
        T *d = job->d + (ptrdiff_t)i * wout;
        K(dp_relu_backward)(d, d, job->out + (ptrdiff_t)i * wout, wout);
        K(add_row_sums)(db, d, g->OC, PHW);
        K(dp_maxpool2_backward)(dconv, d, job->code + (ptrdiff_t)i * wout, g->OC, CH, CW);
        int rc = K(dp_conv_image_backward)(&th->ctx, col, dwt,
                                           job->dnext ? job->dnext + (ptrdiff_t)i * win : NULL,
                                           dconv, job->in + (ptrdiff_t)i * win, w, g, CH, CW);
        if (rc) { job->rc[t] = rc; return; }
    }
}

/* Runs a conv job on every thread; the first failing thread's code, or DP_OK. */
static int K(run_conv)(dp_cnn *net, K(conv_job) *job, dp_task_fn fn)
{
    int n = net->threads;
    dp_threads_run(net->ctx.team, n, fn, job);
    for (int t = 0; t < n; t++)
        if (job->rc[t]) return job->rc[t];
    return DP_OK;
}

/* Forward through every layer; out[L-1] holds the logits (B, classes). */
static int K(cnn_forward)(dp_cnn *net, K(cnn_bufs) *bf, const T *params, const T *x, int B)
{
    const T *h = x;
    for (int l = 0; l < net->n_layers; l++) {
        int rc;
        if (l < net->n_conv) {
            K(conv_job) job = {.net = net, .layer = l, .rows = B, .in = h, .out = bf->out[l],
                               .code = bf->code[l], .params = params};
            rc = K(run_conv)(net, &job, K(conv_forward_task));
        } else {
            int IN = net->width[l], OUT = net->width[l + 1];
            rc = K(dp_dense_forward)(&net->ctx, bf->out[l], h, params + net->w_off[l],
                                     params + net->b_off[l], B, IN, OUT);
            if (rc == DP_OK && l + 1 < net->n_layers)
                K(dp_relu_forward)(bf->out[l], bf->out[l], (ptrdiff_t)B * OUT);
        }
        if (rc) return rc;
        h = bf->out[l];
    }
    return DP_OK;
}

static int K(cnn_loss)(dp_cnn *net, T *dlogits, double *loss_sum, int64_t *correct,
                       const T *logits, const int64_t *labels, int B, T grad_scale)
{
    int C = net->width[net->n_layers];
    int rc = K(dp_softmax_xent)(dlogits, loss_sum, logits, labels, B, C, grad_scale);
    if (rc) return rc;
    return K(dp_count_correct)(correct, logits, labels, B, C);
}

int K(dp_cnn_forward_loss)(dp_cnn *net, double *loss_sum, int64_t *correct, const T *params,
                           const T *x, const int64_t *labels, int B, T grad_scale)
{
    // x is (B, width[0]): forward and loss; d(grad_scale * loss)/d(logits) is kept for the
    // backward steps that follow
    net->pending_rows = 0;
    if (B <= 0) { *loss_sum = 0; *correct = 0; return DP_OK; }
    K(cnn_bufs) bf;
    int rc = K(cnn_buffers)(net, B, &bf);
    if (rc) return rc;
    rc = K(cnn_forward)(net, &bf, params, x, B);
    if (rc) return rc;
    rc = K(cnn_loss)(net, bf.g0, loss_sum, correct, bf.out[net->n_layers - 1], labels, B,
                     grad_scale);
    if (rc) return rc;
    net->pending_rows = B;
    net->pending_x = x;
    net->next_layer = net->n_layers - 1;
    net->d_second = 0;
    return DP_OK;
}

int K(dp_cnn_backward_layer)(dp_cnn *net, T *grads, const T *params, int layer)
{
    // one step of the backward sweep: the layer's dW, db accumulate into grads, and
    // d(loss)/d(its input) is left for layer - 1 (not computed for layer 0)
    int B = net->pending_rows;
    if (B == 0 || layer != net->next_layer) return DP_EORDER;
    K(cnn_bufs) bf;
    int rc = K(cnn_buffers)(net, B, &bf);   /* the same scratch: no allocation */
    if (rc) return rc;
    T *d = net->d_second ? bf.g1 : bf.g0, *dnext = net->d_second ? bf.g0 : bf.g1;
    const T *h = layer > 0 ? bf.out[layer - 1] : (const T *)net->pending_x;
    int last = layer == net->n_layers - 1;
    if (layer < net->n_conv) {
        K(conv_job) job = {.net = net, .layer = layer, .rows = B, .in = h, .out = bf.out[layer],
                           .code = bf.code[layer], .params = params, .d = d,
                           .dnext = layer > 0 ? dnext : NULL, .grads = grads};
        rc = K(run_conv)(net, &job, K(conv_backward_task));
        if (rc) return rc;
        /* the threads' partials, in thread order */
        const dp_conv_geom *g = &net->conv[layer];
        ptrdiff_t nw = (ptrdiff_t)g->OC * g->C * g->KH * g->KW;
        T *dw = grads + net->w_off[layer], *db = grads + net->b_off[layer];
        for (int t = 0; t < net->threads; t++) {
            int lo, hi;
            K(image_range)(B, t, net->threads, &lo, &hi);
            if (lo >= hi) continue;
            const T *dwt = net->th[t].grad.ptr;
            K(dp_conv_add_dwt)(dw, dwt, g);
            for (int o = 0; o < g->OC; o++) db[o] += dwt[nw + o];
        }
    } else {
        int IN = net->width[layer], OUT = net->width[layer + 1];
        if (!last) K(dp_relu_backward)(d, d, bf.out[layer], (ptrdiff_t)B * OUT);
        rc = K(dp_dense_backward)(&net->ctx, grads + net->w_off[layer],
                                  grads + net->b_off[layer], layer > 0 ? dnext : NULL, d, h,
                                  params + net->w_off[layer], B, IN, OUT);
        if (rc) return rc;
    }
    if (layer > 0) net->d_second = !net->d_second;
    net->next_layer = layer - 1;
    if (layer == 0) net->pending_rows = 0;
    return DP_OK;
}

int K(dp_cnn_loss_grad)(dp_cnn *net, T *grads, double *loss_sum, int64_t *correct,
                        const T *params, const T *x, const int64_t *labels, int B, T grad_scale)
{
    // x is (B, width[0]); grads and params are (P,); grads accumulate
    // d(grad_scale * sum_i loss_i) / d params
    int rc = K(dp_cnn_forward_loss)(net, loss_sum, correct, params, x, labels, B, grad_scale);
    for (int l = net->n_layers - 1; l >= 0 && rc == DP_OK && net->pending_rows; l--)
        rc = K(dp_cnn_backward_layer)(net, grads, params, l);
    net->pending_rows = 0;
    return rc;
}

int K(dp_cnn_evaluate)(dp_cnn *net, T *logits, double *loss_sum, int64_t *correct,
                       const T *params, const T *x, const int64_t *labels, int B)
{
    // x is (B, width[0]); logits (B, classes) optional, labels optional (then no loss/correct)
    int L = net->n_layers, IN0 = net->width[0], C = net->width[L];
    double total = 0;
    int64_t right = 0;
    net->pending_rows = 0;     /* the scratch is reused: a sweep in progress is abandoned */
    for (int r0 = 0; r0 < B; r0 += CNN_EVAL_ROWS) {
        int rows = B - r0 < CNN_EVAL_ROWS ? B - r0 : CNN_EVAL_ROWS;
        K(cnn_bufs) bf;
        int rc = K(cnn_buffers)(net, rows, &bf);
        if (rc) return rc;
        rc = K(cnn_forward)(net, &bf, params, x + (ptrdiff_t)r0 * IN0, rows);
        if (rc) return rc;
        if (labels) {
            double part;
            int64_t ok;
            rc = K(cnn_loss)(net, NULL, &part, &ok, bf.out[L - 1], labels + r0, rows, (T)1);
            if (rc) return rc;
            total += part;
            right += ok;
        }
        if (logits)
            memcpy(logits + (ptrdiff_t)r0 * C, bf.out[L - 1], sizeof(T) * (size_t)rows * (size_t)C);
    }
    *loss_sum = total;
    *correct = right;
    return DP_OK;
}

#undef CNN_EVAL_ROWS
#undef K
