/* mod_network.c - dptrain._core.Network and ConvNet, the fused training paths the models
 * drive (one call per batch crosses the boundary), and param_count (Network's layout).
 *
 * Network drives dp_net (dense layers), ConvNet dp_cnn (conv blocks + dense layers), with one
 * set of methods (NET_HEAD and NetOps below). Parameters and gradients are the caller's flat
 * arrays, validated once and held (held_array: re-checked on every call). A backward sweep
 * (forward_loss, then backward_layer down to 0) belongs to the thread that started it.
 * Leaves out on purpose: pickling (the objects hold scratch and the caller's arrays; they are
 * not picklable), other layer types and losses (the kernels' own limits).
 */
#include "mod_common.h"

#include <limits.h>
#include <string.h>

#include "dp_cnn.h"
#include "dp_net.h"

/* ------------------------------------------------------------------ what both share */

/* Network (dense layers) and ConvNet (conv blocks + dense layers) have the same Python
 * methods over two kernel families with the same signatures (dp_net_* and dp_cnn_*): both
 * objects start with NET_HEAD, and the methods below reach their kernels through a NetOps
 * table (the same idiom as PyObject_HEAD). */
typedef struct NetOps NetOps;
#define NET_HEAD                                                                              \
    PyObject_HEAD                                                                             \
    held_array params, grads;        /* re-checked on every call (see held_array) */           \
    PyObject *sizes;                 /* tuple: layer widths */                                 \
    PyArrayObject *pending_x;        /* the input of a backward sweep in progress (owned) */   \
    void *pending_data;              /* ... its memory and size when the sweep began */        \
    npy_intp pending_nbytes;                                                                  \
    unsigned long sweep_owner;       /* the thread whose sweep is in flight, 0: none; read and \
                                      * written only under `lock` */                          \
    PyThread_type_lock lock;                                                                  \
    int ready;                                                                                \
    int f32;                                                                                  \
    const NetOps *ops;

typedef struct {
    NET_HEAD
} NetBase;

struct NetOps {
    const char *name;                                  /* the type's name, for messages */
    npy_intp (*in_width)(const NetBase *self);         /* features per input row */
    npy_intp (*out_width)(const NetBase *self);        /* logits per row */
    int64_t (*label_classes)(const NetBase *self);     /* labels must be in [0, this) */
    npy_intp (*n_params)(const NetBase *self);
    int (*pending_rows)(const NetBase *self);          /* a backward sweep in flight? */
    int (*next_layer)(const NetBase *self);
    int (*loss_grad)(NetBase *self, int f32, void *grads, double *loss, int64_t *correct,
                     const void *params, const void *x, const int64_t *labels, int B, double gs);
    int (*forward_loss)(NetBase *self, int f32, double *loss, int64_t *correct,
                        const void *params, const void *x, const int64_t *labels, int B, double gs);
    int (*backward_layer)(NetBase *self, int f32, void *grads, const void *params, int layer);
    int (*evaluate)(NetBase *self, int f32, void *logits, double *loss, int64_t *correct,
                    const void *params, const void *x, const int64_t *labels, int B);
};

