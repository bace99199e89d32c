/* mod_model.c - dptrain._core.Model: the fused training path the models drive (one call per
 * batch crosses the boundary) on the engine dp_model (dp_model.h), for any layer list it takes:
 *   Model(layers, input_shape, loss, params, grads, *, threads=1, gemm_inputs=None)
 * and model_plan, what Model builds without building it.
 * Parameters and gradients are the caller's flat arrays, validated once and held (held_array:
 * re-checked on every call). A backward sweep (forward_loss, then backward_layer down to 0)
 * belongs to the thread that started it.
 * Leaves out on purpose: pickling (the objects hold scratch and the caller's arrays; the
 * Python models save and load themselves), and what dp_model leaves out.
 */
#include "mod_common.h"

#include <limits.h>
#include <string.h>

#include "dp_model.h"

typedef struct {
    PyObject_HEAD
    held_array params, grads; /* re-checked on every call (see held_array) */
    PyObject *sizes;          /* tuple: flat width of the input and of every layer */
    PyObject *input_shape;    /* tuple: one input row's shape */
    PyObject *plan;           /* dict: model_plan()'s description */
    PyArrayObject *pending_x; /* the input of a backward sweep in progress (owned) */
    void *pending_data;       /* ... its memory and size when the sweep began */
    npy_intp pending_nbytes;
    unsigned long sweep_owner; /* the thread whose sweep is in flight, 0: none; read and
                                      * written only under `lock` */
    PyThread_type_lock lock;
    int ready;
    int f32;
    dp_model model;
    PyObject *exchange_fn;                   /* set_exchange's callable, or NULL */
    PyObject *exc_type, *exc_value, *exc_tb; /* what it raised inside the engine, if it did */
} ModelObject;

/* ------------------------------------------------------------------ names */

static const char *const LOSS_NAMES[] = {"softmax_xent", "sigmoid_bce", "mse"};

static int parse_loss(const char *name, dp_loss *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, LOSS_NAMES[i]) == 0) {
            *out = (dp_loss)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "loss must be 'softmax_xent', 'sigmoid_bce' or 'mse', got '%s'",
                 name);
    return -1;
}

static const struct {
    const char *name;
    dp_layer_kind kind;
    int n_ints;
} LAYER_KINDS[] = {
    {"dense", DP_LAYER_DENSE, 1}, /* (out,) */
    /* (out_channels, kernel, padding, stride); padding and stride may be left out */
    {"conv", DP_LAYER_CONV, 4},
    {"maxpool2", DP_LAYER_MAXPOOL2, 0},
    {"relu", DP_LAYER_RELU, 0},
    {"tanh", DP_LAYER_TANH, 0},
    {"sigmoid", DP_LAYER_SIGMOID, 0},
    {"gelu", DP_LAYER_GELU, 0},
    {"flatten", DP_LAYER_FLATTEN, 0},
    {"avgpool2", DP_LAYER_AVGPOOL2, 0},
    {"globalavgpool", DP_LAYER_GAP, 0},
    {"dropout", DP_LAYER_DROPOUT, 1}, /* (rate,): a float */
    {"layernorm", DP_LAYER_LAYERNORM, 0},
    {"batchnorm", DP_LAYER_BATCHNORM, 0},
    {"res_begin", DP_LAYER_RES_BEGIN, 0},
    {"res_end", DP_LAYER_RES_END, 0},
};
#define N_KINDS ((int)(sizeof LAYER_KINDS / sizeof LAYER_KINDS[0]))

static const char *kind_name(dp_layer_kind k)
{
    for (int i = 0; i < N_KINDS; i++)
        if (LAYER_KINDS[i].kind == k) return LAYER_KINDS[i].name;
    return "?";
}

/* ------------------------------------------------------------------ the object */

/* The object is built and its held arrays are still what it was built on. */
static int model_ready(ModelObject *self, int writes_grads)
{
    if (!self->ready) {
        PyErr_Format(PyExc_RuntimeError, "%s is not initialized", Py_TYPE(self)->tp_name);
        return -1;
    }
    /* forward-only calls (evaluate, logits) never touch the gradient */
    return check_held(&self->params, "Model", "params") ||
           (writes_grads && check_held(&self->grads, "Model", "grads"));
}

/* The backward sweep (forward_loss, then backward_layer for L-1 .. 0) keeps activations in
 * the object between calls, so it belongs to the thread that started it: while it is in
 * flight, another thread's call on the object is refused (MODEL_EBUSY) instead of silently
 * replacing the activations that the owner's next backward_layer reads; once that thread has
 * ended, the sweep is abandoned and the next call takes it back (model_reclaim_sweep). Fused
 * calls (loss_grad, evaluate, logits) from threads with no sweep in flight serialize on the
 * lock. */
#define MODEL_EBUSY (-100)

static PyObject *model_busy_error(const char *method)
{
    return PyErr_Format(PyExc_RuntimeError,
                        "Model.%s: a backward sweep (forward_loss, then backward_layer down to 0) "
                        "started by another thread is in progress on this object; finish it in "
                        "that thread first, or give each thread its own Model",
                        method);
}

/* The end of a sweep (or of a call that replaced it): drop the input it held. */
static void model_end_sweep(ModelObject *self)
{
    Py_CLEAR(self->pending_x);
    self->pending_data = NULL;
    self->pending_nbytes = 0;
}

/* A sweep whose thread has ended can never be finished: 1 when `owner` (the sweep_owner a
 * refused call saw) is no thread of this interpreter any more and its sweep was taken back
 * (under the lock, if it is still that one's), so that the call can be made again; else 0.
 * Needs the GIL (the thread states are read under it). */
static int model_reclaim_sweep(ModelObject *self, unsigned long owner)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts))
        if (ts->thread_id == owner) return 0;
    WITHOUT_GIL_LOCKED(
        self->lock, if (self->sweep_owner == owner) {
            self->sweep_owner = 0;
            self->model.pending = 0; /* the engine's own mark of an abandoned sweep */
        });
    model_end_sweep(self);
    return 1;
}

