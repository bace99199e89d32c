/* dp_model_tmpl.h - dp_model's forward, loss and backward sweep for one dtype (T, S defined by
 * dp_model.c). A conv stage's task runs one thread's share of the batch image by image (im2col
 * and GEMM on the thread's own context and buffers, then the optional fused pool, the bias and
 * an output-derived activation); its backward sums the thread's dW^T and db on the side, added
 * into the gradient in thread order. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

typedef struct {
    T *out[DP_MODEL_MAX_LAYERS];        /* stage outputs, (rows, out_width) */
    uint8_t *code[DP_MODEL_MAX_LAYERS]; /* pooling stages' argmax codes, dropout's masks, like
                                         * their outputs */
    double *stats[DP_MODEL_MAX_LAYERS]; /* NORM stages' (mean, rstd) per row */
    T *skip[DP_MODEL_MAX_LAYERS];       /* RESEND stages: d loss / d skip source (backward) */
    double *bnrows; /* a BN stage's per-row sums (rows, 2 C), then its totals (2 C) and count */
    T *g0, *g1;     /* the backward ping-pong buffers (NULL: evaluate) */
    T *partials;    /* a dense GEMM's K slices (dp_gemm_part), or NULL */
} K(model_bufs);

DP_INLINE int K(has_codes)(const dp_stage *st)
{
    return st->op == DP_STAGE_POOL || st->op == DP_STAGE_DROPOUT ||
           (st->op == DP_STAGE_CONV && st->pool);
}

/* Makes room for `rows` rows (the model's and every thread's scratch) and returns where the
 * stages' buffers are. Growing only: the same rows again allocates nothing. */
static int K(model_buffers)(dp_model *m, int rows, K(model_bufs) * bf, int with_grad)
{
    const dp_plan *p = &m->plan;
    size_t width = 0, widest = 0, coded = 0, norms = 0, skips = 0, bnstats = 0, bnrows = 0;
    for (int s = 0; s < p->n_stages; s++) {
        size_t w = (size_t)p->stage[s].out_width;
        width += w;
        if (w > widest) widest = w;
        if (K(has_codes)(&p->stage[s])) coded += w;
        if (p->stage[s].op == DP_STAGE_NORM) norms++;
        if (p->stage[s].op == DP_STAGE_RESEND)
            skips += (size_t)p->stage[p->stage[s].skip].out_width;
        if (p->stage[s].op == DP_STAGE_BN) {
            size_t C = (size_t)p->stage[s].g.C;
            bnstats += 3 * C + 1;
            /* the rows' sums, then the totals and the count, then the conv's bias sums
             * (bn_rsum_at: rows C of T, in as many doubles) */
            size_t need = ((size_t)rows + 1) * 2 * C + 1 + (size_t)rows * C;
            if (need > bnrows) bnrows = need;
        }
    }
    /* sizes that would overflow a size_t: no allocation could hold them */
    if (width > SIZE_MAX / sizeof(T) / 2 / (size_t)rows || m->col_elems > SIZE_MAX / sizeof(T) ||
        m->conv_elems > SIZE_MAX / sizeof(T) || m->grad_elems > SIZE_MAX / sizeof(T))
        return DP_ENOMEM;
    T *acts = dp_scratch_get(&m->acts, sizeof(T) * (size_t)rows * width);
    uint8_t *codes = dp_scratch_get(&m->codes, (size_t)rows * (coded ? coded : 1));
    double *stats =
        dp_scratch_get(&m->stats, sizeof(double) * (2 * (size_t)rows * norms + bnstats + 1));
    bf->bnrows = bnrows ? dp_scratch_get(&m->bnrows, sizeof(double) * bnrows) : NULL;
    T *gio = NULL, *skip = NULL;
    if (with_grad) gio = dp_scratch_get(&m->grad_io, sizeof(T) * 2 * (size_t)rows * widest);
    if (with_grad && skips) skip = dp_scratch_get(&m->skips, sizeof(T) * (size_t)rows * skips);
    if (!acts || !codes || !stats || (bnrows && !bf->bnrows) ||
        (with_grad && (!gio || (skips && !skip))))
        return DP_ENOMEM;
    /* the dense stages' GEMMs cut along K on a region (dp_gemm_part): forward and dW */
    size_t partials = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const dp_stage *st = &p->stage[s];
        if (st->op != DP_STAGE_DENSE) continue;
        size_t f = K(dp_gemm_part_scratch)(m->threads, rows, st->out_width, st->in_width, 1, 1);
        size_t w =
            with_grad ? K(dp_gemm_part_scratch)(m->threads, st->out_width, st->in_width, rows, 1, 1)
                      : 0;
        if (f > partials) partials = f;
        if (w > partials) partials = w;
    }
    bf->partials = NULL;
    if (partials && partials > SIZE_MAX / sizeof(T)) return DP_ENOMEM;
    if (partials && !(bf->partials = dp_scratch_get(&m->partials, sizeof(T) * partials)))
        return DP_ENOMEM;
    for (int t = 0; t < m->threads; t++) {
        dp_model_thread *th = &m->th[t];
        if (!dp_scratch_get(&th->col, sizeof(T) * m->col_elems) ||
            !dp_scratch_get(&th->conv, sizeof(T) * m->conv_elems) ||
            !dp_scratch_get(&th->grad, sizeof(T) * m->grad_elems))
            return DP_ENOMEM;
    }
    for (int s = 0; s < p->n_stages; s++) {
        const dp_stage *st = &p->stage[s];
        if (st->op == DP_STAGE_RESBEGIN && s > 0) {
            /* a residual block's source is its input, in place: no copy of it (the stage
             * before is done with its buffer, which no stage writes again) */
            bf->out[s] = bf->out[s - 1];
        } else {
            bf->out[s] = acts;
            acts += (ptrdiff_t)rows * st->out_width;
        }
        bf->code[s] = NULL;
        if (K(has_codes)(st)) {
            bf->code[s] = codes;
            codes += (ptrdiff_t)rows * st->out_width;
        }
        bf->stats[s] = NULL;
        if (st->op == DP_STAGE_NORM) {
            bf->stats[s] = stats;
            stats += (ptrdiff_t)rows * 2;
        }
        if (st->op == DP_STAGE_BN) { /* (mean, rstd) per channel, the count, the variances */
            bf->stats[s] = stats;
            stats += 3 * (ptrdiff_t)st->g.C + 1;
        }
        bf->skip[s] = NULL;
        if (st->op == DP_STAGE_RESEND && skip) {
            bf->skip[s] = skip;
            skip += (ptrdiff_t)rows * p->stage[st->skip].out_width;
        }
    }
    bf->g0 = gio;
    bf->g1 = gio ? gio + (ptrdiff_t)rows * (ptrdiff_t)widest : NULL;
    return DP_OK;
}

/* ---- activations by kind --------------------------------------------------------------- */

/* y = act(x), n values; y may be x */
static void K(act_forward)(dp_act act, T *y, const T *x, ptrdiff_t n)
{
    switch (act) {
    case DP_ACT_RELU: K(dp_relu_forward)(y, x, n); break;
    case DP_ACT_TANH: K(dp_tanh_forward)(y, x, n); break;
    case DP_ACT_SIGMOID: K(dp_sigmoid_forward)(y, x, n); break;
    case DP_ACT_GELU: K(dp_gelu_forward)(y, x, n); break;
    case DP_ACT_NONE:
        if (y != x) memcpy(y, x, sizeof(T) * (size_t)n);
        break;
    }
}

