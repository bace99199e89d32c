/* dp_model.c - see dp_model.h: the plan (shapes, stages, parameter layout), the contexts, and
 * dp_model_tmpl.h for both dtypes. */
#include "dp_model.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_act.h"
#include "dp_dense.h"
#include "dp_loss.h"
#include "dp_buffers.h"
#include "dp_layers.h"

/* Activations per evaluate chunk (counted as doubles, so both dtypes chunk alike). */
#define EVAL_BYTES ((size_t)16 << 20)
#define EVAL_MAX_ROWS 1024

/* *off += n, or -1 when the flat layout would not fit a ptrdiff_t (each n < 2^62). */
static int grow(ptrdiff_t *off, ptrdiff_t n)
{
    if (*off > PTRDIFF_MAX - n) return -1;
    *off += n;
    return 0;
}

static int is_out_act(dp_layer_kind k)
{
    /* activations whose derivative comes from their output: they may run in place */
    return k == DP_LAYER_RELU || k == DP_LAYER_TANH || k == DP_LAYER_SIGMOID;
}

static dp_act act_of(dp_layer_kind k)
{
    switch (k) {
    case DP_LAYER_RELU: return DP_ACT_RELU;
    case DP_LAYER_TANH: return DP_ACT_TANH;
    case DP_LAYER_SIGMOID: return DP_ACT_SIGMOID;
    case DP_LAYER_GELU: return DP_ACT_GELU;
    default: return DP_ACT_NONE;
    }
}

static int flat_width(int ndim, const int *shape)
{ return ndim == 3 ? shape[0] * shape[1] * shape[2] : shape[0]; }

/* Records the failure and returns DP_EVALUE. */
static int refuse(dp_plan *p, int layer, const char *why)
{
    p->bad_layer = layer;
    p->why = why;
    p->n_stages = 0;
    return DP_EVALUE;
}

/* Pass 1: every layer's output shape and the parameter layout, per layer. */
/* The most residual blocks open at once. */
#define MAX_NESTING 8

/* The stride of a 1x1 projection from (H, W) onto (OH, OW), or 0 where none gives it. */
static int projection_stride(int H, int W, int OH, int OW)
{
    for (int s = 1; s <= H || s <= W; s++)
        if ((H - 1) / s + 1 == OH && (W - 1) / s + 1 == OW) return s;
    return 0;
}