int model_team(PyObject *model, dp_threads **team, PyThread_type_lock *lock)
{
    ModelObject *self = (ModelObject *)model;
    if (!self->ready) return 0;
    *team = self->model.ctx.team;
    *lock = self->lock;
    return 1;
}

static int is_mse(const ModelObject *self) { return self->model.plan.loss == DP_LOSS_MSE; }

/* x (B, IN) of the model's dtype, and the batch's targets: int64 labels (B,) for the
 * classification losses, (B, OUT) values of the model's dtype for mse. The targets are
 * optional when `need_labels` is 0 (Py_None or NULL: *l = NULL). */
static int model_batch(ModelObject *self, PyObject *xo, PyObject *lo, PyArrayObject **x,
                       PyArrayObject **l, int writes_grads, int need_labels)
{
    if (model_ready(self, writes_grads)) return -1;
    if (!(*x = check_array(xo, "x", self->params.typenum, 2, 0))) return -1;
    const dp_plan *p = &self->model.plan;
    npy_intp B = PyArray_DIM(*x, 0), xd[2] = {B, p->in_width};
    if (check_shape(*x, "x", 2, xd)) return -1;
    *l = NULL;
    if (!lo || lo == Py_None) {
        if (need_labels)
            PyErr_Format(PyExc_TypeError,
                         is_mse(self) ? "targets must be a %s array, got None"
                                      : "labels must be an int64 array, got None",
                         typenum_name(self->params.typenum));
        return need_labels ? -1 : 0;
    }
    if (is_mse(self)) {
        npy_intp td[2] = {B, p->out_width};
        if (!(*l = check_array(lo, "targets", self->params.typenum, 2, 0)) ||
            check_shape(*l, "targets", 2, td))
            return -1;
    } else {
        npy_intp ld[1] = {B};
        if (!(*l = check_array(lo, "labels", NPY_INT64, 1, 0)) || check_shape(*l, "labels", 1, ld))
            return -1;
    }
    return 0;
}

/* The gradient buffer of a call: the held one, or another of the same layout (e.g. one per
 * chunk of a global batch). */
static PyArrayObject *model_grads(ModelObject *self, PyObject *go, PyArrayObject *x,
                                  PyArrayObject *labels)
{
    PyArrayObject *grads = self->grads.arr;
    if (go && go != Py_None) {
        npy_intp pn[1] = {self->model.plan.n_params};
        if (!(grads = check_array(go, "grads", self->params.typenum, 1, 1)) ||
            check_shape(grads, "grads", 1, pn) ||
            check_no_overlap(grads, "grads", self->params.arr, "params"))
            return NULL;
    }
    /* the gradient is written while x and the labels / targets are read */
    if ((x && check_no_overlap(grads, "grads", x, "x")) ||
        (labels && check_no_overlap(grads, "grads", labels, is_mse(self) ? "targets" : "labels")))
        return NULL;
    return grads;
}

/* The exception of a failed kernel call: labels out of range, or the code's own message. */
static PyObject *model_error(ModelObject *self, int rc, PyArrayObject *labels, const char *method)
{
    if (rc == DP_EEXCHANGE) { /* what the exchange raised, as it raised it */
        if (self->exc_type) {
            PyErr_Restore(self->exc_type, self->exc_value, self->exc_tb);
            self->exc_type = self->exc_value = self->exc_tb = NULL;
            return NULL;
        }
        return PyErr_Format(PyExc_RuntimeError, "Model.%s: a batch norm's exchange failed", method);
    }
    if (rc == DP_EBNSINGLE)
        return PyErr_Format(PyExc_ValueError,
                            "Model.%s: a batch norm in training got one value per channel (a "
                            "batch of 1 row into a batch norm on features, or on 1x1 maps): its "
                            "variance is 0 and its gradient only rounding. Train on batches of 2 "
                            "rows or more (an epoch's last batch has n %% batch_size rows), as "
                            "PyTorch requires too",
                            method);
    if (rc == DP_ELABEL && labels) {
        const dp_plan *p = &self->model.plan;
        label_error(labels, p->loss == DP_LOSS_SIGMOID_BCE ? 2 : p->out_width);
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof what, "Model.%s", method);
    return raise_code(rc, what);
}

/* The engine's entry points for the object's dtype. */
static int run_loss_grad(ModelObject *s, void *g, double *loss, int64_t *c, const void *x,
                         PyArrayObject *l, int B, double gs)
{
    const void *lab = l && !is_mse(s) ? PyArray_DATA(l) : NULL;
    const void *tgt = l && is_mse(s) ? PyArray_DATA(l) : NULL;
    return s->f32
               ? dp_model_loss_grad_f32(&s->model, g, loss, c, s->params.data, x, lab, tgt, B,
                                        (float)gs)
               : dp_model_loss_grad_f64(&s->model, g, loss, c, s->params.data, x, lab, tgt, B, gs);
}

static int run_forward_loss(ModelObject *s, double *loss, int64_t *c, const void *x,
                            PyArrayObject *l, int B, double gs)
{
    const void *lab = l && !is_mse(s) ? PyArray_DATA(l) : NULL;
    const void *tgt = l && is_mse(s) ? PyArray_DATA(l) : NULL;
    return s->f32
               ? dp_model_forward_loss_f32(&s->model, loss, c, s->params.data, x, lab, tgt, B,
                                           (float)gs)
               : dp_model_forward_loss_f64(&s->model, loss, c, s->params.data, x, lab, tgt, B, gs);
}

static int run_evaluate(ModelObject *s, void *out, double *loss, int64_t *c, const void *x,
                        PyArrayObject *l, int B)
{
    const void *lab = l && !is_mse(s) ? PyArray_DATA(l) : NULL;
    const void *tgt = l && is_mse(s) ? PyArray_DATA(l) : NULL;
    return s->f32 ? dp_model_evaluate_f32(&s->model, out, loss, c, s->params.data, x, lab, tgt, B)
                  : dp_model_evaluate_f64(&s->model, out, loss, c, s->params.data, x, lab, tgt, B);
}