/* dx = dy act'(.), from the forward output y (RELU, TANH, SIGMOID) or input x (GELU); dx may
 * be dy */
static void K(act_backward)(dp_act act, T *dx, const T *dy, const T *y, const T *x, ptrdiff_t n)
{
    switch (act) {
    case DP_ACT_RELU: K(dp_relu_backward)(dx, dy, y, n); break;
    case DP_ACT_TANH: K(dp_tanh_backward)(dx, dy, y, n); break;
    case DP_ACT_SIGMOID: K(dp_sigmoid_backward)(dx, dy, y, n); break;
    case DP_ACT_GELU: K(dp_gelu_backward)(dx, dy, x, n); break;
    case DP_ACT_NONE:
        if (dx != dy) memcpy(dx, dy, sizeof(T) * (size_t)n);
        break;
    }
}

static void K(bias_act)(T *y, const T *b, int OC, int n, dp_act act)
{
    if (act == DP_ACT_RELU) {
        K(dp_bias_relu)(y, b, OC, n);
        return;
    }
    K(dp_bias_add)(y, b, OC, n);
    if (act != DP_ACT_NONE) K(act_forward)(act, y, y, (ptrdiff_t)OC * n);
}

DP_INLINE void K(row_range)(int rows, int t, int n, int *lo, int *hi)
{
    *lo = (int)((long long)rows * t / n);
    *hi = (int)((long long)rows * (t + 1) / n);
}

/* Whether BN stage s of a training pass finds its rows' sums made: by the conv stage before
 * it (conv_forward_task, image by image as each output is made: the same kernel on the same
 * values, so the same bits, without reading the batch's maps from memory again). */
DP_INLINE int K(bn_sums_made)(const dp_plan *p, int s)
{
    return s > 0 && s < p->n_stages && p->stage[s].op == DP_STAGE_BN &&
           p->stage[s - 1].op == DP_STAGE_CONV && !p->stage[s - 1].pool;
}

/* Whether BN stage s has a ReLU stage after it that it does itself: forward, the ReLU on its
 * output (written to the ReLU's buffer; its own is not written), backward, the ReLU's mask on
 * d in its row sums pass. */
DP_INLINE int K(bn_relu_fused)(const dp_plan *p, int s)
{
    return s + 1 < p->n_stages && p->stage[s].op == DP_STAGE_BN &&
           p->stage[s + 1].op == DP_STAGE_ACT && p->stage[s + 1].act == DP_ACT_RELU;
}

/* Whether the input gradient of BN stage s comes with its rows' channel sums for the conv
 * stage before it (its bias gradient; bn_backward_dx's rsum, in bnrows) */
DP_INLINE int K(bn_rsum_made)(const dp_plan *p, int s)
{ return K(bn_sums_made)(p, s) && p->stage[s - 1].act == DP_ACT_NONE; }

/* where those sums are: bnrows past the rows' sums, the totals and the count */
DP_INLINE T *K(bn_rsum_at)(double *bnrows, int rows, int C)
{ return (T *)(void *)(bnrows + ((ptrdiff_t)rows + 1) * 2 * C + 1); }

/* ---- a stage's work over a batch, split over the threads ---------------------------------- */

typedef struct {
    dp_model *m;
    const dp_stage *st;
    int rows;
    const T *in;   /* (rows, in_width) */
    T *out;        /* (rows, out_width) */
    uint8_t *code; /* like out (pooling stages, dropout's masks) */
    double *stats; /* NORM: (rows, 2); CONV before a training BN: forward, its rows' sums
                    * (rows, 2 OC); backward, d's row sums (rows, OC) of T (bn_rsum_made) */
    const T *src;  /* RESEND: the skip's source (its RESBEGIN's output) */
    const T *params;
    int train; /* dropout draws a mask (else it passes its input on) */
    /* backward only */
    T *d;     /* d loss / d out (through the stage's activation here, in place) */
    T *dnext; /* d loss / d in (written), or NULL */
    int rc[DP_MAX_THREADS];
} K(stage_job);

static void K(conv_forward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    dp_model_thread *th = &job->m->th[t];
    const dp_conv_geom *g = &st->g;
    int CH = st->conv_h, CW = st->conv_w, lo, hi;
    int npos = st->pool ? (CH / 2) * (CW / 2) : CH * CW;
    int win = st->in_width, wout = st->out_width;
    const T *w = job->params + st->w_off, *b = job->params + st->b_off;
    T *col = th->col.ptr, *conv = th->conv.ptr;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    /* the plane path's weights, packed once for this thread's images (grad's tail) */
    T *wp = (T *)th->grad.ptr + (ptrdiff_t)g->OC * g->C * g->KH * g->KW + g->OC;
    K(dp_conv_pack)(wp, w, g);
    for (int i = lo; i < hi; i++) {
        T *y = job->out + (ptrdiff_t)i * wout;
        int rc = K(dp_conv_image_forward)(&th->ctx, col, st->pool ? conv : y,
                                          job->in + (ptrdiff_t)i * win, w, wp, g, CH, CW, (T)0);
        if (rc) {
            job->rc[t] = rc;
            return;
        }
        if (st->pool)
            K(dp_maxpool2_forward)(y, job->code + (ptrdiff_t)i * wout, conv, g->OC, CH, CW);
        K(bias_act)(y, b, g->OC, npos, st->act);
        /* the next stage's batch-norm sums, while the image's output is in cache */
        if (job->stats) K(dp_bn_row_sums)(job->stats + (ptrdiff_t)i * 2 * g->OC, y, 1, g->OC, npos);
    }
}

static void K(conv_backward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    dp_model_thread *th = &job->m->th[t];
    const dp_conv_geom *g = &st->g;
    int CH = st->conv_h, CW = st->conv_w, lo, hi;
    int npos = st->pool ? (CH / 2) * (CW / 2) : CH * CW;
    int win = st->in_width, wout = st->out_width;
    ptrdiff_t nw = (ptrdiff_t)g->OC * g->C * g->KH * g->KW;
    const T *w = job->params + st->w_off;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    /* this thread's dw^T (K, OC) and db, summed over its images; added into grads after */
    T *dwt = th->grad.ptr, *db = dwt + nw, *wp = db + g->OC;
    memset(dwt, 0, sizeof(T) * (size_t)(nw + g->OC));
    K(dp_conv_pack)(wp, w, g);
    T *col = th->col.ptr, *dconv = th->conv.ptr;
    for (int i = lo; i < hi; i++) {
        T *d = job->d + (ptrdiff_t)i * wout;
        K(act_backward)(st->act, d, d, job->out + (ptrdiff_t)i * wout, NULL, wout);
        if (job->stats) { /* the batch norm after made d's row sums (bn_rsum_made) */
            const T *rsum = K(bn_rsum_at)(job->stats, job->rows, g->OC) + (ptrdiff_t)i * g->OC;
            for (int o = 0; o < g->OC; o++) db[o] += rsum[o];
        } else {
            K(dp_add_row_sums)(db, d, g->OC, npos);
        }
        if (st->pool)
            K(dp_maxpool2_backward)(dconv, d, job->code + (ptrdiff_t)i * wout, g->OC, CH, CW);
        int rc = K(dp_conv_image_backward)(
            &th->ctx, col, dwt, job->dnext ? job->dnext + (ptrdiff_t)i * win : NULL,
            st->pool ? dconv : d, job->in + (ptrdiff_t)i * win, w, wp, g, CH, CW);
        if (rc) {
            job->rc[t] = rc;
            return;
        }
    }
}