static int plan_shapes(dp_plan *p, ptrdiff_t *w_off, ptrdiff_t *b_off, ptrdiff_t *s_off,
                       int *res_begin)
{
    int ndim = p->in_ndim, sh[3] = {p->in_shape[0], p->in_shape[1], p->in_shape[2]};
    int open = 0, open_at[MAX_NESTING], open_ndim[MAX_NESTING], open_sh[MAX_NESTING][3];
    ptrdiff_t off = 0;
    for (int l = 0; l < p->n_layers; l++) {
        dp_layer *ly = &p->layer[l];
        int width = flat_width(ndim, sh);
        switch (ly->kind) {
        case DP_LAYER_DENSE:
            if (ly->out < 1) return refuse(p, l, "dense output size < 1");
            w_off[l] = off;
            if (grow(&off, (ptrdiff_t)ly->out * width))
                return refuse(p, l, "parameter count overflows");
            b_off[l] = off;
            if (grow(&off, ly->out)) return refuse(p, l, "parameter count overflows");
            ndim = 1;
            sh[0] = ly->out;
            break;
        case DP_LAYER_CONV: {
            if (ndim != 3) return refuse(p, l, "conv needs a (C, H, W) input");
            if (ly->out < 1 || ly->kernel < 1 || ly->pad < 0)
                return refuse(p, l, "conv channels or kernel < 1, or padding < 0");
            if (ly->stride < 0) return refuse(p, l, "conv stride < 1");
            dp_conv_geom g = {sh[0],      sh[1],      sh[2],   ly->out,
                              ly->kernel, ly->kernel, ly->pad, ly->stride};
            int OH, OW;
            if ((long long)ly->pad * 2 + sh[1] > INT_MAX ||
                (long long)ly->pad * 2 + sh[2] > INT_MAX)
                return refuse(p, l, "conv padding does not fit an int");
            if ((long long)sh[1] + 2LL * ly->pad < ly->kernel ||
                (long long)sh[2] + 2LL * ly->pad < ly->kernel)
                return refuse(p, l, "conv kernel larger than the padded input");
            if (dp_conv_out(&g, &OH, &OW)) return refuse(p, l, "conv sizes do not fit an int");
            w_off[l] = off;
            if (grow(&off, (ptrdiff_t)ly->out * sh[0] * ly->kernel * ly->kernel))
                return refuse(p, l, "parameter count overflows");
            b_off[l] = off;
            if (grow(&off, ly->out)) return refuse(p, l, "parameter count overflows");
            sh[0] = ly->out;
            sh[1] = OH;
            sh[2] = OW;
            break;
        }
        case DP_LAYER_MAXPOOL2:
        case DP_LAYER_AVGPOOL2: {
            int max = ly->kind == DP_LAYER_MAXPOOL2;
            if (ndim != 3)
                return refuse(p, l,
                              max ? "max-pooling needs a (C, H, W) input"
                                  : "average pooling needs a (C, H, W) input");
            if (sh[1] < 2 || sh[2] < 2)
                return refuse(p, l,
                              max ? "max-pooling needs a map of at least 2x2"
                                  : "average pooling needs a map of at least 2x2");
            sh[1] /= 2;
            sh[2] /= 2;
            break;
        }
        case DP_LAYER_GAP:
            if (ndim != 3) return refuse(p, l, "global average pooling needs a (C, H, W) input");
            ndim = 1;
            break;
        case DP_LAYER_DROPOUT:
            if (!(ly->rate >= 0 && ly->rate < 1))
                return refuse(p, l, "dropout's rate must be in [0, 1)");
            break;
        case DP_LAYER_LAYERNORM: /* gamma, then beta: one per feature */
            w_off[l] = off;
            if (grow(&off, width)) return refuse(p, l, "parameter count overflows");
            b_off[l] = off;
            if (grow(&off, width)) return refuse(p, l, "parameter count overflows");
            break;
        case DP_LAYER_BATCHNORM: /* gamma, then beta: one per channel (per feature on (F,)) */
            w_off[l] = off;
            if (grow(&off, sh[0])) return refuse(p, l, "parameter count overflows");
            b_off[l] = off;
            if (grow(&off, sh[0])) return refuse(p, l, "parameter count overflows");
            s_off[l] = p->n_state;
            p->n_state += 2 * (ptrdiff_t)sh[0];
            break;
        case DP_LAYER_RES_BEGIN:
            if (open == MAX_NESTING) return refuse(p, l, "more than 8 residual blocks nested");
            open_at[open] = l;
            open_ndim[open] = ndim;
            memcpy(open_sh[open], sh, sizeof sh);
            open++;
            break;
        case DP_LAYER_RES_END: {
            if (open == 0) return refuse(p, l, "res_end without its res_begin");
            open--;
            res_begin[l] = open_at[open];
            int bn = open_ndim[open], *bs = open_sh[open];
            ly->kernel = 0;
            ly->stride = 1;
            ly->out = sh[0];
            if (bn == ndim && bs[0] == sh[0] && (ndim == 1 || (bs[1] == sh[1] && bs[2] == sh[2])))
                break; /* the identity */
            if (bn != 3 || ndim != 3)
                return refuse(p, l,
                              "a residual block on features must keep their number (its input "
                              "is added to its output)");
            int s = projection_stride(bs[1], bs[2], sh[1], sh[2]);
            if (!s)
                return refuse(p, l,
                              "no 1x1 projection with a stride takes the residual block's input "
                              "to its output's size");
            ly->kernel = 1;
            ly->stride = s;
            w_off[l] = off;
            if (grow(&off, (ptrdiff_t)sh[0] * bs[0]))
                return refuse(p, l, "parameter count overflows");
            b_off[l] = off;
            if (grow(&off, sh[0])) return refuse(p, l, "parameter count overflows");
            break;
        }
        case DP_LAYER_RELU:
        case DP_LAYER_TANH:
        case DP_LAYER_SIGMOID:
        case DP_LAYER_GELU: break;
        case DP_LAYER_FLATTEN:
            sh[0] = width;
            ndim = 1;
            break;
        default: return refuse(p, l, "unknown layer kind");
        }
        p->out_ndim[l] = ndim;
        for (int d = 0; d < 3; d++) p->out_shape[l][d] = d < ndim ? sh[d] : 1;
    }
    if (open)
        return refuse(p, open_at[open - 1],
                      "a residual block is not closed (res_begin without res_end)");
    p->n_params = off;
    return DP_OK;
}