static PyObject *Model_loss_grad(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "labels", "grad_scale", "grads", NULL};
    PyObject *xo, *lo, *gso = Py_None, *go = Py_None;
    if (parse_args(args, nargs, kwnames, "OO|OO:loss_grad", kwlist, &xo, &lo, &gso, &go))
        return NULL;
    PyArrayObject *x, *l, *grads;
    double gs;
    if (model_batch(self, xo, lo, &x, &l, 1, 1)) return NULL;
    npy_intp B = PyArray_DIM(x, 0);
    if (get_grad_scale(gso, B, &gs) || !(grads = model_grads(self, go, x, l))) return NULL;
    double loss = 0;
    int64_t correct = 0;
    int rc;
    unsigned long me = PyThread_get_thread_ident(), busy = 0;
again: /* a whole sweep: one of this thread's in progress ends here (the engine says so too) */
    WITHOUT_GIL_LOCKED(
        self->lock,
        if (self->sweep_owner && self->sweep_owner != me) {
            rc = MODEL_EBUSY;
            busy = self->sweep_owner;
        } else {
            rc = run_loss_grad(self, PyArray_DATA(grads), &loss, &correct, PyArray_DATA(x), l,
                               (int)B, gs);
            self->sweep_owner = 0;
        });
    if (rc == MODEL_EBUSY && model_reclaim_sweep(self, busy)) goto again;
    if (rc == MODEL_EBUSY) return model_busy_error("loss_grad");
    model_end_sweep(self);
    if (rc) return model_error(self, rc, l, "loss_grad");
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Model_forward_loss(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "labels", "grad_scale", NULL};
    PyObject *xo, *lo, *gso = Py_None;
    if (parse_args(args, nargs, kwnames, "OO|O:forward_loss", kwlist, &xo, &lo, &gso)) return NULL;
    PyArrayObject *x, *l;
    double gs;
    if (model_batch(self, xo, lo, &x, &l, 1, 1)) return NULL;
    npy_intp B = PyArray_DIM(x, 0);
    if (get_grad_scale(gso, B, &gs)) return NULL;
    double loss = 0;
    int64_t correct = 0;
    int rc, pending = 0;
    unsigned long me = PyThread_get_thread_ident(), busy = 0;
again:
    WITHOUT_GIL_LOCKED(
        self->lock,
        if (self->sweep_owner && self->sweep_owner != me) {
            rc = MODEL_EBUSY;
            busy = self->sweep_owner;
        } else {
            rc = run_forward_loss(self, &loss, &correct, PyArray_DATA(x), l, (int)B, gs);
            pending = rc == 0 && self->model.pending;
            self->sweep_owner = pending ? me : 0;
        });
    if (rc == MODEL_EBUSY && model_reclaim_sweep(self, busy)) goto again;
    if (rc == MODEL_EBUSY) return model_busy_error("forward_loss");
    model_end_sweep(self); /* this thread's earlier sweep, if any, is replaced */
    if (rc) return model_error(self, rc, l, "forward_loss");
    if (pending) { /* backward_layer(0) reads x: keep it alive */
        Py_INCREF(x);
        self->pending_x = x;
        self->pending_data = PyArray_DATA(x);
        self->pending_nbytes = PyArray_NBYTES(x);
    }
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Model_backward_layer(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    static const char *const kwlist[] = {"layer", "grads", NULL};
    int layer;
    PyObject *go = Py_None;
    if (parse_args(args, nargs, kwnames, "i|O:backward_layer", kwlist, &layer, &go)) return NULL;
    if (model_ready(self, 1)) return NULL;
    PyArrayObject *px = self->pending_x;
    if (px &&
        (PyArray_DATA(px) != self->pending_data || PyArray_NBYTES(px) != self->pending_nbytes))
        return PyErr_Format(PyExc_ValueError,
                            "backward_layer(%d): the x given to forward_loss was "
                            "resized or moved since; call forward_loss again",
                            layer),
               NULL;
    PyArrayObject *grads = model_grads(self, go, px, NULL);
    if (!grads) return NULL;
    int rc, ended = 0, next = -1, owned_by_other = 0;
    unsigned long me = PyThread_get_thread_ident(), busy = 0;
again:
    WITHOUT_GIL_LOCKED(
        self->lock,
        if (self->sweep_owner != me) {
            owned_by_other = self->sweep_owner != 0;
            busy = self->sweep_owner;
            rc = DP_EORDER;
        } else {
            rc = self->f32 ? dp_model_backward_layer_f32(&self->model, PyArray_DATA(grads),
                                                         self->params.data, layer)
                           : dp_model_backward_layer_f64(&self->model, PyArray_DATA(grads),
                                                         self->params.data, layer);
            ended = !self->model.pending;
            if (ended) self->sweep_owner = 0;
            next = self->model.next_layer;
        });
    if (owned_by_other && model_reclaim_sweep(self, busy)) {
        owned_by_other = 0;
        goto again;
    }
    if (owned_by_other) return model_busy_error("backward_layer");
    if (rc == DP_EORDER) {
        if (next < 0)
            return PyErr_Format(PyExc_RuntimeError,
                                "backward_layer(%d): no forward_loss to go back from", layer),
                   NULL;
        return PyErr_Format(PyExc_RuntimeError,
                            "backward_layer(%d) out of order: the next layer is %d", layer, next),
               NULL;
    }
    if (ended) model_end_sweep(self);
    if (rc) return model_error(self, rc, NULL, "backward_layer");
    Py_RETURN_NONE;
}

/* The engine's exchange (dp_model_exchange_fn): the callable on a float64 copy of buf, with
 * the GIL, then the copy back. What it raises is kept for the method to raise. */
static int model_exchange(void *ctx, double *buf, int n)
{
    ModelObject *self = ctx;
    PyGILState_STATE gil = PyGILState_Ensure();
    npy_intp dims[1] = {n};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_FLOAT64), *r = NULL;
    if (arr) {
        memcpy(PyArray_DATA((PyArrayObject *)arr), buf, sizeof(double) * (size_t)n);
        r = PyObject_CallOneArg(self->exchange_fn, arr);
    }
    int rc = r ? 0 : -1;
    if (r) memcpy(buf, PyArray_DATA((PyArrayObject *)arr), sizeof(double) * (size_t)n);
    if (rc) {
        if (!self->exc_type)
            PyErr_Fetch(&self->exc_type, &self->exc_value, &self->exc_tb);
        else
            PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_XDECREF(arr);
    PyGILState_Release(gil);
    return rc;
}