/* POOL and ACT stages: a block of rows each. The pooling kernels stay inside the arrays they
 * are given (their vector over-reads and over-writes are bounded by the block's end), so the
 * threads' blocks do not touch each other. */
static void K(rows_forward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    int lo, hi;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    ptrdiff_t iw = st->in_width, ow = st->out_width;
    T *y = job->out + lo * ow;
    const T *x = job->in + lo * iw;
    ptrdiff_t planes = (ptrdiff_t)(hi - lo) * st->g.C;
    const dp_model *m = job->m;
    switch (st->op) {
    case DP_STAGE_POOL:
        K(dp_maxpool2_forward)(y, job->code + lo * ow, x, planes, st->g.H, st->g.W);
        break;
    case DP_STAGE_AVGPOOL: K(dp_avgpool2_forward)(y, x, planes, st->g.H, st->g.W); break;
    case DP_STAGE_GAP: K(dp_gap_forward)(y, x, planes, st->g.H * st->g.W); break;
    case DP_STAGE_DROPOUT:
        if (job->train)
            K(dp_dropout_forward)(y, job->code + lo * ow, x, hi - lo, (int)ow, st->rate,
                                  m->rng_seed, m->rng_step, m->rng_row0 + lo, st->first);
        else
            memcpy(y, x, sizeof(T) * (size_t)(hi - lo) * (size_t)ow);
        break;
    case DP_STAGE_NORM:
        K(dp_layernorm_forward)(y, job->stats + 2 * lo, x, job->params + st->w_off,
                                job->params + st->b_off, hi - lo, (int)ow);
        break;
    case DP_STAGE_RESBEGIN: /* the model's first stage: a copy of the batch */
        if (y != x) memcpy(y, x, sizeof(T) * (size_t)(hi - lo) * (size_t)ow);
        break;
    default: K(act_forward)(st->act, y, x, (hi - lo) * ow); break;
    }
}

static void K(rows_backward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    int lo, hi;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    ptrdiff_t iw = st->in_width, ow = st->out_width;
    T *d = job->d + lo * ow;
    ptrdiff_t planes = (ptrdiff_t)(hi - lo) * st->g.C;
    switch (st->op) {
    case DP_STAGE_POOL:
        K(dp_maxpool2_backward)(job->dnext + lo * iw, d, job->code + lo * ow, planes, st->g.H,
                                st->g.W);
        break;
    case DP_STAGE_AVGPOOL:
        K(dp_avgpool2_backward)(job->dnext + lo * iw, d, planes, st->g.H, st->g.W);
        break;
    case DP_STAGE_GAP:
        K(dp_gap_backward)(job->dnext + lo * iw, d, planes, st->g.H * st->g.W);
        break;
    case DP_STAGE_DROPOUT:
        K(dp_dropout_backward)(d, d, job->code + lo * ow, hi - lo, (int)ow, st->rate);
        break;
    case DP_STAGE_RESBEGIN: /* the block's gradient plus the skip connection's */
        for (ptrdiff_t i = 0; i < (hi - lo) * ow; i++) d[i] += job->dnext[lo * ow + i];
        break;
    default:
        K(act_backward)(st->act, d, d, job->out + lo * ow, job->in + lo * iw, (hi - lo) * ow);
        break;
    }
}

/* RESEND: y = h + skip, or h + conv1x1(skip) + b (projected), then the act; rows (images)
 * split over the threads, each projection on the thread's own GEMM context. */
static void K(resend_forward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    dp_model_thread *th = &job->m->th[t];
    int lo, hi, sw = job->m->plan.stage[st->skip].out_width, w = st->out_width;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    T *wp = NULL; /* the projection's weights for the plane path, after dW^T and db */
    if (st->param >= 0) {
        wp = (T *)th->grad.ptr + (ptrdiff_t)st->g.OC * st->g.C + st->g.OC;
        K(dp_conv_pack)(wp, job->params + st->w_off, &st->g);
    }
    for (int i = lo; i < hi; i++) {
        T *y = job->out + (ptrdiff_t)i * w;
        const T *h = job->in + (ptrdiff_t)i * w, *src = job->src + (ptrdiff_t)i * sw;
        if (st->param >= 0) {
            const dp_conv_geom *g = &st->g;
            int rc =
                K(dp_conv_image_forward)(&th->ctx, th->col.ptr, y, src, job->params + st->w_off, wp,
                                         g, st->conv_h, st->conv_w, (T)0);
            if (rc) {
                job->rc[t] = rc;
                return;
            }
            K(dp_bias_add)(y, job->params + st->b_off, g->OC, st->conv_h * st->conv_w);
            src = y;
        }
        if (st->act == DP_ACT_RELU) { /* the add and dp_relu_forward's ReLU in one pass */
            for (int j = 0; j < w; j++) {
                T v = h[j] + src[j];
                y[j] = v <= 0 ? (T)0 : v;
            }
            continue;
        }
        for (int j = 0; j < w; j++) y[j] = h[j] + src[j];
        if (st->act != DP_ACT_NONE) K(act_forward)(st->act, y, y, w);
    }
}

/* RESEND backward: d through the act (in place: it is also the block output's gradient), then
 * the skip's gradient into dnext (a copy, or the projection's input gradient; NULL: not
 * needed) and, projected, this thread's dW^T and db (summed after, in thread order). */
static void K(resend_backward_task)(void *arg, int t, int n)
{
    K(stage_job) *job = arg;
    const dp_stage *st = job->st;
    dp_model_thread *th = &job->m->th[t];
    int lo, hi, sw = job->m->plan.stage[st->skip].out_width, w = st->out_width;
    K(row_range)(job->rows, t, n, &lo, &hi);
    job->rc[t] = DP_OK;
    if (lo >= hi) return;
    const dp_conv_geom *g = &st->g;
    ptrdiff_t nw = (ptrdiff_t)g->OC * g->C;
    T *dwt = th->grad.ptr, *db = dwt + nw, *wp = db + g->OC;
    if (st->param >= 0) {
        memset(dwt, 0, sizeof(T) * (size_t)(nw + g->OC));
        K(dp_conv_pack)(wp, job->params + st->w_off, g);
    }
    for (int i = lo; i < hi; i++) {
        T *d = job->d + (ptrdiff_t)i * w;
        T *dsrc = job->dnext ? job->dnext + (ptrdiff_t)i * sw : NULL;
        if (st->param < 0 && dsrc && st->act == DP_ACT_RELU) {
            /* dp_relu_backward and the skip's copy in one pass */
            const T *y = job->out + (ptrdiff_t)i * w;
            for (int j = 0; j < w; j++) dsrc[j] = d[j] = y[j] > 0 ? d[j] : (T)0;
            continue;
        }
        K(act_backward)(st->act, d, d, job->out + (ptrdiff_t)i * w, NULL, w);
        if (st->param < 0) {
            if (dsrc) memcpy(dsrc, d, sizeof(T) * (size_t)w);
            continue;
        }
        K(dp_add_row_sums)(db, d, g->OC, st->conv_h * st->conv_w);
        int rc = K(dp_conv_image_backward)(&th->ctx, th->col.ptr, dwt, dsrc, d,
                                           job->src + (ptrdiff_t)i * sw, job->params + st->w_off,
                                           wp, g, st->conv_h, st->conv_w);
        if (rc) {
            job->rc[t] = rc;
            return;
        }
    }
}

/* The threads' partial dW^T and db of a conv stage or a projection (each thread's images'
 * sums), added into the gradient in thread order: part 0's work. */