/* The NetOps of an object type OBJ whose `net` member is driven by the PFX##_* kernels. */
#define NET_OPS(OPS, OBJ, PFX, NAME, IN_WIDTH, OUT_WIDTH, CLASSES)                             \
    static npy_intp OPS##_in(const NetBase *s) { const OBJ *o = (const OBJ *)s; return IN_WIDTH; } \
    static npy_intp OPS##_out(const NetBase *s) { const OBJ *o = (const OBJ *)s; return OUT_WIDTH; } \
    static int64_t OPS##_classes(const NetBase *s) { const OBJ *o = (const OBJ *)s; return CLASSES; } \
    static npy_intp OPS##_n_params(const NetBase *s) { return ((const OBJ *)s)->net.n_params; } \
    static int OPS##_pending(const NetBase *s) { return ((const OBJ *)s)->net.pending_rows; }  \
    static int OPS##_next(const NetBase *s) { return ((const OBJ *)s)->net.next_layer; }        \
    static int OPS##_loss_grad(NetBase *s, int f32, void *g, double *loss, int64_t *c,          \
                               const void *p, const void *x, const int64_t *l, int B, double gs) \
    {                                                                                         \
        OBJ *o = (OBJ *)s;                                                                    \
        return f32 ? PFX##_loss_grad_f32(&o->net, g, loss, c, p, x, l, B, (float)gs)          \
                   : PFX##_loss_grad_f64(&o->net, g, loss, c, p, x, l, B, gs);                \
    }                                                                                         \
    static int OPS##_forward_loss(NetBase *s, int f32, double *loss, int64_t *c, const void *p, \
                                  const void *x, const int64_t *l, int B, double gs)          \
    {                                                                                         \
        OBJ *o = (OBJ *)s;                                                                    \
        return f32 ? PFX##_forward_loss_f32(&o->net, loss, c, p, x, l, B, (float)gs)          \
                   : PFX##_forward_loss_f64(&o->net, loss, c, p, x, l, B, gs);                \
    }                                                                                         \
    static int OPS##_backward_layer(NetBase *s, int f32, void *g, const void *p, int layer)   \
    {                                                                                         \
        OBJ *o = (OBJ *)s;                                                                    \
        return f32 ? PFX##_backward_layer_f32(&o->net, g, p, layer)                           \
                   : PFX##_backward_layer_f64(&o->net, g, p, layer);                          \
    }                                                                                         \
    static int OPS##_evaluate(NetBase *s, int f32, void *logits, double *loss, int64_t *c,    \
                              const void *p, const void *x, const int64_t *l, int B)          \
    {                                                                                         \
        OBJ *o = (OBJ *)s;                                                                    \
        return f32 ? PFX##_evaluate_f32(&o->net, logits, loss, c, p, x, l, B)                 \
                   : PFX##_evaluate_f64(&o->net, logits, loss, c, p, x, l, B);                \
    }                                                                                         \
    static const NetOps OPS = {NAME, OPS##_in, OPS##_out, OPS##_classes, OPS##_n_params,      \
                               OPS##_pending, OPS##_next, OPS##_loss_grad, OPS##_forward_loss, \
                               OPS##_backward_layer, OPS##_evaluate};

/* The object is built and its held arrays are still what it was built on. */
static int net_ready(NetBase *self, int writes_grads)
{
    if (!self->ready) {
        PyErr_Format(PyExc_RuntimeError, "%s is not initialized", Py_TYPE(self)->tp_name);
        return -1;
    }
    /* forward-only calls (evaluate, logits) never touch the gradient */
    return check_held(&self->params, self->ops->name, "params") ||
           (writes_grads && check_held(&self->grads, self->ops->name, "grads"));
}

/* The backward sweep (forward_loss, then backward_layer for L-1 .. 0) keeps activations in
 * the object between calls, so it belongs to the thread that started it: while it is in
 * flight, another thread's call on the object is refused (NET_EBUSY) instead of silently
 * replacing the activations that the owner's next backward_layer reads. Fused calls
 * (loss_grad, evaluate, logits) from threads with no sweep in flight serialize on the lock. */
#define NET_EBUSY (-100)

static PyObject *net_busy_error(NetBase *self, const char *method)
{
    return PyErr_Format(PyExc_RuntimeError,
                        "%s.%s: a backward sweep (forward_loss, then backward_layer down to 0) "
                        "started by another thread is in progress on this object; finish it in "
                        "that thread first, or give each thread its own %s",
                        self->ops->name, method, self->ops->name);
}

/* The end of a sweep (or of a call that replaced it): drop the input it held. */
static void net_end_sweep(NetBase *self)
{
    Py_CLEAR(self->pending_x);
    self->pending_data = NULL;
    self->pending_nbytes = 0;
}

/* x (B, IN) of the network's dtype and labels (B,) int64 (labels may be optional). */
static int net_batch(NetBase *self, PyObject *xo, PyObject *lo, PyArrayObject **x, PyArrayObject **l,
                     int writes_grads)
{
    if (net_ready(self, writes_grads)) return -1;
    if (!(*x = check_array(xo, "x", self->params.typenum, 2, 0))) return -1;
    npy_intp B = PyArray_DIM(*x, 0), xd[2] = {B, self->ops->in_width(self)}, ld[1] = {B};
    if (check_shape(*x, "x", 2, xd)) return -1;
    *l = NULL;
    if (lo && lo != Py_None && (!(*l = check_array(lo, "labels", NPY_INT64, 1, 0)) || check_shape(*l, "labels", 1, ld)))
        return -1;
    return 0;
}

/* The gradient buffer of a call: the held one, or another of the same layout (e.g. one per
 * chunk of a global batch). */
static PyArrayObject *net_grads(NetBase *self, PyObject *go, PyArrayObject *x, PyArrayObject *labels)
{
    PyArrayObject *grads = self->grads.arr;
    if (go && go != Py_None) {
        npy_intp pn[1] = {self->ops->n_params(self)};
        if (!(grads = check_array(go, "grads", self->params.typenum, 1, 1)) ||
            check_shape(grads, "grads", 1, pn) || check_no_overlap(grads, "grads", self->params.arr, "params"))
            return NULL;
    }
    /* the gradient is written while x (and, on the fused logistic path, labels) are read */
    if ((x && check_no_overlap(grads, "grads", x, "x")) ||
        (labels && check_no_overlap(grads, "grads", labels, "labels")))
        return NULL;
    return grads;
}

/* The exception of a failed kernel call: labels out of range, or the code's own message. */
static PyObject *net_error(NetBase *self, int rc, PyArrayObject *labels, const char *method)
{
    if (rc == DP_ELABEL && labels) return label_error(labels, self->ops->label_classes(self)), NULL;
    char what[64];
    snprintf(what, sizeof what, "%s.%s", self->ops->name, method);
    return raise_code(rc, what);
}

static PyObject *Net_loss_grad(NetBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "labels", "grad_scale", "grads", NULL};
    PyObject *xo, *lo, *gso = Py_None, *go = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OO:loss_grad", kwlist, &xo, &lo, &gso, &go)) return NULL;
    PyArrayObject *x, *l, *grads;
    double gs;
    if (net_batch(self, xo, lo, &x, &l, 1)) return NULL;
    if (!l) return PyErr_Format(PyExc_TypeError, "labels must be an int64 array, got None"), NULL;
    npy_intp B = PyArray_DIM(x, 0);
    if (get_grad_scale(gso, B, &gs) || !(grads = net_grads(self, go, x, l))) return NULL;
    double loss = 0;
    int64_t correct = 0;
    int rc;
    unsigned long me = PyThread_get_thread_ident();
    /* a whole sweep: one of this thread's in progress ends here (the kernel says so too) */
    WITHOUT_GIL_LOCKED(self->lock,
        if (self->sweep_owner && self->sweep_owner != me) rc = NET_EBUSY;
        else {
            rc = self->ops->loss_grad(self, self->f32, PyArray_DATA(grads), &loss, &correct, self->params.data, PyArray_DATA(x), PyArray_DATA(l), (int)B, gs);
            self->sweep_owner = 0;
        });
    if (rc == NET_EBUSY) return net_busy_error(self, "loss_grad");
    net_end_sweep(self);
    if (rc) return net_error(self, rc, l, "loss_grad");
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Net_forward_loss(NetBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "labels", "grad_scale", NULL};
    PyObject *xo, *lo, *gso = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O:forward_loss", kwlist, &xo, &lo, &gso)) return NULL;
    PyArrayObject *x, *l;
    double gs;
    if (net_batch(self, xo, lo, &x, &l, 1)) return NULL;
    if (!l) return PyErr_Format(PyExc_TypeError, "labels must be an int64 array, got None"), NULL;
    npy_intp B = PyArray_DIM(x, 0);
    if (get_grad_scale(gso, B, &gs)) return NULL;
    double loss = 0;
    int64_t correct = 0;
    int rc, pending = 0;
    unsigned long me = PyThread_get_thread_ident();
    WITHOUT_GIL_LOCKED(self->lock,
        if (self->sweep_owner && self->sweep_owner != me) rc = NET_EBUSY;
        else {
            rc = self->ops->forward_loss(self, self->f32, &loss, &correct, self->params.data, PyArray_DATA(x), PyArray_DATA(l), (int)B, gs);
            pending = rc == 0 && self->ops->pending_rows(self);
            self->sweep_owner = pending ? me : 0;
        });
    if (rc == NET_EBUSY) return net_busy_error(self, "forward_loss");
    net_end_sweep(self);                 /* this thread's earlier sweep, if any, is replaced */
    if (rc) return net_error(self, rc, l, "forward_loss");
    if (pending) {                       /* backward_layer(0) reads x: keep it alive */
        Py_INCREF(x);
        self->pending_x = x;
        self->pending_data = PyArray_DATA(x);
        self->pending_nbytes = PyArray_NBYTES(x);
    }
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Net_backward_layer(NetBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"layer", "grads", NULL};
    int layer;
    PyObject *go = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|O:backward_layer", kwlist, &layer, &go)) return NULL;
    if (net_ready(self, 1)) return NULL;
    PyArrayObject *px = self->pending_x;
    if (px && (PyArray_DATA(px) != self->pending_data || PyArray_NBYTES(px) != self->pending_nbytes))
        return PyErr_Format(PyExc_ValueError, "backward_layer(%d): the x given to forward_loss was "
                            "resized or moved since; call forward_loss again", layer), NULL;
    PyArrayObject *grads = net_grads(self, go, px, NULL);
    if (!grads) return NULL;
    int rc, ended = 0, next = -1, owned_by_other = 0;
    unsigned long me = PyThread_get_thread_ident();
    WITHOUT_GIL_LOCKED(self->lock,
        if (self->sweep_owner != me) {
            owned_by_other = self->sweep_owner != 0;
            rc = DP_EORDER;
        } else {
            rc = self->ops->backward_layer(self, self->f32, PyArray_DATA(grads), self->params.data, layer);
            ended = !self->ops->pending_rows(self);
            if (ended) self->sweep_owner = 0;
            next = self->ops->next_layer(self);
        });
    if (owned_by_other) return net_busy_error(self, "backward_layer");
    if (rc == DP_EORDER) {
        if (next < 0)
            return PyErr_Format(PyExc_RuntimeError, "backward_layer(%d): no forward_loss to go back from", layer), NULL;
        return PyErr_Format(PyExc_RuntimeError, "backward_layer(%d) out of order: the next layer is %d",
                            layer, next), NULL;
    }
    if (ended) net_end_sweep(self);
    if (rc) return net_error(self, rc, NULL, "backward_layer");
    Py_RETURN_NONE;
}