static PyObject *Model_set_exchange(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    static const char *const kwlist[] = {"fn", NULL};
    PyObject *fn;
    if (parse_args(args, nargs, kwnames, "O:set_exchange", kwlist, &fn)) return NULL;
    if (model_ready(self, 0)) return NULL;
    if (fn != Py_None && !PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "set_exchange: fn must be callable or None, got %s",
                            Py_TYPE(fn)->tp_name),
               NULL;
    PyObject *old = self->exchange_fn;
    Py_XINCREF(fn == Py_None ? NULL : fn);
    WITHOUT_GIL_LOCKED(self->lock, {
        self->exchange_fn = fn == Py_None ? NULL : fn;
        self->model.exchange = fn == Py_None ? NULL : model_exchange;
        self->model.exchange_ctx = self;
    });
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *Model_set_rng(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    static const char *const kwlist[] = {"seed", "step", "row0", NULL};
    PyObject *so, *to, *ro;
    if (parse_args(args, nargs, kwnames, "OOO:set_rng", kwlist, &so, &to, &ro)) return NULL;
    if (model_ready(self, 0)) return NULL;
    PyObject *objs[3] = {so, to, ro};
    long long vals[3];
    for (int i = 0; i < 3; i++) {
        PyObject *index = PyNumber_Index(objs[i]);
        if (!index) return NULL;
        int overflow;
        vals[i] = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        if (overflow || (i > 0 && vals[i] < 0) || (vals[i] == -1 && PyErr_Occurred()))
            return PyErr_Format(PyExc_ValueError, "set_rng: %s must be %s int64, got %R", kwlist[i],
                                i ? "a non-negative" : "an", objs[i]),
                   NULL;
    }
    WITHOUT_GIL_LOCKED(self->lock, {
        self->model.rng_seed = (uint64_t)vals[0];
        self->model.rng_step = vals[1];
        self->model.rng_row0 = vals[2];
    });
    Py_RETURN_NONE;
}

/* evaluate and logits: forward only, in chunks. The engine reuses the activation scratch, so
 * a backward sweep in progress ends here (the engine says so too: no pending rows after). */
static PyObject *model_forward_only(ModelObject *self, PyObject *xo, PyObject *lo, PyObject *oo,
                                    const char *method)
{
    PyArrayObject *x, *l, *o = NULL;
    if (model_batch(self, xo, lo, &x, &l, 0, lo != NULL)) return NULL;
    if (oo) {
        npy_intp od[2] = {PyArray_DIM(x, 0), self->model.plan.out_width};
        if (!(o = check_array(oo, "out", self->params.typenum, 2, 1)) ||
            check_shape(o, "out", 2, od) || check_no_overlap(o, "out", x, "x") ||
            check_no_overlap(o, "out", self->params.arr, "params"))
            return NULL;
    }
    double loss = 0;
    int64_t correct = 0;
    int rc, B = (int)PyArray_DIM(x, 0);
    unsigned long me = PyThread_get_thread_ident(), busy = 0;
again:
    WITHOUT_GIL_LOCKED(
        self->lock,
        if (self->sweep_owner && self->sweep_owner != me) {
            rc = MODEL_EBUSY;
            busy = self->sweep_owner;
        } else {
            rc = run_evaluate(self, o ? PyArray_DATA(o) : NULL, &loss, &correct, PyArray_DATA(x), l,
                              B);
            self->sweep_owner = 0;
        });
    if (rc == MODEL_EBUSY && model_reclaim_sweep(self, busy)) goto again;
    if (rc == MODEL_EBUSY) return model_busy_error(method);
    model_end_sweep(self);
    if (rc) return model_error(self, rc, l, method);
    if (o) Py_RETURN_NONE;
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Model_evaluate(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "labels", NULL};
    PyObject *xo, *lo;
    if (parse_args(args, nargs, kwnames, "OO:evaluate", kwlist, &xo, &lo)) return NULL;
    return model_forward_only(self, xo, lo, NULL, "evaluate");
}

static PyObject *Model_logits(ModelObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "out", NULL};
    PyObject *xo, *oo;
    if (parse_args(args, nargs, kwnames, "OO:logits", kwlist, &xo, &oo)) return NULL;
    return model_forward_only(self, xo, NULL, oo, "logits");
}

static PyObject *held(PyObject *o)
{
    o = o ? o : Py_None;
    Py_INCREF(o);
    return o;
}
static PyObject *Model_get_params(ModelObject *self, void *c)
{ return held((PyObject *)self->params.arr); }
static PyObject *Model_get_grads(ModelObject *self, void *c)
{ return held((PyObject *)self->grads.arr); }
static PyObject *Model_get_sizes(ModelObject *self, void *c) { return held(self->sizes); }
static PyObject *Model_get_input_shape(ModelObject *self, void *c)
{ return held(self->input_shape); }
static PyObject *Model_get_plan(ModelObject *self, void *c) { return held(self->plan); }
static PyObject *Model_get_threads(ModelObject *self, void *c)
{ return PyLong_FromLong(self->ready ? self->model.threads : 0); }
static PyObject *Model_get_team_jobs(ModelObject *self, void *c)
{ return PyLong_FromUnsignedLongLong(self->ready ? dp_threads_jobs(self->model.ctx.team) : 0); }
static PyObject *Model_get_gemm_inputs(ModelObject *self, void *c)
{
    if (self->ready && self->model.ctx.bf16_inputs) return PyUnicode_FromString("bfloat16");
    Py_RETURN_NONE;
}
static PyObject *Model_get_n_params(ModelObject *self, void *c)
{ return PyLong_FromSsize_t(self->model.plan.n_params); }
static PyObject *Model_get_state(ModelObject *self, void *c)
{
    if (!self->ready) Py_RETURN_NONE;
    npy_intp dims[1] = {(npy_intp)self->model.plan.n_state};
    if (!dims[0]) return PyArray_ZEROS(1, dims, NPY_FLOAT64, 0);
    PyObject *arr = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT64, self->model.state);
    if (!arr) return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self)) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *Model_get_n_param_layers(ModelObject *self, void *c)
{ return PyLong_FromLong(self->model.plan.n_param_layers); }
static PyObject *Model_get_loss(ModelObject *self, void *c)
{
    if (!self->ready) Py_RETURN_NONE;
    return PyUnicode_FromString(LOSS_NAMES[self->model.plan.loss]);
}