static void K(add_partials)(dp_model *m, const dp_stage *st, T *grads, int B)
{
    const dp_conv_geom *g = &st->g;
    ptrdiff_t nw = (ptrdiff_t)g->OC * g->C * g->KH * g->KW;
    T *dw = grads + st->w_off, *db = grads + st->b_off;
    int parts = B < m->threads ? B : m->threads;
    for (int i = 0; i < parts; i++) {
        int a, z;
        K(row_range)(B, i, parts, &a, &z);
        if (a >= z) continue;
        const T *dwt = m->th[i].grad.ptr;
        K(dp_conv_add_dwt)(dw, dwt, g);
        for (int o = 0; o < g->OC; o++) db[o] += dwt[nw + o];
    }
}

/* The stage's gradient moves to the other half of grad_io (its width changes). */
DP_INLINE int K(moves_gradient)(const dp_stage *st)
{ return st->op == DP_STAGE_POOL || st->op == DP_STAGE_AVGPOOL || st->op == DP_STAGE_GAP; }

/* The first row whose label the loss refuses (after DP_ELABEL). */
static int K(first_bad_label)(const dp_plan *p, const int64_t *labels, int rows)
{
    int64_t classes = p->loss == DP_LOSS_SIGMOID_BCE ? 2 : p->out_width;
    for (int i = 0; i < rows; i++)
        if (labels[i] < 0 || labels[i] >= classes) return i;
    return -1;
}

/* Loss sum and correct count of rows [row0, row0 + rows) from their outputs y; dout (when not
 * NULL) = d(grad_scale * loss)/dy. labels and targets point at the batch's first row. */
static int K(model_loss)(dp_model *m, T *dout, double *loss_sum, int64_t *correct, const T *y,
                         const int64_t *labels, const T *targets, int row0, int rows, T grad_scale)
{
    const dp_plan *p = &m->plan;
    int OUT = p->out_width, rc;
    if (p->loss == DP_LOSS_MSE) {
        K(dp_mse)(dout, loss_sum, y, targets + (ptrdiff_t)row0 * OUT, rows, OUT, grad_scale);
        *correct = 0;
        return DP_OK;
    }
    const int64_t *lab = labels + row0;
    if (p->loss == DP_LOSS_SOFTMAX_XENT)
        rc = K(dp_softmax_xent)(dout, loss_sum, y, lab, rows, OUT, grad_scale);
    else
        rc = K(dp_sigmoid_bce)(dout, loss_sum, y, lab, rows, grad_scale);
    if (rc == DP_OK) rc = K(dp_count_correct)(correct, y, lab, rows, OUT);
    if (rc == DP_ELABEL) m->bad_row = row0 + K(first_bad_label)(p, lab, rows);
    return rc;
}

/* The loss's labels / targets are there. */
DP_INLINE int K(has_targets)(const dp_plan *p, const int64_t *labels, const T *targets)
{ return p->loss == DP_LOSS_MSE ? targets != NULL : labels != NULL; }

/* ---- the sweep: one parallel region per call ------------------------------------------------
 *
 * A call (forward_loss, a backward step, loss_grad, an evaluate chunk) runs as one region of
 * the model's team (dp_threads_region): every part walks the same stages and does its share of
 * each (rows of the row-wise work, its block of each GEMM, its images of a conv stage), the
 * parts meeting at a barrier where a phase reads what others wrote. The loss and the conv
 * stages' sum of the threads' partials run on part 0. Where the region has one part (one
 * thread, or a model that keeps the fork/join per kernel: see run_sweep) the same walk runs on
 * the caller, and every kernel splits itself over the team as before.
 *
 * The bits are those of the fork/join path: a GEMM's blocks are the ones dp_gemm cuts for the
 * team's size, a conv stage's images go to the threads as before (row_range over
 * min(rows, threads)) and its partials are summed in thread order, the bias gradient's columns
 * are each summed over the rows in row order. */

typedef struct {
    dp_model *m;
    K(model_bufs) bf;
    const T *params, *x; /* x: the batch (rows, in_width) */
    T *grads;
    int rows;
    int forward;           /* run the stages forward */
    int loss;              /* then the loss of rows [row0, row0 + rows) */
    const int64_t *labels; /* the loss's labels / targets, from the batch's first row */
    const T *targets;
    int row0;
    T grad_scale; /* and its gradient into bf.g0 (with_grad) */
    int with_grad;
    int top, bottom; /* then backward steps top, top - 1, .., bottom (none: top < bottom) */
    int d_second;    /* which grad_io half holds d loss / d output, before and after */
    double loss_sum;
    int64_t correct;
    _Atomic int rc;      /* the first failure of any part, or DP_OK */
    _Atomic int fail_at; /* the first phase a part failed in (INT_MAX: none) */
} K(sweep);

/* Records a part's failure (the first code is kept) and the phase it happened in. */
DP_INLINE void K(fail)(K(sweep) * sw, int rc)
{
    if (!rc) return;
    int ok = DP_OK, at = atomic_load(&sw->fail_at);
    atomic_compare_exchange_strong(&sw->rc, &ok, rc);
    while (sweep_phase < at && !atomic_compare_exchange_weak(&sw->fail_at, &at, sweep_phase)) {}
}

/* Ends a phase: every part waits for the others; 1 (all parts alike) if a part failed in this
 * phase or before. Not "any failure so far": a part already in the next phase may fail before
 * a slower one has looked, and the parts would leave at different barriers. */
DP_INLINE int K(phase_end)(K(sweep) * sw, int n)
{
    dp_threads_barrier(sw->m->ctx.team, n);
    return atomic_load(&sw->fail_at) <= sweep_phase++;
}

/* A conv, pool or activation stage's task (images or rows) on this part: on a region its own
 * share (parts past min(rows, n) have none), else split over the team as a fork/join. */
static void K(stage_part)(K(sweep) * sw, K(stage_job) * job, dp_task_fn fn, int t, int n)
{
    /* the parts of a fork/join and of a region alike: one per thread, at most one per row */
    int threads = n == 1 ? sw->m->threads : n;
    int parts = job->rows < threads ? job->rows : threads;
    if (parts < 1) parts = 1;
    if (n > 1) {
        if (t < parts) {
            fn(job, t, parts);
            K(fail)(sw, job->rc[t]);
        }
        return;
    }
    dp_threads_run(sw->m->ctx.team, parts, fn, job);
    for (int i = 0; i < parts; i++) K(fail)(sw, job->rc[i]);
}

/* (mean, rstd) of channels [c0, c1) into mr from the totals tot (2 C, then the count), and
 * their variances (the count, mr[2 C], is the caller's to set: one part writes it) */
static void K(bn_stats)(double *mr, const double *tot, int C, int c0, int c1)
{
    double N = tot[2 * C];
    for (int c = c0; c < c1; c++) {
        double mean = tot[2 * c] / N, var = tot[2 * c + 1] / N - mean * mean;
        if (var < 0) var = 0;
        mr[2 * c] = mean;
        mr[2 * c + 1] = 1.0 / sqrt(var + DP_BATCHNORM_EPS);
        mr[2 * C + 1 + c] = var;
    }
}

/* A single worker's batch norm (no exchange: the statistics wait on no one else) goes
 * through the batch channel block by channel block, each block's maps (BN_BLOCK values of
 * each of the streams it reads) read from memory once and again from L2: the sums, then the
 * normalization (forward) or the input gradient (backward). Each part takes its share of the
 * channels; every value and sum is the one the row-split passes make (the same kernels on
 * the same rows, the totals in row order), so the same bits. */
#define BN_BLOCK (256 * 1024)