/* evaluate and logits: forward only, in chunks. The kernels reuse the activation scratch, so
 * a backward sweep in progress ends here (the kernels say so too: no pending rows after). */
static PyObject *net_forward_only(NetBase *self, PyObject *xo, PyObject *lo, PyObject *oo, const char *method)
{
    PyArrayObject *x, *l, *o = NULL;
    if (net_batch(self, xo, lo, &x, &l, 0)) return NULL;
    if (lo && !l) return PyErr_Format(PyExc_TypeError, "labels must be an int64 array, got None"), NULL;
    if (oo) {
        npy_intp od[2] = {PyArray_DIM(x, 0), self->ops->out_width(self)};
        if (!(o = check_array(oo, "out", self->params.typenum, 2, 1)) || check_shape(o, "out", 2, od) ||
            check_no_overlap(o, "out", x, "x") || check_no_overlap(o, "out", self->params.arr, "params"))
            return NULL;
    }
    double loss = 0;
    int64_t correct = 0;
    int rc, B = (int)PyArray_DIM(x, 0);
    unsigned long me = PyThread_get_thread_ident();
    WITHOUT_GIL_LOCKED(self->lock,
        if (self->sweep_owner && self->sweep_owner != me) rc = NET_EBUSY;
        else {
            rc = self->ops->evaluate(self, self->f32, o ? PyArray_DATA(o) : NULL, &loss, &correct, self->params.data, PyArray_DATA(x), l ? PyArray_DATA(l) : NULL, B);
            self->sweep_owner = 0;
        });
    if (rc == NET_EBUSY) return net_busy_error(self, method);
    net_end_sweep(self);
    if (rc) return net_error(self, rc, l, method);
    if (o) Py_RETURN_NONE;
    return Py_BuildValue("(dL)", loss, (long long)correct);
}