/* The next layer after l that is not a FLATTEN (n_layers when none). */
static int next_layer(const dp_plan *p, int l)
{
    for (l++; l < p->n_layers && p->layer[l].kind == DP_LAYER_FLATTEN; l++) {}
    return l;
}

static int in_width_of(const dp_plan *p, int l)
{ return l == 0 ? p->in_width : flat_width(p->out_ndim[l - 1], p->out_shape[l - 1]); }

/* Layer l's input shape ((C, H, W), or (F, 1, 1)) and its ndim. */
static const int *in_shape_of(const dp_plan *p, int l, int *ndim)
{
    *ndim = l == 0 ? p->in_ndim : p->out_ndim[l - 1];
    return l == 0 ? p->in_shape : p->out_shape[l - 1];
}

/* Stage st is parameterized layer l: the next parameterized layer's index and offsets. */
static void add_param(dp_plan *p, dp_stage *st, int l, const ptrdiff_t *w_off,
                      const ptrdiff_t *b_off)
{
    st->param = p->n_param_layers;
    st->w_off = w_off[l];
    st->b_off = b_off[l];
    p->param_stage[p->n_param_layers] = p->n_stages;
    p->param_spec[p->n_param_layers] = l;
    p->n_param_layers++;
}

/* Pass 2: the stages (dp_model.h lists the patterns). */
static void plan_stages(dp_plan *p, const ptrdiff_t *w_off, const ptrdiff_t *b_off,
                        const ptrdiff_t *s_off, const int *res_begin)
{
    int n = p->n_layers, begin_stage[DP_MODEL_MAX_LAYERS];
    p->n_stages = 0;
    p->n_param_layers = 0;
    for (int l = 0; l < n; l++) {
        dp_layer_kind kind = p->layer[l].kind;
        if (kind == DP_LAYER_FLATTEN) continue;
        dp_stage st;
        memset(&st, 0, sizeof st);
        st.param = -1;
        st.first = st.last = l;
        int j = next_layer(p, l), k = j < n ? next_layer(p, j) : n;
        dp_layer_kind kj = j < n ? p->layer[j].kind : DP_LAYER_FLATTEN;
        dp_layer_kind kk = k < n ? p->layer[k].kind : DP_LAYER_FLATTEN;
        int nd;
        const int *in = in_shape_of(p, l, &nd);
        if (kind == DP_LAYER_RES_END) {
            int b = res_begin[l];
            st.op = DP_STAGE_RESEND;
            st.skip = begin_stage[b];
            p->stage[st.skip].skip = p->n_stages; /* its RES_BEGIN's: this stage */
            if (p->layer[l].kernel) {
                add_param(p, &st, l, w_off, b_off);
                const int *bs = in_shape_of(p, b, &nd);
                dp_conv_geom g = {bs[0], bs[1], bs[2], p->layer[l].out,
                                  1,     1,     0,     p->layer[l].stride};
                st.g = g;
                st.conv_h = p->out_shape[l][1];
                st.conv_w = p->out_shape[l][2];
            }
            if (is_out_act(kj)) {
                st.act = act_of(kj);
                st.last = j;
            }
        } else if (kind == DP_LAYER_RES_BEGIN) {
            st.op = DP_STAGE_RESBEGIN;
            begin_stage[l] = p->n_stages;
        } else if (kind == DP_LAYER_BATCHNORM) {
            st.op = DP_STAGE_BN;
            add_param(p, &st, l, w_off, b_off);
            st.s_off = s_off[l];
            st.g.C = in[0]; /* (F,): F channels of one value (in_shape_of pads with 1s) */
            st.g.H = in[1];
            st.g.W = in[2];
        } else if (kind == DP_LAYER_DENSE || kind == DP_LAYER_CONV || kind == DP_LAYER_LAYERNORM) {
            st.op = kind == DP_LAYER_DENSE  ? DP_STAGE_DENSE
                    : kind == DP_LAYER_CONV ? DP_STAGE_CONV
                                            : DP_STAGE_NORM;
            add_param(p, &st, l, w_off, b_off);
            if (kind == DP_LAYER_LAYERNORM) {
                /* a stage of its own: its backward needs its output's gradient as it is */
            } else if (kind == DP_LAYER_CONV && kj == DP_LAYER_RELU && kk == DP_LAYER_MAXPOOL2) {
                st.pool = 1; /* conv relu pool = conv pool relu */
                st.act = DP_ACT_RELU;
                st.last = k;
            } else if (kind == DP_LAYER_CONV && kj == DP_LAYER_MAXPOOL2) {
                st.pool = 1;
                st.last = j;
                if (is_out_act(kk)) {
                    st.act = act_of(kk);
                    st.last = k;
                }
            } else if (is_out_act(kj)) {
                st.act = act_of(kj);
                st.last = j;
            }
            if (kind == DP_LAYER_CONV) {
                const dp_layer *ly = &p->layer[l];
                dp_conv_geom g = {in[0],      in[1],      in[2],   ly->out,
                                  ly->kernel, ly->kernel, ly->pad, ly->stride};
                st.g = g;
                st.conv_h = p->out_shape[l][1];
                st.conv_w = p->out_shape[l][2];
                if (st.pool) { /* the block the pooling reads */
                    st.conv_h = st.conv_h / 2 * 2;
                    st.conv_w = st.conv_w / 2 * 2;
                }
            }
        } else if (kind == DP_LAYER_MAXPOOL2 || kind == DP_LAYER_AVGPOOL2 || kind == DP_LAYER_GAP) {
            st.op = kind == DP_LAYER_MAXPOOL2   ? DP_STAGE_POOL
                    : kind == DP_LAYER_AVGPOOL2 ? DP_STAGE_AVGPOOL
                                                : DP_STAGE_GAP;
            st.g.C = in[0];
            st.g.H = in[1];
            st.g.W = in[2];
        } else if (kind == DP_LAYER_DROPOUT) {
            st.op = DP_STAGE_DROPOUT;
            st.rate = p->layer[l].rate;
        } else {
            st.op = DP_STAGE_ACT;
            st.act = act_of(kind);
        }
        st.in_width = in_width_of(p, st.first);
        st.out_width = flat_width(p->out_ndim[st.last], p->out_shape[st.last]);
        p->stage[p->n_stages++] = st;
        l = st.last;
    }
}