DP_INLINE int K(bn_blocked)(const dp_model *m, int rows, int HW)
{ return !m->exchange && (ptrdiff_t)rows * HW <= BN_BLOCK; }

/* this part's channels [*c0, *c1) and its block of nb channels (streams: the maps it reads) */
DP_INLINE void K(bn_block_of)(int C, int rows, int HW, int streams, int t, int n, int *c0, int *c1,
                              int *nb)
{
    K(row_range)(C, t, n, c0, c1);
    ptrdiff_t per = (ptrdiff_t)rows * HW * streams;
    *nb = per >= BN_BLOCK ? 1 : (int)(BN_BLOCK / per);
}

/* tot[2 c0 .. 2 c1) = the rows' sums rs (rows, 2 C) of channels [c0, c1) added in row order:
 * the same bits on any number of threads (all channels: part 0 adds what every part wrote;
 * a channel block: its part) */
static void K(bn_totals)(double *tot, const double *rs, int rows, int C, int c0, int c1)
{
    for (int j = 2 * c0; j < 2 * c1; j++) tot[j] = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 2 * c0; j < 2 * c1; j++) tot[j] += rs[(ptrdiff_t)r * 2 * C + j];
}

/* A BN stage forward: training, each part's rows' sums, part 0's totals in row order (and the
 * exchange's across workers) into (mean, rstd) per channel, the count and the variances in
 * stats; evaluation, (mean, rstd) from the running statistics; then each part normalizes its
 * rows (or, one worker with the sums still to make, bn_blocked: channel blocks). 1 where a
 * part failed. */
static int K(bn_forward)(K(sweep) * sw, const dp_stage *st, int s, const T *x, T *y, int relu,
                         int t, int n)
{
    dp_model *m = sw->m;
    int rows = sw->rows, C = st->g.C, HW = st->g.H * st->g.W, lo, hi;
    K(row_range)(rows, t, n, &lo, &hi);
    double *mr = sw->bf.stats[s], *rs = sw->bf.bnrows, *tot = rs + (ptrdiff_t)rows * 2 * C;
    ptrdiff_t w = (ptrdiff_t)C * HW;
    const T *gamma = sw->params + st->w_off, *beta = sw->params + st->b_off;
    if (sw->with_grad && !K(bn_sums_made)(&m->plan, s) && K(bn_blocked)(m, rows, HW)) {
        if (t == 0) { /* the count, by part 0 before the others read it */
            if ((double)rows * HW == 1.0) K(fail)(sw, DP_EBNSINGLE); /* see below */
            tot[2 * C] = mr[2 * C] = (double)rows * HW;
        }
        if (K(phase_end)(sw, n)) return 1;
        int c0, c1, nb;
        K(bn_block_of)(C, rows, HW, 1, t, n, &c0, &c1, &nb);
        for (int b0 = c0; b0 < c1; b0 += nb) {
            int b1 = b0 + nb < c1 ? b0 + nb : c1;
            for (int r = 0; r < rows; r++)
                K(dp_bn_row_sums)(rs + (ptrdiff_t)r * 2 * C + 2 * b0, x + r * w + b0 * HW, 1,
                                  b1 - b0, HW);
            K(bn_totals)(tot, rs, rows, C, b0, b1);
            K(bn_stats)(mr, tot, C, b0, b1);
            for (int r = 0; r < rows; r++)
                K(dp_bn_normalize)(y + r * w + b0 * HW, x + r * w + b0 * HW, mr + 2 * b0,
                                   gamma + b0, beta + b0, 1, b1 - b0, HW, relu);
        }
        return 0;
    }
    if (sw->with_grad) {
        if (lo < hi && !K(bn_sums_made)(&m->plan, s))
            K(dp_bn_row_sums)(rs + (ptrdiff_t)lo * 2 * C, x + lo * w, hi - lo, C, HW);
        if (K(phase_end)(sw, n)) return 1;
        if (t == 0) {
            K(bn_totals)(tot, rs, rows, C, 0, C);
            tot[2 * C] = (double)rows * HW;
            if (m->exchange && m->exchange(m->exchange_ctx, tot, 2 * C + 1)) {
                K(fail)(sw, DP_EEXCHANGE);
            } else if (tot[2 * C] == 1.0) {
                /* one value per channel: its variance is 0, the normalized value 0 whatever
                 * the input, and the gradient through it rounding amplified by 1/sqrt(eps);
                 * refused, as PyTorch refuses it */
                K(fail)(sw, DP_EBNSINGLE);
            } else {
                K(bn_stats)(mr, tot, C, 0, C);
                mr[2 * C] = tot[2 * C];
            }
        }
    } else if (t == 0) {
        const double *rm = m->state + st->s_off, *rv = rm + C;
        for (int c = 0; c < C; c++) {
            mr[2 * c] = rm[c];
            mr[2 * c + 1] = 1.0 / sqrt(rv[c] + DP_BATCHNORM_EPS);
        }
    }
    if (K(phase_end)(sw, n)) return 1;
    if (lo < hi) K(dp_bn_normalize)(y + lo * w, x + lo * w, mr, gamma, beta, hi - lo, C, HW, relu);
    return 0;
}

/* After a training forward that succeeded: each BN stage's running statistics move towards
 * the batch's (PyTorch's update: the unbiased variance). */
static void K(bn_move_running)(dp_model *m, const dp_stage *st, const double *mr)
{
    int C = st->g.C;
    double N = mr[2 * C], mom = DP_BATCHNORM_MOMENTUM, *rm = m->state + st->s_off;
    double *rv = rm + C;
    for (int c = 0; c < C; c++) {
        double var = mr[2 * C + 1 + c];
        rm[c] = (1 - mom) * rm[c] + mom * mr[2 * c];
        rv[c] = (1 - mom) * rv[c] + mom * (N > 1 ? var * N / (N - 1) : var);
    }
}

static void K(bn_update_running)(dp_model *m, const K(model_bufs) * bf)
{
    const dp_plan *p = &m->plan;
    for (int s = 0; s < p->n_stages; s++)
        if (p->stage[s].op == DP_STAGE_BN) K(bn_move_running)(m, &p->stage[s], bf->stats[s]);
}

/* A share of no rows (a worker's or a deterministic chunk's, of a batch with fewer rows than
 * shares): nothing to compute, but where batch norms exchange their sums the other shares
 * wait for this one's at every exchange. It takes part in each with zero totals, in a
 * sweep's order: with forward, the forward's, stage by stage; then the backward's, layer by
 * layer from top down to bottom (a norm above layer 0: the one whose input gradient is
 * made). Once every exchange has succeeded, the running statistics move as the other shares'
 * do, from the batch's statistics. */