static PyObject *Net_evaluate(NetBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "labels", NULL};
    PyObject *xo, *lo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:evaluate", kwlist, &xo, &lo)) return NULL;
    return net_forward_only(self, xo, lo, NULL, "evaluate");
}

static PyObject *Net_logits(NetBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "out", NULL};
    PyObject *xo, *oo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:logits", kwlist, &xo, &oo)) return NULL;
    return net_forward_only(self, xo, NULL, oo, "logits");
}

static PyObject *held(PyObject *o) { o = o ? o : Py_None; Py_INCREF(o); return o; }
static PyObject *Net_get_params(NetBase *self, void *c) { return held((PyObject *)self->params.arr); }
static PyObject *Net_get_grads(NetBase *self, void *c) { return held((PyObject *)self->grads.arr); }
static PyObject *Net_get_sizes(NetBase *self, void *c) { return held(self->sizes); }

/* Releases what NET_HEAD holds (the type's dealloc frees its own net and fields first). */
static void net_release(NetBase *self)
{
    Py_XDECREF(self->params.arr);
    Py_XDECREF(self->grads.arr);
    Py_XDECREF(self->sizes);
    Py_XDECREF(self->pending_x);
    if (self->lock) PyThread_free_lock(self->lock);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);             /* a heap type: each instance holds a reference to it */
}