int dp_model_plan(dp_plan *p, const dp_layer *layers, int n_layers, const int *in_shape,
                  int in_ndim, dp_loss loss)
{
    memset(p, 0, sizeof *p);
    p->bad_layer = -1;
    p->why = NULL;
    p->loss = loss;
    if (n_layers < 1 || n_layers > DP_MODEL_MAX_LAYERS)
        return refuse(p, -1, "between 1 and DP_MODEL_MAX_LAYERS layers");
    if (in_ndim != 1 && in_ndim != 3) return refuse(p, -1, "the input is (C, H, W) or (F,)");
    long long width = 1;
    for (int d = 0; d < in_ndim; d++) {
        if (in_shape[d] < 1) return refuse(p, -1, "an input size < 1");
        width *= in_shape[d];
        if (width > INT_MAX) return refuse(p, -1, "the input size does not fit an int");
    }
    p->n_layers = n_layers;
    memcpy(p->layer, layers, sizeof(dp_layer) * (size_t)n_layers);
    p->in_ndim = in_ndim;
    for (int d = 0; d < 3; d++) p->in_shape[d] = d < in_ndim ? in_shape[d] : 1;
    p->in_width = (int)width;
    ptrdiff_t w_off[DP_MODEL_MAX_LAYERS], b_off[DP_MODEL_MAX_LAYERS], s_off[DP_MODEL_MAX_LAYERS];
    int res_begin[DP_MODEL_MAX_LAYERS]; /* each RES_END's RES_BEGIN */
    int rc = plan_shapes(p, w_off, b_off, s_off, res_begin);
    if (rc) return rc;
    p->out_width = flat_width(p->out_ndim[n_layers - 1], p->out_shape[n_layers - 1]);
    plan_stages(p, w_off, b_off, s_off, res_begin);
    if (p->n_param_layers == 0)
        return refuse(p, n_layers, "no dense, conv, layernorm or batchnorm layer");
    switch (loss) {
    case DP_LOSS_SOFTMAX_XENT:
        if (p->out_width < 2)
            return refuse(p, n_layers, "softmax cross-entropy needs >= 2 outputs");
        break;
    case DP_LOSS_SIGMOID_BCE:
        if (p->out_width != 1) return refuse(p, n_layers, "sigmoid BCE needs exactly 1 output");
        break;
    case DP_LOSS_MSE: break;
    default: return refuse(p, n_layers, "unknown loss");
    }
    return DP_OK;
}