static int K(empty_exchanges)(dp_model *m, int forward, int top, int bottom)
{
    const dp_plan *p = &m->plan;
    if (!m->exchange) return DP_OK;
    size_t n = 0, Cmax = 0;
    for (int s = 0; s < p->n_stages; s++)
        if (p->stage[s].op == DP_STAGE_BN) {
            size_t C = (size_t)p->stage[s].g.C;
            n += 3 * C + 1; /* its statistics, as bn_stats leaves them */
            Cmax = C > Cmax ? C : Cmax;
        }
    if (Cmax == 0) return DP_OK;
    double *tot = malloc(sizeof(double) * (2 * Cmax + 1 + n)), *mr = tot + 2 * Cmax + 1;
    if (!tot) return DP_ENOMEM;
    int rc = DP_OK;
    for (int s = 0; forward && s < p->n_stages && rc == DP_OK; s++) {
        const dp_stage *st = &p->stage[s];
        if (st->op != DP_STAGE_BN) continue;
        int C = st->g.C;
        memset(tot, 0, sizeof(double) * (2 * (size_t)C + 1));
        if (m->exchange(m->exchange_ctx, tot, 2 * C + 1))
            rc = DP_EEXCHANGE;
        else if (tot[2 * C] == 1.0) /* refused by the share with the row: see bn's forward */
            rc = DP_EBNSINGLE;
        if (tot[2 * C] > 0) K(bn_stats)(mr, tot, C, 0, C);
        mr[2 * C] = tot[2 * C]; /* 0: no share had rows (a caller's own exchange), no move */
        mr += 3 * C + 1;
    }
    for (int layer = top; layer >= bottom && layer > 0 && rc == DP_OK; layer--) {
        const dp_stage *st = &p->stage[p->param_stage[layer]];
        if (st->op != DP_STAGE_BN) continue;
        memset(tot, 0, sizeof(double) * 2 * (size_t)st->g.C);
        if (m->exchange(m->exchange_ctx, tot, 2 * st->g.C)) rc = DP_EEXCHANGE;
    }
    mr = tot + 2 * Cmax + 1;
    for (int s = 0; forward && rc == DP_OK && s < p->n_stages; s++)
        if (p->stage[s].op == DP_STAGE_BN) {
            if (mr[2 * p->stage[s].g.C] > 0) K(bn_move_running)(m, &p->stage[s], mr);
            mr += 3 * (size_t)p->stage[s].g.C + 1;
        }
    free(tot);
    return rc;
}

/* Forward through every stage; out[n_stages - 1] holds the model's outputs. */
static int K(forward_part)(K(sweep) * sw, int t, int n)
{
    dp_model *m = sw->m;
    const dp_plan *p = &m->plan;
    int rows = sw->rows, lo, hi;
    K(row_range)(rows, t, n, &lo, &hi);
    const T *h = sw->x;
    for (int s = 0; s < p->n_stages; s++) {
        const dp_stage *st = &p->stage[s];
        T *y = sw->bf.out[s];
        if (st->op == DP_STAGE_DENSE) {
            int IN = st->in_width, OUT = st->out_width;
            const T *b = sw->params + st->b_off;
            for (int i = lo; i < hi; i++)
                memcpy(y + (ptrdiff_t)i * OUT, b, sizeof(T) * (size_t)OUT);
            if (K(phase_end)(sw, n)) return 1;
            K(fail)(sw, K(dp_gemm_part)(&m->ctx, sw->bf.partials, t, n, y, OUT, h, IN, 1,
                                        sw->params + st->w_off, 1, IN, rows, OUT, IN, (T)1, (T)1));
            if (K(phase_end)(sw, n)) return 1;
            if (st->act != DP_ACT_NONE)
                K(act_forward)(st->act, y + (ptrdiff_t)lo * OUT, y + (ptrdiff_t)lo * OUT,
                               (ptrdiff_t)(hi - lo) * OUT);
            /* a dense stage next fills its own rows of another buffer, then meets the others */
            if (s + 1 < p->n_stages && p->stage[s + 1].op == DP_STAGE_DENSE) {
                h = y;
                continue;
            }
        } else if (st->op == DP_STAGE_BN) {
            int relu = K(bn_relu_fused)(p, s);
            if (relu) y = sw->bf.out[s + 1]; /* the ReLU stage's output */
            if (K(bn_forward)(sw, st, s, h, y, relu, t, n)) return 1;
            s += relu; /* and the ReLU stage done */
        } else {
            K(stage_job)
            job = {.m = m,
                   .st = st,
                   .rows = rows,
                   .in = h,
                   .out = y,
                   .code = sw->bf.code[s],
                   .stats =
                       st->op == DP_STAGE_CONV
                           ? (sw->with_grad && K(bn_sums_made)(p, s + 1) ? sw->bf.bnrows : NULL)
                           : sw->bf.stats[s],
                   .src = st->op == DP_STAGE_RESEND ? sw->bf.out[st->skip] : NULL,
                   .params = sw->params,
                   .train = sw->with_grad};
            K(stage_part)(sw, &job,
                          st->op == DP_STAGE_CONV     ? K(conv_forward_task)
                          : st->op == DP_STAGE_RESEND ? K(resend_forward_task)
                                                      : K(rows_forward_task),
                          t, n);
        }
        if (K(phase_end)(sw, n)) return 1;
        h = y;
    }
    return 0;
}

/* Backward through stage s (parameter-free: POOL, AVGPOOL, GAP, DROPOUT or ACT): d holds
 * d loss / d out[s]; the result, d loss / d in[s], is left in d (ACT, DROPOUT: in place) or
 * dnext (the pools, and the halves swap). */
static int K(free_stage_backward)(K(sweep) * sw, int s, int *d_second, int t, int n)
{
    const dp_stage *st = &sw->m->plan.stage[s];
    K(model_bufs) *bf = &sw->bf;
    K(stage_job)
    job = {.m = sw->m,
           .st = st,
           .rows = sw->rows,
           .in = bf->out[s - 1],
           .out = bf->out[s],
           .code = bf->code[s],
           .d = *d_second ? bf->g1 : bf->g0,
           .dnext = *d_second ? bf->g0 : bf->g1};
    if (st->op == DP_STAGE_RESEND) { /* the identity: the skip's gradient is d's copy */
        job.dnext = bf->skip[s];
        job.src = bf->out[st->skip];
        K(stage_part)(sw, &job, K(resend_backward_task), t, n);
        return K(phase_end)(sw, n);
    }
    if (st->op == DP_STAGE_RESBEGIN) job.dnext = bf->skip[st->skip]; /* its RESEND's, added */
    K(stage_part)(sw, &job, K(rows_backward_task), t, n);
    if (K(moves_gradient)(st)) *d_second = !*d_second;
    return K(phase_end)(sw, n);
}

/* One backward step: the parameter-free stages after parameterized layer `layer`, then its
 * dW, db (accumulated into grads) and d loss / d its input (not for layer 0). */