static PyMethodDef Net_methods[] = {
    {"loss_grad", (PyCFunction)(void (*)(void))Net_loss_grad, METH_VARARGS | METH_KEYWORDS,
     "loss_grad(x, labels, grad_scale=None, grads=None) -> (loss_sum, n_correct)\n\nForward and "
     "backward on one batch; ACCUMULATES d(grad_scale * sum of losses)/d params into grads (the "
     "held buffer, or the one given; grad_scale defaults to 1/B)."},
    {"forward_loss", (PyCFunction)(void (*)(void))Net_forward_loss, METH_VARARGS | METH_KEYWORDS,
     "forward_loss(x, labels, grad_scale=None) -> (loss_sum, n_correct): the first half of "
     "loss_grad; then backward_layer(L-1), ..., backward_layer(0) finish it"},
    {"backward_layer", (PyCFunction)(void (*)(void))Net_backward_layer, METH_VARARGS | METH_KEYWORDS,
     "backward_layer(layer, grads=None): one backward step, last layer first; that layer's "
     "gradient is final when it returns"},
    {"evaluate", (PyCFunction)(void (*)(void))Net_evaluate, METH_VARARGS | METH_KEYWORDS,
     "evaluate(x, labels) -> (loss_sum, n_correct): forward only, in chunks."},
    {"logits", (PyCFunction)(void (*)(void))Net_logits, METH_VARARGS | METH_KEYWORDS,
     "logits(x, out): writes the (B, OUT) logits (OUT: the classes, 1 for sigmoid_bce)."},
    {NULL},
};

/* ------------------------------------------------------------------ Network */

/* A dense stack's sizes (IN, H1, ..., OUT): 2 to DP_MAX_LAYERS + 1 ints in [1, INT_MAX] (the
 * kernels index with int), and its flat parameter count, which must fit the address space. */
static int layer_sizes(PyObject *obj, int *sizes, Py_ssize_t *ns, npy_intp *n_params)
{
    PyObject *seq = PySequence_Fast(obj, "sizes must be a sequence of ints");
    if (!seq) return -1;
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 2 || n > DP_MAX_LAYERS + 1) {
        PyErr_Format(PyExc_ValueError, "sizes has %zd entries, expected 2 to %d (input, hidden..., output)",
                     n, DP_MAX_LAYERS + 1);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *index = PyNumber_Index(item);     /* int, numpy integers; not float */
        if (!index) {
            PyErr_Format(PyExc_TypeError, "sizes[%zd] must be an int, got %s", i, Py_TYPE(item)->tp_name);
            goto done;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
        if (overflow || v < 1 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "sizes[%zd] = %S: layer widths must be >= 1 and at most %d",
                         i, index, INT_MAX);
            Py_DECREF(index);
            goto done;
        }
        Py_DECREF(index);
        sizes[i] = (int)v;
    }
    ptrdiff_t p = dp_net_param_count(sizes, (int)n - 1);
    if (p < 0 || (size_t)p > (size_t)PY_SSIZE_T_MAX / sizeof(double)) {
        PyErr_Format(PyExc_OverflowError, "sizes: the flat parameter count of these %zd layer widths "
                     "is too large to allocate", n);
        goto done;
    }
    *ns = n;
    *n_params = (npy_intp)p;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

typedef struct {
    NET_HEAD
    dp_net net;
} NetworkObject;

NET_OPS(network_ops, NetworkObject, dp_net, "Network", o->net.sizes[0], o->net.sizes[o->net.n_layers],
        o->net.loss == DP_LOSS_SIGMOID_BCE ? 2 : o->net.sizes[o->net.n_layers])