static void Model_dealloc(ModelObject *self)
{
    if (self->ready) dp_model_free(&self->model);
    Py_XDECREF(self->exchange_fn);
    Py_XDECREF(self->exc_type);
    Py_XDECREF(self->exc_value);
    Py_XDECREF(self->exc_tb);
    Py_XDECREF(self->params.arr);
    Py_XDECREF(self->grads.arr);
    Py_XDECREF(self->sizes);
    Py_XDECREF(self->input_shape);
    Py_XDECREF(self->plan);
    Py_XDECREF(self->pending_x);
    if (self->lock) PyThread_free_lock(self->lock);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type); /* a heap type: each instance holds a reference to it */
}

static PyMethodDef Model_methods[] = {
    {"loss_grad", FASTFN(Model_loss_grad), FASTKW,
     "loss_grad(x, labels, grad_scale=None, grads=None) -> (loss_sum, n_correct)\n\nForward and "
     "backward on one batch; ACCUMULATES d(grad_scale * sum of losses)/d params into grads (the "
     "held buffer, or the one given; grad_scale defaults to 1/B). labels: int64 (B,) class "
     "labels, or for loss 'mse' the (B, OUT) targets of the model's dtype (n_correct is then 0)."},
    {"forward_loss", FASTFN(Model_forward_loss), FASTKW,
     "forward_loss(x, labels, grad_scale=None) -> (loss_sum, n_correct): the first half of "
     "loss_grad; then backward_layer(L-1), ..., backward_layer(0) finish it (L: the dense and "
     "conv layers)"},
    {"set_exchange", FASTFN(Model_set_exchange), FASTKW,
     "set_exchange(fn): batch norm's statistics over the workers: fn(buf) sums the float64 "
     "array buf over every worker in place (an all-reduce), called in each training forward "
     "and backward at each batch norm (None: this call's rows are the batch)"},
    {"set_rng", FASTFN(Model_set_rng), FASTKW,
     "set_rng(seed, step, row0): the key of dropout's masks for the next forward_loss / "
     "loss_grad: row i of the batch is the sample at global index row0 + i of training step "
     "`step` (csrc/dp_layers.h)"},
    {"backward_layer", FASTFN(Model_backward_layer), FASTKW,
     "backward_layer(layer, grads=None): one backward step, last parameterized layer first; "
     "that layer's gradient is final when it returns"},
    {"evaluate", FASTFN(Model_evaluate), FASTKW,
     "evaluate(x, labels) -> (loss_sum, n_correct): forward only, in chunks."},
    {"logits", FASTFN(Model_logits), FASTKW,
     "logits(x, out): writes the (B, OUT) outputs (OUT: the classes, 1 for sigmoid_bce)."},
    {NULL},
};

/* ------------------------------------------------------------------ building */

static PyObject *plan_dict(const dp_plan *p);

/* Checks params and grads against the plan, then builds the engine and holds the arrays.
 * On failure the object stays unready (dealloc frees what was made). */
static int model_build(ModelObject *self, const dp_layer *layers, int n_layers, const int *in_shape,
                       int in_ndim, dp_loss loss, int threads, PyObject *po, PyObject *go)
{
    if (threads < 1 || threads > DP_MAX_THREADS)
        return PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", DP_MAX_THREADS,
                            threads),
               -1;
    PyArrayObject *p, *g;
    npy_intp pn[1] = {self->model.plan.n_params};
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 0)) ||
        !(g = check_array(go, "grads", NPY_NOTYPE, 1, 1)) ||
        check_same_dtype(g, "grads", p, "params") || check_shape(p, "params", 1, pn) ||
        check_shape(g, "grads", 1, pn) || check_no_overlap(g, "grads", p, "params"))
        return -1;
    if (!self->lock && !(self->lock = PyThread_allocate_lock())) return PyErr_NoMemory(), -1;
    int err = dp_model_init(&self->model, layers, n_layers, in_shape, in_ndim, loss, threads);
    if (err) {
        dp_model_free(&self->model);
        raise_code(err, "Model");
        return -1;
    }
    hold_array(&self->params, p, 0);
    hold_array(&self->grads, g, 1);
    self->f32 = IS_F32(p);
    self->ready = 1;
    return (self->plan = plan_dict(&self->model.plan)) ? 0 : -1; /* ready: dealloc frees */
}