static int K(backward_part)(K(sweep) * sw, int layer, int *d_second, int t, int n)
{
    dp_model *m = sw->m;
    const dp_plan *p = &m->plan;
    K(model_bufs) *bf = &sw->bf;
    int B = sw->rows, lo, hi;
    int s0 = p->param_stage[layer];
    int s1 = layer + 1 < p->n_param_layers ? p->param_stage[layer + 1] : p->n_stages;
    /* a ReLU after a batch norm: the norm's row sums pass takes its mask */
    int fused = K(bn_relu_fused)(p, s0);
    for (int s = s1 - 1; s > s0 + fused; s--)
        if (K(free_stage_backward)(sw, s, d_second, t, n)) return 1;
    const dp_stage *st = &p->stage[s0];
    T *d = *d_second ? bf->g1 : bf->g0;
    T *dnext = layer > 0 ? (*d_second ? bf->g0 : bf->g1) : NULL;
    const T *h = s0 > 0 ? bf->out[s0 - 1] : sw->x;
    T *grads = sw->grads;
    K(row_range)(B, t, n, &lo, &hi);
    if (st->op == DP_STAGE_DENSE) {
        int IN = st->in_width, OUT = st->out_width;
        const T *w = sw->params + st->w_off;
        if (st->act != DP_ACT_NONE) {
            K(act_backward)(st->act, d + (ptrdiff_t)lo * OUT, d + (ptrdiff_t)lo * OUT,
                            bf->out[s0] + (ptrdiff_t)lo * OUT, NULL, (ptrdiff_t)(hi - lo) * OUT);
            if (K(phase_end)(sw, n)) return 1;
        }
        /* dW += d^T h, dx = d W and db += column sums of d: one phase, each part its share */
        K(fail)(sw, K(dp_gemm_part)(&m->ctx, sw->bf.partials, t, n, grads + st->w_off, IN, d, 1,
                                    OUT, h, IN, 1, OUT, IN, B, (T)1, (T)1));
        if (dnext)
            K(fail)(sw, K(dp_gemm_part)(&m->ctx, sw->bf.partials, t, n, dnext, IN, d, OUT, 1, w, IN,
                                        1, B, IN, OUT, (T)1, (T)0));
        int o0, o1;
        K(row_range)(OUT, t, n, &o0, &o1);
        T *db = grads + st->b_off;
        for (int i = 0; i < B; i++) {
            const T *r = d + (ptrdiff_t)i * OUT;
            for (int o = o0; o < o1; o++) db[o] += r[o];
        }
        if (K(phase_end)(sw, n)) return 1;
    } else if (st->op == DP_STAGE_RESEND) {
        /* d stays the block output's gradient (no swap); the skip's into its own buffer */
        K(stage_job)
        job = {.m = m,
               .st = st,
               .rows = B,
               .in = h,
               .out = bf->out[s0],
               .src = bf->out[st->skip],
               .params = sw->params,
               .d = d,
               .dnext = layer > 0 ? bf->skip[s0] : NULL};
        K(stage_part)(sw, &job, K(resend_backward_task), t, n);
        if (K(phase_end)(sw, n)) return 1;
        if (t == 0) K(add_partials)(m, st, grads, B);
        if (K(phase_end)(sw, n)) return 1;
        return 0;
    } else if (st->op == DP_STAGE_BN) {
        /* each part's rows' (sum dy, sum dy xhat); part 0 adds them in row order into dgamma,
         * dbeta (this worker's) and, exchanged, the batch's totals for dx (one worker:
         * channel blocks, each part its channels, see bn_blocked) */
        int C = st->g.C, HW = st->g.H * st->g.W;
        ptrdiff_t w = (ptrdiff_t)C * HW;
        double *mr = bf->stats[s0], *rs = bf->bnrows, *tot = rs + (ptrdiff_t)B * 2 * C;
        T *rsum = K(bn_rsum_made)(p, s0) ? K(bn_rsum_at)(bf->bnrows, B, C) : NULL;
        const T *gamma = sw->params + st->w_off, *relu_y = fused ? bf->out[s0 + 1] : NULL;
        T *dg = grads + st->w_off, *db = grads + st->b_off;
        if (K(bn_blocked)(m, B, HW)) {
            int c0, c1, nb;
            K(bn_block_of)(C, B, HW, 2 + fused, t, n, &c0, &c1, &nb);
            for (int b0 = c0; b0 < c1; b0 += nb) {
                int b1 = b0 + nb < c1 ? b0 + nb : c1;
                ptrdiff_t o = (ptrdiff_t)b0 * HW;
                for (int r = 0; r < B; r++)
                    K(dp_bn_grad_row_sums)(rs + (ptrdiff_t)r * 2 * C + 2 * b0, d + r * w + o,
                                           h + r * w + o, mr + 2 * b0, 1, b1 - b0, HW,
                                           relu_y ? relu_y + r * w + o : NULL);
                K(bn_totals)(tot, rs, B, C, b0, b1);
                for (int c = b0; c < b1; c++) {
                    dg[c] += (T)tot[2 * c + 1];
                    db[c] += (T)tot[2 * c];
                }
                if (dnext)
                    for (int r = 0; r < B; r++)
                        K(dp_bn_backward_dx)(dnext + r * w + o, d + r * w + o, h + r * w + o,
                                             mr + 2 * b0, tot + 2 * b0, gamma + b0, mr[2 * C], 1,
                                             b1 - b0, HW,
                                             rsum ? rsum + (ptrdiff_t)r * C + b0 : NULL);
            }
            if (K(phase_end)(sw, n)) return 1;
        } else {
            if (lo < hi)
                K(dp_bn_grad_row_sums)(rs + (ptrdiff_t)lo * 2 * C, d + lo * w, h + lo * w, mr,
                                       hi - lo, C, HW, relu_y ? relu_y + lo * w : NULL);
            if (K(phase_end)(sw, n)) return 1;
            if (t == 0) {
                K(bn_totals)(tot, rs, B, C, 0, C);
                for (int c = 0; c < C; c++) {
                    dg[c] += (T)tot[2 * c + 1];
                    db[c] += (T)tot[2 * c];
                }
                if (dnext && m->exchange && m->exchange(m->exchange_ctx, tot, 2 * C))
                    K(fail)(sw, DP_EEXCHANGE);
            }
            if (K(phase_end)(sw, n)) return 1;
            if (dnext && lo < hi)
                K(dp_bn_backward_dx)(dnext + lo * w, d + lo * w, h + lo * w, mr, tot, gamma,
                                     mr[2 * C], hi - lo, C, HW,
                                     rsum ? rsum + (ptrdiff_t)lo * C : NULL);
            if (K(phase_end)(sw, n)) return 1;
        }
    } else if (st->op == DP_STAGE_NORM) {
        /* dgamma, dbeta: each part its columns over every row in row order; dx its rows */
        int F = st->out_width, c0, c1;
        double *stats = bf->stats[s0];
        K(row_range)(F, t, n, &c0, &c1);
        K(dp_layernorm_backward_params)(grads + st->w_off, grads + st->b_off, d, h, stats, B, F, c0,
                                        c1);
        if (dnext && lo < hi)
            K(dp_layernorm_backward_dx)(dnext + (ptrdiff_t)lo * F, d + (ptrdiff_t)lo * F,
                                        h + (ptrdiff_t)lo * F, stats + 2 * lo,
                                        sw->params + st->w_off, hi - lo, F);
        if (K(phase_end)(sw, n)) return 1;
    } else {
        K(stage_job)
        job = {.m = m,
               .st = st,
               .rows = B,
               .in = h,
               .out = bf->out[s0],
               .code = bf->code[s0],
               .stats = K(bn_rsum_made)(p, s0 + 1) ? bf->bnrows : NULL,
               .params = sw->params,
               .d = d,
               .dnext = dnext};
        K(stage_part)(sw, &job, K(conv_backward_task), t, n);
        if (K(phase_end)(sw, n)) return 1;
        if (t == 0) K(add_partials)(m, st, grads, B); /* the threads', in thread order */
        /* the partials' buffers are the next conv step's */
        if (K(phase_end)(sw, n)) return 1;
    }
    if (layer > 0) *d_second = !*d_second;
    return 0;
}

static void K(sweep_task)(void *arg, int t, int n)
{
    K(sweep) *sw = arg;
    sweep_phase = 0;
    if (sw->forward && K(forward_part)(sw, t, n)) return;
    if (sw->loss) {
        if (t == 0) {
            double part = 0;
            int64_t ok = 0;
            const dp_plan *p = &sw->m->plan;
            K(fail)(sw, K(model_loss)(sw->m, sw->with_grad ? sw->bf.g0 : NULL, &part, &ok,
                                      sw->bf.out[p->n_stages - 1], sw->labels, sw->targets,
                                      sw->row0, sw->rows, sw->grad_scale));
            sw->loss_sum = part;
            sw->correct = ok;
        }
        if (K(phase_end)(sw, n)) return;
    }
    int d_second = sw->d_second;
    for (int layer = sw->top; layer >= sw->bottom; layer--)
        if (K(backward_part)(sw, layer, &d_second, t, n)) return;
    if (t == 0) sw->d_second = d_second;
}