static int Network_init(NetworkObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sizes", "loss", "params", "grads", "threads", NULL};
    PyObject *so, *po, *go, *seq = NULL;
    const char *loss_name;
    int threads = 1, sizes[DP_MAX_LAYERS + 1], rc = -1;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Network is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OsOO|$i:Network", kwlist, &so, &loss_name, &po, &go, &threads))
        return -1;
    dp_loss loss;
    if (strcmp(loss_name, "softmax_xent") == 0) loss = DP_LOSS_SOFTMAX_XENT;
    else if (strcmp(loss_name, "sigmoid_bce") == 0) loss = DP_LOSS_SIGMOID_BCE;
    else {
        PyErr_Format(PyExc_ValueError, "loss must be 'softmax_xent' or 'sigmoid_bce', got '%s'", loss_name);
        return -1;
    }
    if (threads < 1 || threads > DP_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", DP_MAX_THREADS, threads);
        return -1;
    }
    Py_ssize_t ns;
    npy_intp n_params;
    if (layer_sizes(so, sizes, &ns, &n_params)) return -1;
    if (!(seq = PySequence_Tuple(so))) return -1;
    if (loss == DP_LOSS_SIGMOID_BCE && sizes[ns - 1] != 1) {
        PyErr_Format(PyExc_ValueError, "loss 'sigmoid_bce' needs one output, sizes[-1] = %d", sizes[ns - 1]);
        goto fail;
    }
    if (loss == DP_LOSS_SOFTMAX_XENT && sizes[ns - 1] < 2) {
        PyErr_Format(PyExc_ValueError, "loss 'softmax_xent' needs >= 2 outputs, sizes[-1] = %d", sizes[ns - 1]);
        goto fail;
    }
    PyArrayObject *p, *g;
    npy_intp pn[1] = {n_params};
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 0)) || !(g = check_array(go, "grads", NPY_NOTYPE, 1, 1)) ||
        check_same_dtype(g, "grads", p, "params") || check_shape(p, "params", 1, pn) ||
        check_shape(g, "grads", 1, pn) || check_no_overlap(g, "grads", p, "params"))
        goto fail;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) { PyErr_NoMemory(); goto fail; }
    int err = dp_net_init(&self->net, sizes, (int)ns - 1, loss, threads);
    if (err) {
        dp_net_free(&self->net);
        raise_code(err, "Network");
        goto fail;
    }
    Py_INCREF(seq);
    self->sizes = seq;
    hold_array(&self->params, p, 0);
    hold_array(&self->grads, g, 1);
    self->f32 = IS_F32(p);
    self->ops = &network_ops;
    self->ready = 1;
    rc = 0;
fail:
    Py_XDECREF(seq);
    return rc;
}

static void Network_dealloc(NetworkObject *self)
{
    if (self->ready) dp_net_free(&self->net);
    net_release((NetBase *)self);
}

static PyObject *Network_get_threads(NetworkObject *self, void *c) { return PyLong_FromLong(self->ready ? self->net.ctx.threads : 0); }
static PyObject *Network_get_loss(NetworkObject *self, void *c)
{
    return PyUnicode_FromString(self->net.loss == DP_LOSS_SIGMOID_BCE ? "sigmoid_bce" : "softmax_xent");
}


static PyGetSetDef Network_getset[] = {
    {"params", (getter)Net_get_params, NULL, "the flat parameter array (held)", NULL},
    {"grads", (getter)Net_get_grads, NULL, "the flat gradient array (held)", NULL},
    {"sizes", (getter)Net_get_sizes, NULL, "layer widths (IN, H1, ..., OUT)", NULL},
    {"threads", (getter)Network_get_threads, NULL, "threads the kernels split work over", NULL},
    {"loss", (getter)Network_get_loss, NULL, "the loss name", NULL},
    {NULL},
};

static PyType_Slot Network_slots[] = {
    {Py_tp_doc, (void *)"Network(sizes, loss, params, grads, *, threads=1): dense layers with ReLU "
                        "between them over caller-owned flat parameter and gradient arrays."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Network_init},
    {Py_tp_dealloc, Network_dealloc},
    {Py_tp_methods, Net_methods},
    {Py_tp_getset, Network_getset},
    {0, NULL},
};