/* A tuple of ints from n C ints. */
static PyObject *int_tuple(const int *v, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *o = PyLong_FromLong(v[i]);
        if (!o) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

static int flat(const int *shape, int ndim)
{ return ndim == 3 ? shape[0] * shape[1] * shape[2] : shape[0]; }

/* The input's flat width, then each layer's output width. */
static PyObject *widths_tuple(const dp_plan *p)
{
    int n = p->n_layers;
    PyObject *t = PyTuple_New(n + 1);
    if (!t) return NULL;
    for (int i = 0; i <= n; i++) {
        int w = i == 0 ? p->in_width : flat(p->out_shape[i - 1], p->out_ndim[i - 1]);
        PyObject *o = PyLong_FromLong(w);
        if (!o) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

/* ------------------------------------------------------------------ Model */

/* One layer spec: a kind name, or a sequence (name, ints...) as LAYER_KINDS lists. */
static int parse_layer(PyObject *item, Py_ssize_t i, dp_layer *out)
{
    memset(out, 0, sizeof *out);
    PyObject *seq = NULL, *name_obj = item;
    Py_ssize_t n = 1;
    if (!PyUnicode_Check(item)) {
        if (!PySequence_Check(item) || !(seq = PySequence_Tuple(item))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "layers[%zd] must be a layer name or a tuple (name, sizes...), "
                         "got %s",
                         i, Py_TYPE(item)->tp_name);
            return -1;
        }
        n = PyTuple_GET_SIZE(seq);
        name_obj = n ? PyTuple_GET_ITEM(seq, 0) : NULL;
        if (!name_obj || !PyUnicode_Check(name_obj)) {
            PyErr_Format(PyExc_TypeError,
                         "layers[%zd] = %R: the first entry must be the layer's name", i, item);
            Py_DECREF(seq);
            return -1;
        }
    }
    /* compared as str, not as a C string: 'relu\0x' is no 'relu', and a name that has no
     * UTF-8 form (a lone surrogate) is unknown like any other */
    int k = -1;
    for (int j = 0; j < N_KINDS; j++)
        if (PyUnicode_CompareWithASCIIString(name_obj, LAYER_KINDS[j].name) == 0) k = j;
    if (k < 0) {
        PyErr_Format(PyExc_ValueError,
                     "layers[%zd]: unknown layer %R (known: dense, conv, maxpool2, "
                     "relu, tanh, sigmoid, gelu, flatten, avgpool2, globalavgpool, dropout, "
                     "layernorm, batchnorm, res_begin, res_end)",
                     i, name_obj);
        Py_XDECREF(seq);
        return -1;
    }
    const char *name = LAYER_KINDS[k].name;
    int want = LAYER_KINDS[k].n_ints, vals[4] = {0, 0, 0, 1};
    /* conv: padding and stride optional */
    int min_given = LAYER_KINDS[k].kind == DP_LAYER_CONV ? 2 : want;
    if (n - 1 < min_given || n - 1 > want) {
        PyErr_Format(PyExc_ValueError, "layers[%zd] = %R: '%s' takes %s", i, item, name,
                     want == 0                                 ? "no sizes"
                     : LAYER_KINDS[k].kind == DP_LAYER_DROPOUT ? "one rate: ('dropout', p)"
                     : want == 1                               ? "one size: ('dense', out_features)"
                                                               : "('conv', out_channels, kernel[, "
                                                                 "padding[, stride]])");
        Py_XDECREF(seq);
        return -1;
    }
    if (LAYER_KINDS[k].kind == DP_LAYER_DROPOUT) {
        PyObject *v = PyTuple_GET_ITEM(seq, 1);
        double rate = PyFloat_AsDouble(v);
        if ((rate == -1.0 && PyErr_Occurred()) || PyBool_Check(v)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "layers[%zd] = %R: dropout's rate must be a number, got %s", i, item,
                         Py_TYPE(v)->tp_name);
            Py_DECREF(seq);
            return -1;
        }
        Py_DECREF(seq);
        if (!(rate >= 0 && rate < 1)) {
            PyErr_Format(PyExc_ValueError, "layers[%zd] = %R: dropout's rate must be in [0, 1)", i,
                         item);
            return -1;
        }
        out->kind = DP_LAYER_DROPOUT;
        out->rate = rate;
        return 0;
    }
    for (Py_ssize_t j = 1; j < n; j++) {
        PyObject *v = PyTuple_GET_ITEM(seq, j);
        PyObject *index = PyNumber_Index(v); /* int, numpy integers; not float */
        if (!index) {
            PyErr_Format(PyExc_TypeError, "layers[%zd] = %R: sizes must be ints, got %s", i, item,
                         Py_TYPE(v)->tp_name);
            Py_DECREF(seq);
            return -1;
        }
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        int lowest = LAYER_KINDS[k].kind == DP_LAYER_CONV && j == 3 ? 0 : 1;
        if (overflow || x < lowest || x > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "layers[%zd] = %R: %s must be %d..%d", i, item,
                         j == 4   ? "the stride"
                         : j == 3 ? "padding"
                         : j == 2 ? "the kernel size"
                                  : "the output size",
                         lowest, INT_MAX);
            Py_DECREF(seq);
            return -1;
        }
        vals[j - 1] = (int)x;
    }
    Py_XDECREF(seq);
    out->kind = LAYER_KINDS[k].kind;
    out->out = vals[0];
    out->kernel = vals[1];
    out->pad = vals[2];
    out->stride = vals[3];
    return 0;
}

/* An input shape: (F,) or (C, H, W) of positive ints. */
static int parse_shape(PyObject *obj, int *shape, int *ndim)
{
    PyObject *seq = PySequence_Check(obj) && !PyUnicode_Check(obj) ? PySequence_Tuple(obj) : NULL;
    if (!seq) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError,
                            "input_shape must be a tuple (F,) or (C, H, W), got %s",
                            Py_TYPE(obj)->tp_name),
               -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    int rc = -1;
    if (n != 1 && n != 3) {
        PyErr_Format(PyExc_ValueError, "input_shape %R has %zd entries, expected (F,) or (C, H, W)",
                     obj, n);
        goto done;
    }
    for (Py_ssize_t d = 0; d < n; d++) {
        PyObject *index = PyNumber_Index(PyTuple_GET_ITEM(seq, d));
        if (!index) {
            PyErr_Format(PyExc_TypeError, "input_shape %R: sizes must be ints", obj);
            goto done;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        if (overflow || v < 1 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "input_shape %R: sizes must be positive ints", obj);
            goto done;
        }
        shape[d] = (int)v;
    }
    *ndim = (int)n;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* "(C, H, W)" or "(F,)", as Python writes the tuple. */
static void shape_text(char *buf, size_t size, const int *shape, int ndim)
{
    if (ndim == 3)
        snprintf(buf, size, "(%d, %d, %d)", shape[0], shape[1], shape[2]);
    else
        snprintf(buf, size, "(%d,)", shape[0]);
}