/* One parallel region per call where the team can run one and it pays: more than one stage
 * (a single GEMM gains nothing from it) and no bfloat16 inputs (their GEMMs thread
 * themselves). Elsewhere the walk runs on the caller, its kernels fork and join as before. */
static int K(run_sweep)(K(sweep) * sw)
{
    dp_model *m = sw->m;
    atomic_init(&sw->rc, DP_OK);
    atomic_init(&sw->fail_at, INT_MAX);
    if (m->plan.n_stages > 1 && !m->ctx.bf16_inputs)
        dp_threads_region(m->ctx.team, K(sweep_task), sw);
    else
        K(sweep_task)(sw, 0, 1);
    return atomic_load(&sw->rc);
}

/* forward_loss, then backward steps top .. bottom (none where top < bottom), in one region;
 * the sweep's state is the model's before and after */
static int K(forward_backward)(dp_model *m, T *grads, double *loss_sum, int64_t *correct,
                               const T *params, const T *x, const int64_t *labels, const T *targets,
                               int B, T grad_scale, int top)
{
    const dp_plan *p = &m->plan;
    m->pending = m->pending_rows = 0;
    *loss_sum = 0;
    *correct = 0;
    if (B <= 0) {
        int rc = K(empty_exchanges)(m, 1, top, 0);
        if (rc == DP_OK && top < 0) { /* its steps still come, each to exchange */
            m->pending = 1;
            m->pending_x = x;
            m->next_layer = p->n_param_layers - 1;
            m->d_second = 0;
        }
        return rc;
    }
    if (!K(has_targets)(p, labels, targets)) return DP_EVALUE;
    K(sweep)
    sw = {.m = m,
          .params = params,
          .x = x,
          .grads = grads,
          .rows = B,
          .forward = 1,
          .loss = 1,
          .labels = labels,
          .targets = targets,
          .grad_scale = grad_scale,
          .with_grad = 1,
          .top = top,
          .bottom = 0};
    int rc = K(model_buffers)(m, B, &sw.bf, 1);
    if (rc) return rc;
    rc = K(run_sweep)(&sw);
    if (rc) return rc;
    K(bn_update_running)(m, &sw.bf);
    *loss_sum = sw.loss_sum;
    *correct = sw.correct;
    if (top < 0) { /* a sweep in progress: its steps come one call each */
        m->pending = 1;
        m->pending_rows = B;
        m->pending_x = x;
        m->next_layer = p->n_param_layers - 1;
        m->d_second = 0;
    }
    return DP_OK;
}

int K(dp_model_forward_loss)(dp_model *m, double *loss_sum, int64_t *correct, const T *params,
                             const T *x, const int64_t *labels, const T *targets, int B,
                             T grad_scale)
{
    // x is (B, in_width): forward and loss; d(grad_scale * loss)/d(outputs) is kept for the
    // backward steps that follow
    return K(forward_backward)(m, NULL, loss_sum, correct, params, x, labels, targets, B,
                               grad_scale, -1);
}

int K(dp_model_backward_layer)(dp_model *m, T *grads, const T *params, int layer)
{
    // one step of the sweep: the parameter-free stages after parameterized layer `layer`, then
    // its dW, db (accumulated into grads) and d(loss)/d(its input) for the step after (not
    // computed for layer 0)
    int B = m->pending_rows;
    if (!m->pending || layer != m->next_layer) return DP_EORDER;
    if (B == 0) { /* a share of no rows */
        int rc = K(empty_exchanges)(m, 0, layer, layer);
        if (rc) return rc;
        m->next_layer = layer - 1;
        if (layer == 0) m->pending = 0;
        return DP_OK;
    }
    K(sweep)
    sw = {.m = m,
          .params = params,
          .x = m->pending_x,
          .grads = grads,
          .rows = B,
          .top = layer,
          .bottom = layer,
          .d_second = m->d_second};
    int rc = K(model_buffers)(m, B, &sw.bf, 1); /* the same scratch: no allocation */
    if (rc) return rc;
    rc = K(run_sweep)(&sw);
    if (rc) return rc;
    m->d_second = sw.d_second;
    m->next_layer = layer - 1;
    if (layer == 0) m->pending = m->pending_rows = 0;
    return DP_OK;
}

int K(dp_model_loss_grad)(dp_model *m, T *grads, double *loss_sum, int64_t *correct,
                          const T *params, const T *x, const int64_t *labels, const T *targets,
                          int B, T grad_scale)
{
    // x is (B, in_width); grads and params are (P,); grads accumulate
    // d(grad_scale * sum_i loss_i) / d params
    const dp_plan *p = &m->plan;
    const dp_stage *st = &p->stage[0];
    m->pending = m->pending_rows = 0; /* a whole sweep: one in progress ends here, always */
    if (B > 0 && labels && p->loss == DP_LOSS_SIGMOID_BCE && p->n_stages == 1 &&
        st->op == DP_STAGE_DENSE && st->act == DP_ACT_NONE && !m->ctx.bf16_inputs) {
        /* logistic regression: a GEMM with one output column wastes the micro-kernel; the
         * fused kernel reads x once (it has no bfloat16 inputs: those take the GEMMs) */
        int rc = K(dp_logistic_grad)(grads + st->w_off, grads + st->b_off, loss_sum, correct, x,
                                     params + st->w_off, params + st->b_off, labels, B,
                                     st->in_width, grad_scale);
        if (rc == DP_ELABEL) m->bad_row = K(first_bad_label)(p, labels, B);
        return rc;
    }
    return K(forward_backward)(m, grads, loss_sum, correct, params, x, labels, targets, B,
                               grad_scale, p->n_param_layers - 1);
}

int K(dp_model_evaluate)(dp_model *m, T *out, double *loss_sum, int64_t *correct, const T *params,
                         const T *x, const int64_t *labels, const T *targets, int B)
{
    // x is (B, in_width); out (B, OUT) optional; labels / targets optional (then no loss)
    const dp_plan *p = &m->plan;
    int IN0 = p->in_width, OUT = p->out_width, with_loss = K(has_targets)(p, labels, targets);
    double total = 0;
    int64_t right = 0;
    m->pending = m->pending_rows = 0; /* the scratch is reused: a sweep in progress ends */
    *loss_sum = 0;
    *correct = 0;
    for (int r0 = 0; r0 < B; r0 += m->eval_rows) {
        int rows = B - r0 < m->eval_rows ? B - r0 : m->eval_rows;
        K(sweep)
        sw = {.m = m,
              .params = params,
              .x = x + (ptrdiff_t)r0 * IN0,
              .rows = rows,
              .forward = 1,
              .loss = with_loss,
              .labels = labels,
              .targets = targets,
              .row0 = r0,
              .grad_scale = (T)1,
              .top = -1};
        int rc = K(model_buffers)(m, rows, &sw.bf, 0);
        if (rc) return rc;
        rc = K(run_sweep)(&sw);
        if (rc) return rc;
        total += sw.loss_sum;
        right += sw.correct;
        if (out)
            memcpy(out + (ptrdiff_t)r0 * OUT, sw.bf.out[p->n_stages - 1],
                   sizeof(T) * (size_t)rows * (size_t)OUT);
    }
    *loss_sum = total;
    *correct = right;
    return DP_OK;
}

#undef K