PyType_Spec mod_network_spec = {
    .name = "dptrain._core.Network",
    .basicsize = sizeof(NetworkObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Network_slots,
};

static PyObject *py_param_count(PyObject *module, PyObject *arg)
{
    int sizes[DP_MAX_LAYERS + 1];
    Py_ssize_t ns;
    npy_intp n_params;
    if (layer_sizes(arg, sizes, &ns, &n_params)) return NULL;
    return PyLong_FromSsize_t((Py_ssize_t)n_params);
}

/* ------------------------------------------------------------------ ConvNet */

typedef struct {
    NET_HEAD                         /* sizes: width of every layer's input and of the logits */
    dp_cnn net;
    PyObject *input_shape;           /* tuple (C, H, W) */
} ConvNetObject;

NET_OPS(convnet_ops, ConvNetObject, dp_cnn, "ConvNet", o->net.width[0], o->net.width[o->net.n_layers],
        o->net.width[o->net.n_layers])

/* A sequence of 1..max positive ints into out; its length in *n. */
static int int_list(PyObject *obj, const char *name, int max, int *out, int *n)
{
    PyObject *seq = PySequence_Fast(obj, "a sequence of ints was expected");
    if (!seq) {
        PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints, got %s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (k < 1 || k > max) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, expected 1 to %d", name, k, max);
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be an int, got %s", name, i, Py_TYPE(item)->tp_name);
            goto done;
        }
        long v = PyLong_AsLong(item);
        if (v == -1 && PyErr_Occurred()) goto done;
        if (v < 1 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] = %ld, expected a positive size", name, i, v);
            goto done;
        }
        out[i] = (int)v;
    }
    *n = (int)k;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* The exception for a layer plan dp_cnn_init refused. */
static void cnn_plan_error(const dp_cnn *net, const int *shape, int kernel, int padding)
{
    int l = net->bad_layer;
    if (l < 0) {
        PyErr_SetString(PyExc_ValueError, "the ConvNet layers are invalid");
    } else if (l < net->n_conv) {
        const dp_conv_geom *g = &net->conv[l];
        int in_c = l ? g->C : shape[0], in_h = l ? g->H : shape[1], in_w = l ? g->W : shape[2];
        PyErr_Format(PyExc_ValueError, "conv layer %d gets a (%d, %d, %d) input: a %dx%d kernel with "
                     "padding %d leaves no 2x2 window to pool (the input is too small for this many "
                     "conv layers)", l, in_c, in_h, in_w, kernel, kernel, padding);
    } else if (l == net->n_layers - 1) {
        PyErr_Format(PyExc_ValueError, "dense[-1] is the class count and must be >= 2 for softmax_xent");
    } else {
        PyErr_Format(PyExc_ValueError, "dense layer %d has an invalid width", l - net->n_conv);
    }
}

static int ConvNet_init(ConvNetObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"input_shape", "channels", "dense", "params", "grads", "kernel", "padding", "threads", NULL};
    PyObject *so, *co, *dno, *po, *go;
    int kernel = 3, padding = 0, threads = 1, shape[3], channels[DP_CNN_MAX_CONV], dense[DP_CNN_MAX_DENSE];
    int ns, nc, nd;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "ConvNet is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO|$iii:ConvNet", kwlist, &so, &co, &dno, &po, &go,
                                     &kernel, &padding, &threads))
        return -1;
    if (int_list(so, "input_shape", 3, shape, &ns) || int_list(co, "channels", DP_CNN_MAX_CONV, channels, &nc) ||
        int_list(dno, "dense", DP_CNN_MAX_DENSE, dense, &nd))
        return -1;
    if (ns != 3) return PyErr_Format(PyExc_ValueError, "input_shape has %d entries, expected (C, H, W)", ns), -1;
    if (kernel < 1) return PyErr_Format(PyExc_ValueError, "kernel must be >= 1, got %d", kernel), -1;
    if (padding < 0) return PyErr_Format(PyExc_ValueError, "padding must be >= 0, got %d", padding), -1;
    if (threads < 1 || threads > DP_MAX_THREADS)
        return PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", DP_MAX_THREADS, threads), -1;
    int err = dp_cnn_init(&self->net, shape[0], shape[1], shape[2], channels, nc, kernel, padding, dense, nd, threads);
    if (err) {
        if (err == DP_EVALUE) cnn_plan_error(&self->net, shape, kernel, padding);
        else raise_code(err, "ConvNet");
        dp_cnn_free(&self->net);
        return -1;
    }
    PyArrayObject *p, *g;
    npy_intp pn[1] = {self->net.n_params};
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 0)) || !(g = check_array(go, "grads", NPY_NOTYPE, 1, 1)) ||
        check_same_dtype(g, "grads", p, "params") || check_shape(p, "params", 1, pn) ||
        check_shape(g, "grads", 1, pn) || check_no_overlap(g, "grads", p, "params") ||
        !(self->lock = PyThread_allocate_lock())) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        dp_cnn_free(&self->net);
        return -1;
    }
    self->sizes = PyTuple_New(self->net.n_layers + 1);
    self->input_shape = Py_BuildValue("(iii)", shape[0], shape[1], shape[2]);
    if (!self->sizes || !self->input_shape) {
        dp_cnn_free(&self->net);
        return -1;      /* dealloc releases the tuples and the lock */
    }
    for (int l = 0; l <= self->net.n_layers; l++) {
        PyObject *v = PyLong_FromLong(self->net.width[l]);
        if (!v) { dp_cnn_free(&self->net); return -1; }
        PyTuple_SET_ITEM(self->sizes, l, v);
    }
    hold_array(&self->params, p, 0);
    hold_array(&self->grads, g, 1);
    self->f32 = IS_F32(p);
    self->ops = &convnet_ops;
    self->ready = 1;
    return 0;
}