/* layers, input_shape and loss into a plan; a ValueError naming the layer at fault. */
static int parse_model(PyObject *lo, PyObject *so, const char *loss_name, dp_layer *layers,
                       int *n_layers, int *shape, int *ndim, dp_loss *loss, dp_plan *plan)
{
    if (parse_loss(loss_name, loss) || parse_shape(so, shape, ndim)) return -1;
    PyObject *seq = PySequence_Check(lo) && !PyUnicode_Check(lo) ? PySequence_Fast(lo, "") : NULL;
    if (!seq) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "layers must be a list of layer specs, got %s",
                            Py_TYPE(lo)->tp_name),
               -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > DP_MODEL_MAX_LAYERS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "layers has %zd entries, expected 1 to %d", n,
                            DP_MODEL_MAX_LAYERS),
               -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_layer(PySequence_Fast_GET_ITEM(seq, i), i, &layers[i])) {
            Py_DECREF(seq);
            return -1;
        }
    Py_DECREF(seq);
    *n_layers = (int)n;
    if (dp_model_plan(plan, layers, (int)n, shape, *ndim, *loss) == DP_OK) return 0;
    int l = plan->bad_layer;
    const char *why = plan->why ? plan->why : "invalid";
    if (l >= 0 && l < n) {
        char s[48];
        shape_text(s, sizeof s, l ? plan->out_shape[l - 1] : shape,
                   l ? plan->out_ndim[l - 1] : *ndim);
        PyErr_Format(PyExc_ValueError, "layers[%d] ('%s') gets a %s input: %s", l,
                     kind_name(layers[l].kind), s, why);
    } else if (l == n && plan->n_param_layers == 0) {
        PyErr_SetString(
            PyExc_ValueError,
            "layers has no dense, conv, layernorm or batchnorm layer: nothing to train");
    } else if (l == n) {
        char s[48];
        shape_text(s, sizeof s, plan->out_shape[n - 1], plan->out_ndim[n - 1]);
        PyErr_Format(PyExc_ValueError,
                     "loss '%s' on this model: %s, but layers[%d] ('%s') gives %s", loss_name, why,
                     (int)n - 1, kind_name(layers[n - 1].kind), s);
    } else {
        PyErr_Format(PyExc_ValueError, "input_shape %R: %s", so, why);
    }
    return -1;
}

static PyObject *layer_tuple(const dp_layer *ly)
{
    switch (ly->kind) {
    case DP_LAYER_DENSE: return Py_BuildValue("(si)", "dense", ly->out);
    case DP_LAYER_CONV:
        /* stride 1 is left out: the spec of a conv without one */
        if (ly->stride > 1)
            return Py_BuildValue("(siiii)", "conv", ly->out, ly->kernel, ly->pad, ly->stride);
        return Py_BuildValue("(siii)", "conv", ly->out, ly->kernel, ly->pad);
    case DP_LAYER_DROPOUT: return Py_BuildValue("(sd)", "dropout", ly->rate);
    default: return Py_BuildValue("(s)", kind_name(ly->kind));
    }
}

/* model_plan()'s dict: what the layers become (see its docstring). */
static PyObject *plan_dict(const dp_plan *p)
{
    PyObject *d = PyDict_New(), *layers = PyList_New(p->n_layers),
             *shapes = PyList_New(p->n_layers);
    PyObject *params = PyList_New(0), *stages = PyList_New(p->n_stages), *v = NULL;
    if (!d || !layers || !shapes || !params || !stages) goto fail;
    for (int l = 0; l < p->n_layers; l++) {
        PyObject *t = layer_tuple(&p->layer[l]), *s = int_tuple(p->out_shape[l], p->out_ndim[l]);
        if (!t || !s) {
            Py_XDECREF(t);
            Py_XDECREF(s);
            goto fail;
        }
        PyList_SET_ITEM(layers, l, t);
        PyList_SET_ITEM(shapes, l, s);
    }
    for (int s = 0; s < p->n_stages; s++) {
        const dp_stage *st = &p->stage[s];
        PyObject *names = PyList_New(0), *sep = NULL, *joined = NULL, *t = NULL;
        for (int l = st->first; names && l <= st->last; l++) {
            if (p->layer[l].kind == DP_LAYER_FLATTEN) continue;
            PyObject *nm = PyUnicode_FromString(kind_name(p->layer[l].kind));
            if (!nm || PyList_Append(names, nm)) {
                Py_XDECREF(nm);
                Py_CLEAR(names);
                break;
            }
            Py_DECREF(nm);
        }
        if (names && (sep = PyUnicode_FromString("+")) && (joined = PyUnicode_Join(sep, names)))
            t = Py_BuildValue("{s:O,s:(ii)}", "ops", joined, "layers", st->first, st->last);
        Py_XDECREF(names);
        Py_XDECREF(sep);
        Py_XDECREF(joined);
        if (!t) goto fail;
        PyList_SET_ITEM(stages, s, t);
        if (st->param >= 0) {
            const dp_layer *ly = &p->layer[p->param_spec[st->param]];
            int in_w = st->in_width;
            int n_b = ly->kind == DP_LAYER_LAYERNORM   ? in_w
                      : ly->kind == DP_LAYER_BATCHNORM ? st->g.C
                                                       : ly->out;
            PyObject *wshape =
                ly->kind == DP_LAYER_DENSE ? Py_BuildValue("(ii)", ly->out, in_w)
                : ly->kind == DP_LAYER_CONV
                    ? Py_BuildValue("(iiii)", ly->out, st->g.C, ly->kernel, ly->kernel)
                : ly->kind == DP_LAYER_RES_END ? Py_BuildValue("(iiii)", ly->out, st->g.C, 1, 1)
                                               : Py_BuildValue("(i)", n_b);
            PyObject *e =
                wshape ? Py_BuildValue("{s:i,s:n,s:O,s:n,s:(i)}", "layer", p->param_spec[st->param],
                                       "weight", (Py_ssize_t)st->w_off, "weight_shape", wshape,
                                       "bias", (Py_ssize_t)st->b_off, "bias_shape", n_b)
                       : NULL;
            Py_XDECREF(wshape);
            if (!e || PyList_Append(params, e)) {
                Py_XDECREF(e);
                goto fail;
            }
            Py_DECREF(e);
        }
    }
    v = Py_BuildValue("{s:O,s:N,s:O,s:n,s:O,s:O,s:s}", "layers", layers, "input_shape",
                      int_tuple(p->in_shape, p->in_ndim), "shapes", shapes, "n_params",
                      (Py_ssize_t)p->n_params, "params", params, "stages", stages, "loss",
                      LOSS_NAMES[p->loss]);
    if (!v || PyDict_Update(d, v)) goto fail;
    Py_DECREF(v);
    Py_DECREF(layers);
    Py_DECREF(shapes);
    Py_DECREF(params);
    Py_DECREF(stages);
    return d;
fail:
    Py_XDECREF(v);
    Py_XDECREF(d);
    Py_XDECREF(layers);
    Py_XDECREF(shapes);
    Py_XDECREF(params);
    Py_XDECREF(stages);
    return NULL;
}