int dp_model_init(dp_model *m, const dp_layer *layers, int n_layers, const int *in_shape,
                  int in_ndim, dp_loss loss, int threads)
{
    memset(m, 0, sizeof *m);
    m->bad_row = -1;
    int rc = dp_model_plan(&m->plan, layers, n_layers, in_shape, in_ndim, loss);
    if (rc) return rc;
    const dp_plan *p = &m->plan;
    /* evaluate's chunk: EVAL_BYTES of activations and codes, 1 .. EVAL_MAX_ROWS rows */
    size_t per_row = 0;
    for (int s = 0; s < p->n_stages; s++)
        per_row += (size_t)p->stage[s].out_width * (sizeof(double) + 1);
    size_t rows = EVAL_BYTES / per_row;
    m->eval_rows = rows < 1 ? 1 : rows > EVAL_MAX_ROWS ? EVAL_MAX_ROWS : (int)rows;
    /* the conv stages' per-thread scratch, in elements */
    m->col_elems = m->conv_elems = m->grad_elems = 1;
    for (int s = 0; s < p->n_stages; s++) {
        const dp_stage *st = &p->stage[s];
        /* conv stages, and residual ends with a projection (a 1x1 conv) */
        if (st->op != DP_STAGE_CONV && !(st->op == DP_STAGE_RESEND && st->param >= 0)) continue;
        const dp_conv_geom *g = &st->g;
        size_t blk = (size_t)st->conv_h * (size_t)st->conv_w;
        size_t col = (size_t)g->C * g->KH * g->KW * blk + DP_CONV_COL_SLACK(g);
        size_t conv = st->pool ? (size_t)g->OC * blk : 1;
        /* the plane path's scratch (float only; its element count the larger of the two
         * dtypes': the offset tables take two floats an entry) and its packed weights, after
         * dW^T and db in grad */
        size_t planes = dp_conv_plane_elems_f32(g);
        if (planes > col) col = planes;
        size_t grad =
            (size_t)g->OC * g->C * g->KH * g->KW + (size_t)g->OC + dp_conv_pack_elems_f32(g);
        if (col > m->col_elems) m->col_elems = col;
        if (conv > m->conv_elems) m->conv_elems = conv;
        if (grad > m->grad_elems) m->grad_elems = grad;
    }
    if (p->n_state) { /* running means 0, variances 1 (PyTorch's) */
        m->state = malloc(sizeof(double) * (size_t)p->n_state);
        if (!m->state) return DP_ENOMEM;
        for (int s = 0; s < p->n_stages; s++) {
            const dp_stage *st = &p->stage[s];
            if (st->op != DP_STAGE_BN) continue;
            for (int c = 0; c < st->g.C; c++) {
                m->state[st->s_off + c] = 0;
                m->state[st->s_off + st->g.C + c] = 1;
            }
        }
    }
    if (threads < 1) threads = 1;
    if (threads > DP_MAX_THREADS) threads = DP_MAX_THREADS;
    m->threads = threads;
    m->th = calloc((size_t)threads, sizeof *m->th);
    if (!m->th) return DP_ENOMEM;
    for (int t = 0; t < threads; t++) {
        rc = dp_ctx_init(&m->th[t].ctx, 1);
        if (rc) return rc;
    }
    return dp_ctx_init(&m->ctx, threads);
}

void dp_model_set_bf16_inputs(dp_model *m, int on)
{
    m->ctx.bf16_inputs = on;
    for (int t = 0; t < m->threads; t++) m->th[t].ctx.bf16_inputs = on;
}

void dp_model_free(dp_model *m)
{
    dp_ctx_free(&m->ctx);
    if (m->th) {
        for (int t = 0; t < m->threads; t++) {
            dp_ctx_free(&m->th[t].ctx);
            dp_scratch_free(&m->th[t].col);
            dp_scratch_free(&m->th[t].conv);
            dp_scratch_free(&m->th[t].grad);
        }
        free(m->th);
        m->th = NULL;
    }
    dp_scratch_free(&m->acts);
    dp_scratch_free(&m->codes);
    dp_scratch_free(&m->grad_io);
    dp_scratch_free(&m->partials);
    dp_scratch_free(&m->stats);
    dp_scratch_free(&m->skips);
    dp_scratch_free(&m->bnrows);
    free(m->state);
    m->state = NULL;
}

/* the phases the calling thread has ended in the sweep it runs (dp_model_tmpl.h: K(phase_end)) */
static _Thread_local int sweep_phase;

#define T float
#define S _f32
#include "dp_model_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_model_tmpl.h"
#undef S
#undef T