static void ConvNet_dealloc(ConvNetObject *self)
{
    if (self->ready) dp_cnn_free(&self->net);
    Py_XDECREF(self->input_shape);
    net_release((NetBase *)self);
}

static PyObject *ConvNet_get_input_shape(ConvNetObject *self, void *c) { return held(self->input_shape); }
static PyObject *ConvNet_get_threads(ConvNetObject *self, void *c) { return PyLong_FromLong(self->ready ? self->net.threads : 0); }
static PyObject *ConvNet_get_n_conv(ConvNetObject *self, void *c) { return PyLong_FromLong(self->net.n_conv); }
static PyObject *ConvNet_get_n_params(ConvNetObject *self, void *c) { return PyLong_FromSsize_t(self->net.n_params); }
static PyObject *ConvNet_get_loss(ConvNetObject *self, void *c) { return PyUnicode_FromString("softmax_xent"); }


static PyGetSetDef ConvNet_getset[] = {
    {"params", (getter)Net_get_params, NULL, "the flat parameter array (held)", NULL},
    {"grads", (getter)Net_get_grads, NULL, "the flat gradient array (held)", NULL},
    {"sizes", (getter)Net_get_sizes, NULL, "flat width of the input and of every layer's output", NULL},
    {"input_shape", (getter)ConvNet_get_input_shape, NULL, "(C, H, W) of one input row", NULL},
    {"threads", (getter)ConvNet_get_threads, NULL, "threads the kernels split work over", NULL},
    {"n_conv", (getter)ConvNet_get_n_conv, NULL, "number of conv blocks (the first layers)", NULL},
    {"n_params", (getter)ConvNet_get_n_params, NULL, "length of the flat parameter layout", NULL},
    {"loss", (getter)ConvNet_get_loss, NULL, "the loss name", NULL},
    {NULL},
};

static PyType_Slot ConvNet_slots[] = {
    {Py_tp_doc, (void *)"ConvNet(input_shape, channels, dense, params, grads, *, kernel=3, padding=0, "
                        "threads=1): conv blocks (conv -> ReLU -> 2x2 max-pool) then dense layers "
                        "with ReLU between them, softmax cross-entropy, over caller-owned flat "
                        "parameter and gradient arrays."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, ConvNet_init},
    {Py_tp_dealloc, ConvNet_dealloc},
    {Py_tp_methods, Net_methods},
    {Py_tp_getset, ConvNet_getset},
    {0, NULL},
};

PyType_Spec mod_convnet_spec = {
    .name = "dptrain._core.ConvNet",
    .basicsize = sizeof(ConvNetObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ConvNet_slots,
};

/* ------------------------------------------------------------------ the functions */

PyMethodDef mod_network_functions[] = {
    {"param_count", py_param_count, METH_O, "param_count(sizes) -> length of the flat parameter layout"},
    {NULL},
};