static int Model_init(ModelObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"layers", "input_shape", "loss",        "params",
                             "grads",  "threads",     "gemm_inputs", NULL};
    PyObject *lo, *so, *po, *go, *gi = NULL;
    const char *loss_name;
    int threads = 1, shape[3], ndim, n_layers, bf16;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Model is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOsOO|$iO:Model", kwlist, &lo, &so, &loss_name,
                                     &po, &go, &threads, &gi))
        return -1;
    dp_layer layers[DP_MODEL_MAX_LAYERS];
    dp_loss loss;
    /* the layer list is checked first: its errors name the layer at fault; params that are not
     * a float32 or float64 array fail in model_build, so the dtype is known wherever it matters */
    if (parse_model(lo, so, loss_name, layers, &n_layers, shape, &ndim, &loss, &self->model.plan) ||
        parse_gemm_inputs(
            gi, PyArray_Check(po) ? PyArray_TYPE((PyArrayObject *)po) == NPY_FLOAT32 : -1, &bf16) ||
        model_build(self, layers, n_layers, shape, ndim, loss, threads, po, go))
        return -1;
    dp_model_set_bf16_inputs(&self->model, bf16);
    if (!(self->sizes = widths_tuple(&self->model.plan)) ||
        !(self->input_shape = int_tuple(shape, ndim)))
        return -1; /* ready: dealloc frees the engine */
    return 0;
}

static PyObject *py_model_plan(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"layers", "input_shape", "loss", NULL};
    PyObject *lo, *so;
    const char *loss_name = "softmax_xent";
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|s:model_plan", kwlist, &lo, &so, &loss_name))
        return NULL;
    dp_layer layers[DP_MODEL_MAX_LAYERS];
    dp_plan plan;
    dp_loss loss;
    int shape[3], ndim, n;
    if (parse_model(lo, so, loss_name, layers, &n, shape, &ndim, &loss, &plan)) return NULL;
    return plan_dict(&plan);
}

static PyGetSetDef Model_getset[] = {
    {"params", (getter)Model_get_params, NULL, "the flat parameter array (held)", NULL},
    {"grads", (getter)Model_get_grads, NULL, "the flat gradient array (held)", NULL},
    {"sizes", (getter)Model_get_sizes, NULL, "flat width of the input and of every layer's output",
     NULL},
    {"input_shape", (getter)Model_get_input_shape, NULL, "one input row's shape, (F,) or (C, H, W)",
     NULL},
    {"plan", (getter)Model_get_plan, NULL,
     "model_plan() of the layers: shapes, parameter layout, stages", NULL},
    {"threads", (getter)Model_get_threads, NULL, "threads the kernels split work over", NULL},
    {"team_jobs", (getter)Model_get_team_jobs, NULL,
     "the fork/joins of the model's threads so far: one per call where a call is one parallel "
     "region (0 with one thread)",
     NULL},
    {"gemm_inputs", (getter)Model_get_gemm_inputs, NULL,
     "'bfloat16': every GEMM rounds its inputs to bfloat16 (float32 accumulation); None: as the "
     "params",
     NULL},
    {"n_params", (getter)Model_get_n_params, NULL, "length of the flat parameter layout", NULL},
    {"state", (getter)Model_get_state, NULL,
     "the batch norms' running means and variances (float64, C each per layer, in list order; "
     "a view the engine updates in each training forward: write into it to restore them)",
     NULL},
    {"n_param_layers", (getter)Model_get_n_param_layers, NULL,
     "dense, conv and layernorm layers (backward_layer's range)", NULL},
    {"loss", (getter)Model_get_loss, NULL, "the loss name", NULL},
    {NULL},
};

static PyType_Slot Model_slots[] = {
    {Py_tp_doc,
     (void *)"Model(layers, input_shape, loss, params, grads, *, threads=1, gemm_inputs=None): a "
             "list of "
             "layers (('dense', out), ('conv', out_channels, kernel[, padding]), "
             "'maxpool2', 'relu', 'tanh', 'sigmoid', 'gelu', 'flatten') on an input of "
             "shape (F,) or (C, H, W), with loss 'softmax_xent', 'sigmoid_bce' or 'mse', "
             "over caller-owned flat parameter and gradient arrays (model_plan() gives "
             "their layout). gemm_inputs='bfloat16' (float32 params only): mixed "
             "precision, every GEMM rounds its inputs to bfloat16 and accumulates in "
             "float32; params, grads and activations stay float32."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Model_init},
    {Py_tp_dealloc, Model_dealloc},
    {Py_tp_methods, Model_methods},
    {Py_tp_getset, Model_getset},
    {0, NULL},
};

PyType_Spec mod_model_spec = {
    .name = "dptrain._core.Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Model_slots,
};

/* ------------------------------------------------------------------ the functions */

PyMethodDef mod_model_functions[] = {
    {"model_plan", (PyCFunction)(void (*)(void))py_model_plan, METH_VARARGS | METH_KEYWORDS,
     "model_plan(layers, input_shape, loss='softmax_xent') -> dict\n\nWhat Model(layers, "
     "input_shape, loss, ...) builds, without building it: 'layers' (normalized), 'input_shape', "
     "'shapes' (each layer's output), 'n_params', 'params' (per dense/conv layer: its index in "
     "'layers', the offsets and shapes of its weight and bias in the flat array), 'stages' (the "
     "fused units the engine runs: 'ops' such as 'conv+relu+maxpool2', and their 'layers' range) "
     "and 'loss'. Raises ValueError naming the layer at fault."},
    {NULL},
};
