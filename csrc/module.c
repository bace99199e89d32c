/* module.c - dptrain._core: the one file that talks to CPython and NumPy.
 *
 * Every entry point follows the same recipe: parse -> validate (ndarray, dtype, ndim, shape,
 * C-contiguity, alignment, writeable outputs, no output aliasing an input) -> release the GIL
 * -> call the plain-C kernel -> turn its return code into an exception. No argument is ever
 * converted or copied: a wrong dtype or layout is an error, so no hidden copy hides in a loop.
 *
 * Objects that own scratch (Context, Network) carry a lock taken without the GIL, so two
 * Python threads sharing one object serialize instead of corrupting its buffers; threads
 * with their own objects run in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <numpy/arrayobject.h>

#include <limits.h>
#include <math.h>
#include <string.h>

#include "dp_cnn.h"
#include "dp_conv.h"
#include "dp_gemm.h"
#include "dp_act.h"
#include "dp_buffers.h"
#include "dp_dense.h"
#include "dp_loss.h"
#include "dp_sgd.h"
#include "dp_net.h"
#include "dp_sync.h"

/* ------------------------------------------------------------------ validation helpers */

static const char *dtype_name(PyArrayObject *a)
{
    switch (PyArray_TYPE(a)) {
    case NPY_FLOAT32: return "float32";
    case NPY_FLOAT64: return "float64";
    case NPY_INT64: return "int64";
    case NPY_INT32: return "int32";
    case NPY_UINT8: return "uint8";
    case NPY_FLOAT16: return "float16";
    default: return PyArray_DESCR(a)->typeobj->tp_name;
    }
}

static const char *typenum_name(int t)
{
    return t == NPY_FLOAT32 ? "float32" : t == NPY_FLOAT64 ? "float64" : t == NPY_INT64 ? "int64" :
           t == NPY_UINT8 ? "uint8" : "?";
}

/* A shape as Python prints a tuple: (4,), (64, 784), (). */
static void shape_str(char *buf, size_t n, int ndim, const npy_intp *dims)
{
    size_t used = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%ld", i ? ", " : "", (long)dims[i]);
    if (used < n) snprintf(buf + used, n - used, ndim == 1 ? ",)" : ")");
}

/* Returns obj as an ndarray of dtype `typenum` (NPY_NOTYPE: float32 or float64) and `ndim`
 * dimensions (-1: any), C-contiguous and aligned, writeable when `output`; NULL + exception. */
static PyArrayObject *check_array(PyObject *obj, const char *name, int typenum, int ndim, int output)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int t = PyArray_TYPE(a);
    if (typenum == NPY_NOTYPE ? (t != NPY_FLOAT32 && t != NPY_FLOAT64) : t != typenum) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s, expected %s", name, dtype_name(a),
                     typenum == NPY_NOTYPE ? "float32 or float64" : typenum_name(typenum));
        return NULL;
    }
    if (ndim >= 0 && PyArray_NDIM(a) != ndim) {
        char s[128];
        shape_str(s, sizeof s, PyArray_NDIM(a), PyArray_DIMS(a));
        PyErr_Format(PyExc_ValueError, "%s has shape %s, expected a %d-D array", name, s, ndim);
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be C-contiguous and aligned (convert it once with "
                     "np.ascontiguousarray, outside the training loop)", name);
        return NULL;
    }
    if (output && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s is read-only, but it is written to", name);
        return NULL;
    }
    for (int i = 0; i < PyArray_NDIM(a); i++)
        if (PyArray_DIM(a, i) > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "%s has a dimension of %ld, more than the kernels' limit %d",
                         name, (long)PyArray_DIM(a, i), INT_MAX);
            return NULL;
        }
    return a;
}

/* Checks a's shape against `expected` (ndim entries). */
static int check_shape(PyArrayObject *a, const char *name, int ndim, const npy_intp *expected)
{
    int ok = PyArray_NDIM(a) == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = PyArray_DIM(a, i) == expected[i];
    if (ok) return 0;
    char got[128], want[128];
    shape_str(got, sizeof got, PyArray_NDIM(a), PyArray_DIMS(a));
    shape_str(want, sizeof want, ndim, expected);
    PyErr_Format(PyExc_ValueError, "%s has shape %s, expected %s", name, got, want);
    return -1;
}

static int check_same_dtype(PyArrayObject *a, const char *name, PyArrayObject *ref, const char *ref_name)
{
    if (PyArray_TYPE(a) == PyArray_TYPE(ref)) return 0;
    PyErr_Format(PyExc_TypeError, "%s has dtype %s, expected %s (the dtype of %s)", name,
                 dtype_name(a), dtype_name(ref), ref_name);
    return -1;
}

/* An output must not share memory with an input it is computed from. */
static int check_no_overlap(PyArrayObject *out, const char *out_name, PyArrayObject *in, const char *in_name)
{
    if (!in) return 0;
    char *o0 = PyArray_BYTES(out), *o1 = o0 + PyArray_NBYTES(out);
    char *i0 = PyArray_BYTES(in), *i1 = i0 + PyArray_NBYTES(in);
    if (o0 < i1 && i0 < o1 && PyArray_NBYTES(out) > 0 && PyArray_NBYTES(in) > 0) {
        PyErr_Format(PyExc_ValueError, "%s shares memory with %s; pass a separate output array",
                     out_name, in_name);
        return -1;
    }
    return 0;
}

/* An array an object holds between calls (a network's params and grads, a group's buffers).
 * NumPy lets Python re-type (`a.dtype = ...`), re-shape or re-size (`a.resize(...,
 * refcheck=False)`), and on NumPy 1.x re-point (`a.data = ...`) an array in place, so what
 * was validated when the object was built is checked again on every call that uses it: the
 * same memory, dtype, element count, C-contiguity and (for outputs) writeability. */
typedef struct {
    PyArrayObject *arr;          /* owned reference */
    void *data;
    npy_intp size;
    int typenum;
    int output;
} held_array;

static void hold_array(held_array *h, PyArrayObject *a, int output)
{
    Py_INCREF(a);
    h->arr = a;
    h->data = PyArray_DATA(a);
    h->size = PyArray_SIZE(a);
    h->typenum = PyArray_TYPE(a);
    h->output = output;
}

static int check_held(const held_array *h, const char *owner, const char *name)
{
    PyArrayObject *a = h->arr;
    if (PyArray_DATA(a) == h->data && PyArray_TYPE(a) == h->typenum && PyArray_NDIM(a) == 1 &&
        PyArray_DIM(a, 0) == h->size && PyArray_IS_C_CONTIGUOUS(a) && PyArray_ISALIGNED(a) &&
        (!h->output || PyArray_ISWRITEABLE(a)))
        return 0;
    char now[128];
    shape_str(now, sizeof now, PyArray_NDIM(a), PyArray_DIMS(a));
    if (PyArray_DATA(a) == h->data && PyArray_TYPE(a) == h->typenum && PyArray_SIZE(a) == h->size &&
        PyArray_IS_C_CONTIGUOUS(a) && PyArray_NDIM(a) == 1) {
        PyErr_Format(PyExc_ValueError, "%s is read-only, but it is written to (%s.%s was made "
                     "read-only after the %s was built)", name, owner, name, owner);
        return -1;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s.%s was changed after the %s was built: it is now %s of shape %s%s%s, but "
                 "it was built on %s of shape (%zd,) at its memory then; build a new %s for a "
                 "changed array", owner, name, owner, dtype_name(a), now,
                 PyArray_DATA(a) != h->data ? ", at other memory" : "",
                 h->output && !PyArray_ISWRITEABLE(a) ? ", read-only" : "",
                 typenum_name(h->typenum), (Py_ssize_t)h->size, owner);
    return -1;
}

/* repr() of a double into buf (no Python object is created, so nothing can leak). */
static const char *double_repr(char *buf, size_t n, double v)
{
    char *s = PyOS_double_to_string(v, 'r', 0, 0, NULL);
    snprintf(buf, n, "%s", s ? s : "?");
    PyMem_Free(s);
    return buf;
}

static int check_finite(double v, const char *name)
{
    if (isfinite(v)) return 0;
    char b[64];
    PyErr_Format(PyExc_ValueError, "%s must be finite, got %s", name, double_repr(b, sizeof b, v));
    return -1;
}

/* The first label outside [0, classes) (binary: outside {0, 1}) as an exception. */
static void label_error(PyArrayObject *labels, int64_t classes)
{
    const int64_t *l = PyArray_DATA(labels);
    npy_intp n = PyArray_SIZE(labels);
    for (npy_intp i = 0; i < n; i++)
        if (l[i] < 0 || l[i] >= classes) {
            PyErr_Format(PyExc_ValueError, "labels[%ld] = %lld is out of range: expected 0 <= label < %lld",
                         (long)i, (long long)l[i], (long long)classes);
            return;
        }
    PyErr_SetString(PyExc_ValueError, "labels are out of range");
}

static PyObject *raise_code(int rc, const char *what)
{
    if (rc == DP_ENOMEM) return PyErr_NoMemory();
    if (rc == DP_ETHREAD) return PyErr_Format(PyExc_RuntimeError, "%s: could not start a thread", what);
    return PyErr_Format(PyExc_RuntimeError, "%s failed with code %d", what, rc);
}

#define IS_F32(a) (PyArray_TYPE(a) == NPY_FLOAT32)

/* ------------------------------------------------------------------ Context */

typedef struct {
    PyObject_HEAD
    dp_ctx ctx;
    dp_scratch col;              /* the convolution kernels' im2col buffer */
    PyThread_type_lock lock;
    int ready;
} ContextObject;

static PyTypeObject ContextType;

static int Context_init(ContextObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", NULL};
    int threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:Context", kwlist, &threads)) return -1;
    if (threads < 1 || threads > DP_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", DP_MAX_THREADS, threads);
        return -1;
    }
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Context is already initialized");
        return -1;
    }
    self->lock = PyThread_allocate_lock();
    if (!self->lock) { PyErr_NoMemory(); return -1; }
    int rc = dp_ctx_init(&self->ctx, threads);
    if (rc) { raise_code(rc, "Context"); return -1; }
    self->ready = 1;
    return 0;
}

static void Context_dealloc(ContextObject *self)
{
    if (self->ready) dp_ctx_free(&self->ctx);
    dp_scratch_free(&self->col);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_threads(ContextObject *self, void *closure)
{
    return PyLong_FromLong(self->ready ? self->ctx.threads : 0);
}

static PyGetSetDef Context_getset[] = {
    {"threads", (getter)Context_threads, NULL, "threads the kernels split work over", NULL},
    {NULL},
};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dptrain._core.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(threads=1): a thread pool and GEMM packing buffers for the kernels.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Context_init,
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_getset = Context_getset,
};

/* ctx argument: None -> a NULL context (the kernel allocates its own scratch). */
static int get_ctx(PyObject *obj, ContextObject **out)
{
    *out = NULL;
    if (!obj || obj == Py_None) return 0;
    if (!PyObject_TypeCheck(obj, &ContextType) || !((ContextObject *)obj)->ready) {
        PyErr_Format(PyExc_TypeError, "ctx must be a dptrain._core.Context or None, got %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = (ContextObject *)obj;
    return 0;
}

/* Runs stmt with the GIL released, holding `lock` (a PyThread lock, or NULL for none). */
#define WITHOUT_GIL_LOCKED(lock, stmt)                                        \
    do {                                                                      \
        PyThread_type_lock lk_ = (lock);                                      \
        Py_BEGIN_ALLOW_THREADS                                                \
        if (lk_) PyThread_acquire_lock(lk_, WAIT_LOCK);                       \
        stmt;                                                                 \
        if (lk_) PyThread_release_lock(lk_);                                  \
        Py_END_ALLOW_THREADS                                                  \
    } while (0)
#define WITHOUT_GIL(stmt) WITHOUT_GIL_LOCKED(NULL, stmt)
#define CTX_LOCK(cobj) ((cobj) ? (cobj)->lock : NULL)

/* ------------------------------------------------------------------ GEMM */

static PyObject *gemm_common(PyObject *args, PyObject *kwds, int naive)
{
    static char *kwlist[] = {"a", "b", "c", "trans_a", "trans_b", "alpha", "beta", "ctx", NULL};
    PyObject *ao, *bo, *co, *ctxo = NULL;
    int ta = 0, tb = 0;
    double alpha = 1.0, beta = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|$ppddO:gemm", kwlist, &ao, &bo, &co, &ta,
                                     &tb, &alpha, &beta, &ctxo))
        return NULL;
    PyArrayObject *a, *b, *c;
    ContextObject *cobj;
    if (!(a = check_array(ao, "a", NPY_NOTYPE, 2, 0)) || !(b = check_array(bo, "b", NPY_NOTYPE, 2, 0)) ||
        !(c = check_array(co, "c", NPY_NOTYPE, 2, 1)) || check_same_dtype(b, "b", a, "a") ||
        check_same_dtype(c, "c", a, "a") || get_ctx(ctxo, &cobj) ||
        check_finite(alpha, "alpha") || check_finite(beta, "beta"))
        return NULL;
    npy_intp M = PyArray_DIM(a, ta ? 1 : 0), K = PyArray_DIM(a, ta ? 0 : 1);
    npy_intp N = PyArray_DIM(b, tb ? 0 : 1), Kb = PyArray_DIM(b, tb ? 1 : 0);
    if (Kb != K) {
        npy_intp want[2] = {tb ? PyArray_DIM(b, 0) : K, tb ? K : PyArray_DIM(b, 1)};
        return check_shape(b, tb ? "b (transposed)" : "b", 2, want), NULL;
    }
    npy_intp cdims[2] = {M, N};
    if (check_shape(c, "c", 2, cdims) || check_no_overlap(c, "c", a, "a") || check_no_overlap(c, "c", b, "b"))
        return NULL;
    /* op(a)(i, k) = a[i, k] or a[k, i]: strides in elements */
    ptrdiff_t lda = PyArray_DIM(a, 1), ldb = PyArray_DIM(b, 1);
    ptrdiff_t rsa = ta ? 1 : lda, csa = ta ? lda : 1, rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    int rc = 0;
    void *C = PyArray_DATA(c);
    const void *A = PyArray_DATA(a), *B = PyArray_DATA(b);
    if (IS_F32(a)) {
        if (naive)
            WITHOUT_GIL(dp_gemm_naive_f32(C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K, (float)alpha, (float)beta));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_gemm_f32(cobj ? &cobj->ctx : NULL, C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K, (float)alpha, (float)beta));
    } else {
        if (naive)
            WITHOUT_GIL(dp_gemm_naive_f64(C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K, alpha, beta));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_gemm_f64(cobj ? &cobj->ctx : NULL, C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K, alpha, beta));
    }
    if (rc) return raise_code(rc, "gemm");
    Py_RETURN_NONE;
}

static PyObject *py_gemm(PyObject *self, PyObject *args, PyObject *kwds) { return gemm_common(args, kwds, 0); }
static PyObject *py_gemm_naive(PyObject *self, PyObject *args, PyObject *kwds) { return gemm_common(args, kwds, 1); }

/* ------------------------------------------------------------------ dense layer */

static PyObject *py_dense_forward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "w", "b", "y", "ctx", NULL};
    PyObject *xo, *wo, *bo, *yo, *ctxo = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|$O:dense_forward", kwlist, &xo, &wo, &bo, &yo, &ctxo))
        return NULL;
    PyArrayObject *x, *w, *b, *y;
    ContextObject *cobj;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) || !(w = check_array(wo, "w", NPY_NOTYPE, 2, 0)) ||
        !(b = check_array(bo, "b", NPY_NOTYPE, 1, 0)) || !(y = check_array(yo, "y", NPY_NOTYPE, 2, 1)) ||
        check_same_dtype(w, "w", x, "x") || check_same_dtype(b, "b", x, "x") ||
        check_same_dtype(y, "y", x, "x") || get_ctx(ctxo, &cobj))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), IN = PyArray_DIM(x, 1), OUT = PyArray_DIM(w, 0);
    npy_intp wd[2] = {OUT, IN}, bd[1] = {OUT}, yd[2] = {B, OUT};
    if (check_shape(w, "w", 2, wd) || check_shape(b, "b", 1, bd) || check_shape(y, "y", 2, yd) ||
        check_no_overlap(y, "y", x, "x") || check_no_overlap(y, "y", w, "w") || check_no_overlap(y, "y", b, "b"))
        return NULL;
    int rc;
    dp_ctx *c = cobj ? &cobj->ctx : NULL;
    if (IS_F32(x))
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_forward_f32(c, PyArray_DATA(y), PyArray_DATA(x), PyArray_DATA(w), PyArray_DATA(b), (int)B, (int)IN, (int)OUT));
    else
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_forward_f64(c, PyArray_DATA(y), PyArray_DATA(x), PyArray_DATA(w), PyArray_DATA(b), (int)B, (int)IN, (int)OUT));
    if (rc) return raise_code(rc, "dense_forward");
    Py_RETURN_NONE;
}

static PyObject *py_dense_backward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dy", "x", "w", "dw", "db", "dx", "ctx", NULL};
    PyObject *dyo, *xo, *wo, *dwo, *dbo, *dxo = Py_None, *ctxo = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO|O$O:dense_backward", kwlist, &dyo, &xo, &wo,
                                     &dwo, &dbo, &dxo, &ctxo))
        return NULL;
    PyArrayObject *dy, *x, *w, *dw, *db, *dx = NULL;
    ContextObject *cobj;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 2, 0)) || !(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 2, 0)) || !(dw = check_array(dwo, "dw", NPY_NOTYPE, 2, 1)) ||
        !(db = check_array(dbo, "db", NPY_NOTYPE, 1, 1)) ||
        (dxo != Py_None && !(dx = check_array(dxo, "dx", NPY_NOTYPE, 2, 1))) ||
        check_same_dtype(x, "x", dy, "dy") || check_same_dtype(w, "w", dy, "dy") ||
        check_same_dtype(dw, "dw", dy, "dy") || check_same_dtype(db, "db", dy, "dy") ||
        (dx && check_same_dtype(dx, "dx", dy, "dy")) || get_ctx(ctxo, &cobj))
        return NULL;
    npy_intp B = PyArray_DIM(dy, 0), OUT = PyArray_DIM(dy, 1), IN = PyArray_DIM(w, 1);
    npy_intp xd[2] = {B, IN}, wd[2] = {OUT, IN}, bd[1] = {OUT};
    if (check_shape(x, "x", 2, xd) || check_shape(w, "w", 2, wd) || check_shape(dw, "dw", 2, wd) ||
        check_shape(db, "db", 1, bd) || (dx && check_shape(dx, "dx", 2, xd)))
        return NULL;
    PyArrayObject *ins[3] = {dy, x, w};
    const char *in_names[3] = {"dy", "x", "w"};
    for (int i = 0; i < 3; i++)
        if (check_no_overlap(dw, "dw", ins[i], in_names[i]) || check_no_overlap(db, "db", ins[i], in_names[i]) ||
            (dx && check_no_overlap(dx, "dx", ins[i], in_names[i])))
            return NULL;
    if ((dx && (check_no_overlap(dx, "dx", dw, "dw") || check_no_overlap(dx, "dx", db, "db"))) ||
        check_no_overlap(db, "db", dw, "dw"))
        return NULL;
    int rc;
    dp_ctx *c = cobj ? &cobj->ctx : NULL;
    void *dxp = dx ? PyArray_DATA(dx) : NULL;
    if (IS_F32(dy))
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_backward_f32(c, PyArray_DATA(dw), PyArray_DATA(db), dxp, PyArray_DATA(dy), PyArray_DATA(x), PyArray_DATA(w), (int)B, (int)IN, (int)OUT));
    else
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_backward_f64(c, PyArray_DATA(dw), PyArray_DATA(db), dxp, PyArray_DATA(dy), PyArray_DATA(x), PyArray_DATA(w), (int)B, (int)IN, (int)OUT));
    if (rc) return raise_code(rc, "dense_backward");
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ activations */

/* Element-wise kernels: every array has the shape of the first; the output may be the very
 * same array as an input (in place) but must not partially overlap one. */
static int check_elementwise(PyArrayObject *out, const char *oname, PyArrayObject *in, const char *iname)
{
    if (check_same_dtype(out, oname, in, iname) ||
        check_shape(out, oname, PyArray_NDIM(in), PyArray_DIMS(in)))
        return -1;
    if (PyArray_DATA(out) == PyArray_DATA(in)) return 0;
    return check_no_overlap(out, oname, in, iname);
}

static PyObject *py_relu_forward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "y", NULL};
    PyObject *xo, *yo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:relu_forward", kwlist, &xo, &yo)) return NULL;
    PyArrayObject *x, *y;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, -1, 0)) || !(y = check_array(yo, "y", NPY_NOTYPE, -1, 1)) ||
        check_elementwise(y, "y", x, "x"))
        return NULL;
    ptrdiff_t n = PyArray_SIZE(x);
    if (IS_F32(x)) WITHOUT_GIL(dp_relu_forward_f32(PyArray_DATA(y), PyArray_DATA(x), n));
    else WITHOUT_GIL(dp_relu_forward_f64(PyArray_DATA(y), PyArray_DATA(x), n));
    Py_RETURN_NONE;
}

static PyObject *py_relu_backward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dy", "y", "dx", NULL};
    PyObject *dyo, *yo, *dxo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:relu_backward", kwlist, &dyo, &yo, &dxo)) return NULL;
    PyArrayObject *dy, *y, *dx;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, -1, 0)) || !(y = check_array(yo, "y", NPY_NOTYPE, -1, 0)) ||
        !(dx = check_array(dxo, "dx", NPY_NOTYPE, -1, 1)) || check_elementwise(y, "y", dy, "dy") ||
        check_elementwise(dx, "dx", dy, "dy") || check_no_overlap(dx, "dx", y, "y"))
        return NULL;
    ptrdiff_t n = PyArray_SIZE(dy);
    if (IS_F32(dy)) WITHOUT_GIL(dp_relu_backward_f32(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(y), n));
    else WITHOUT_GIL(dp_relu_backward_f64(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(y), n));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ losses */

/* grad_scale argument: None -> 1/B. */
static int get_grad_scale(PyObject *obj, npy_intp B, double *out)
{
    if (!obj || obj == Py_None) { *out = B > 0 ? 1.0 / (double)B : 0.0; return 0; }
    *out = PyFloat_AsDouble(obj);
    if (*out == -1.0 && PyErr_Occurred()) return -1;
    return check_finite(*out, "grad_scale");
}

static PyObject *loss_common(PyObject *args, PyObject *kwds, int binary)
{
    static char *kwlist[] = {"logits", "labels", "dlogits", "grad_scale", NULL};
    PyObject *zo, *lo, *dzo = Py_None, *gso = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, binary ? "OO|OO:sigmoid_bce" : "OO|OO:softmax_xent",
                                     kwlist, &zo, &lo, &dzo, &gso))
        return NULL;
    PyArrayObject *z, *l, *dz = NULL;
    if (!(z = check_array(zo, "logits", NPY_NOTYPE, -1, 0)) || !(l = check_array(lo, "labels", NPY_INT64, 1, 0)))
        return NULL;
    int nd = PyArray_NDIM(z);
    if (binary ? !(nd == 1 || (nd == 2 && PyArray_DIM(z, 1) == 1)) : nd != 2) {
        char s[128];
        shape_str(s, sizeof s, nd, PyArray_DIMS(z));
        PyErr_Format(PyExc_ValueError, "logits has shape %s, expected %s", s, binary ? "(B,) or (B, 1)" : "(B, C)");
        return NULL;
    }
    npy_intp B = PyArray_DIM(z, 0), C = binary ? 1 : PyArray_DIM(z, 1);
    npy_intp ld[1] = {B};
    double gs;
    if (!binary && C < 1) return PyErr_Format(PyExc_ValueError, "logits has 0 classes"), NULL;
    if (check_shape(l, "labels", 1, ld) || get_grad_scale(gso, B, &gs)) return NULL;
    /* the kernels read a row's label after writing its gradient: they must not overlap */
    if (dzo != Py_None && (!(dz = check_array(dzo, "dlogits", NPY_NOTYPE, -1, 1)) ||
                           check_elementwise(dz, "dlogits", z, "logits") ||
                           check_no_overlap(dz, "dlogits", l, "labels")))
        return NULL;
    double loss = 0;
    int rc;
    void *dzp = dz ? PyArray_DATA(dz) : NULL;
    if (binary) {
        if (IS_F32(z)) WITHOUT_GIL(rc = dp_sigmoid_bce_f32(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l), (int)B, (float)gs));
        else WITHOUT_GIL(rc = dp_sigmoid_bce_f64(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l), (int)B, gs));
    } else {
        if (IS_F32(z)) WITHOUT_GIL(rc = dp_softmax_xent_f32(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C, (float)gs));
        else WITHOUT_GIL(rc = dp_softmax_xent_f64(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C, gs));
    }
    if (rc == DP_ELABEL) return label_error(l, binary ? 2 : C), NULL;
    if (rc) return raise_code(rc, binary ? "sigmoid_bce" : "softmax_xent");
    return PyFloat_FromDouble(loss);
}

static PyObject *py_softmax_xent(PyObject *self, PyObject *args, PyObject *kwds) { return loss_common(args, kwds, 0); }
static PyObject *py_sigmoid_bce(PyObject *self, PyObject *args, PyObject *kwds) { return loss_common(args, kwds, 1); }

static PyObject *py_argmax(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "out", NULL};
    PyObject *xo, *oo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:argmax", kwlist, &xo, &oo)) return NULL;
    PyArrayObject *x, *o;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) || !(o = check_array(oo, "out", NPY_INT64, 1, 1)))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), C = PyArray_DIM(x, 1), od[1] = {B};
    if (C < 1) return PyErr_Format(PyExc_ValueError, "x has shape (%ld, 0): no column to pick", (long)B), NULL;
    if (check_shape(o, "out", 1, od) || check_no_overlap(o, "out", x, "x")) return NULL;
    if (IS_F32(x)) WITHOUT_GIL(dp_argmax_f32(PyArray_DATA(o), PyArray_DATA(x), (int)B, (int)C));
    else WITHOUT_GIL(dp_argmax_f64(PyArray_DATA(o), PyArray_DATA(x), (int)B, (int)C));
    Py_RETURN_NONE;
}

static PyObject *py_count_correct(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"logits", "labels", NULL};
    PyObject *zo, *lo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:count_correct", kwlist, &zo, &lo)) return NULL;
    PyArrayObject *z, *l;
    if (!(z = check_array(zo, "logits", NPY_NOTYPE, -1, 0)) || !(l = check_array(lo, "labels", NPY_INT64, 1, 0)))
        return NULL;
    if (PyArray_NDIM(z) != 1 && PyArray_NDIM(z) != 2) {
        char s[128];
        shape_str(s, sizeof s, PyArray_NDIM(z), PyArray_DIMS(z));
        return PyErr_Format(PyExc_ValueError, "logits has shape %s, expected (B,) or (B, C)", s), NULL;
    }
    npy_intp B = PyArray_DIM(z, 0), C = PyArray_NDIM(z) == 2 ? PyArray_DIM(z, 1) : 1, ld[1] = {B};
    if (C < 1) return PyErr_Format(PyExc_ValueError, "logits has 0 classes"), NULL;
    if (check_shape(l, "labels", 1, ld)) return NULL;
    int64_t n;
    int rc;
    if (IS_F32(z)) WITHOUT_GIL(rc = dp_count_correct_f32(&n, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C));
    else WITHOUT_GIL(rc = dp_count_correct_f64(&n, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C));
    if (rc == DP_ELABEL) return label_error(l, C == 1 ? 2 : C), NULL;
    return PyLong_FromLongLong(n);
}

/* ------------------------------------------------------------------ optimizer, buffers */

static PyObject *py_sgd_step(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"params", "grads", "velocity", "lr", "momentum", "dampening",
                             "weight_decay", "nesterov", "first_step", NULL};
    PyObject *po, *go, *vo;
    double lr, mom = 0, damp = 0, wd = 0;
    int nesterov = 0, first = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|$ddddpp:sgd_step", kwlist, &po, &go, &vo, &lr,
                                     &mom, &damp, &wd, &nesterov, &first))
        return NULL;
    if (!kwds || !PyDict_GetItemString(kwds, "lr"))
        return PyErr_Format(PyExc_TypeError, "sgd_step() missing the keyword argument lr"), NULL;
    PyArrayObject *p, *g, *v = NULL;
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 1)) || !(g = check_array(go, "grads", NPY_NOTYPE, 1, 0)) ||
        check_elementwise(g, "grads", p, "params") || check_finite(lr, "lr") ||
        check_finite(mom, "momentum") || check_finite(damp, "dampening") || check_finite(wd, "weight_decay"))
        return NULL;
    char b1[64], b2[64];
    if (lr < 0)
        return PyErr_Format(PyExc_ValueError, "lr must be >= 0, got %s", double_repr(b1, sizeof b1, lr)), NULL;
    if (mom < 0)
        return PyErr_Format(PyExc_ValueError, "momentum must be >= 0, got %s", double_repr(b1, sizeof b1, mom)), NULL;
    if (wd < 0)
        return PyErr_Format(PyExc_ValueError, "weight_decay must be >= 0, got %s", double_repr(b1, sizeof b1, wd)), NULL;
    if (nesterov && (mom <= 0 || damp != 0))
        return PyErr_Format(PyExc_ValueError,
                            "nesterov needs momentum > 0 and dampening == 0 (momentum=%s, dampening=%s)",
                            double_repr(b1, sizeof b1, mom), double_repr(b2, sizeof b2, damp)), NULL;
    if (PyArray_DATA(p) == PyArray_DATA(g))
        return PyErr_Format(PyExc_ValueError, "grads shares memory with params"), NULL;
    if (mom != 0) {
        if (vo == Py_None)
            return PyErr_Format(PyExc_ValueError, "velocity is None, but momentum=%s needs it",
                                double_repr(b1, sizeof b1, mom)), NULL;
        if (!(v = check_array(vo, "velocity", NPY_NOTYPE, 1, 1)) || check_elementwise(v, "velocity", p, "params") ||
            check_no_overlap(v, "velocity", p, "params") || check_no_overlap(v, "velocity", g, "grads"))
            return NULL;
    }
    if (check_no_overlap(p, "params", g, "grads")) return NULL;
    ptrdiff_t n = PyArray_SIZE(p);
    void *vp = v ? PyArray_DATA(v) : NULL;
    if (IS_F32(p))
        WITHOUT_GIL(dp_sgd_step_f32(PyArray_DATA(p), vp, PyArray_DATA(g), n, (float)lr, (float)mom, (float)damp, (float)wd, nesterov, first));
    else
        WITHOUT_GIL(dp_sgd_step_f64(PyArray_DATA(p), vp, PyArray_DATA(g), n, lr, mom, damp, wd, nesterov, first));
    Py_RETURN_NONE;
}

/* start/stop arguments: a half-open element range inside [0, n]. */
static int get_range(PyObject *starto, PyObject *stopo, npy_intp n, ptrdiff_t *start, ptrdiff_t *stop)
{
    *start = 0;
    *stop = n;
    if (starto && starto != Py_None) {
        *start = PyLong_AsSsize_t(starto);
        if (*start == -1 && PyErr_Occurred()) return -1;
    }
    if (stopo && stopo != Py_None) {
        *stop = PyLong_AsSsize_t(stopo);
        if (*stop == -1 && PyErr_Occurred()) return -1;
    }
    if (*start < 0 || *stop > n || *start > *stop) {
        PyErr_Format(PyExc_ValueError, "start=%zd, stop=%zd is not a range inside [0, %zd]", *start, *stop, (Py_ssize_t)n);
        return -1;
    }
    return 0;
}

#define MAX_SUM_INPUTS 1024

static PyObject *py_sum_buffers(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"out", "inputs", "scale", "start", "stop", NULL};
    PyObject *oo, *ino, *starto = NULL, *stopo = NULL, *seq = NULL, *result = NULL;
    double scale = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$dOO:sum_buffers", kwlist, &oo, &ino, &scale, &starto, &stopo))
        return NULL;
    PyArrayObject *out;
    if (!(out = check_array(oo, "out", NPY_NOTYPE, 1, 1)) || check_finite(scale, "scale")) return NULL;
    if (!(seq = PySequence_Fast(ino, "inputs must be a sequence of arrays"))) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    const void *ptrs[MAX_SUM_INPUTS];
    ptrdiff_t start, stop;
    if (k == 0) {
        PyErr_SetString(PyExc_ValueError, "inputs is empty: sum_buffers needs at least one array");
        goto fail;
    }
    if (k > MAX_SUM_INPUTS) {
        PyErr_Format(PyExc_ValueError, "inputs has %zd arrays, at most %d are supported", k, MAX_SUM_INPUTS);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        char name[48];
        snprintf(name, sizeof name, "inputs[%zd]", i);
        PyArrayObject *a = check_array(PySequence_Fast_GET_ITEM(seq, i), name, NPY_NOTYPE, 1, 0);
        if (!a || check_elementwise(a, name, out, "out")) goto fail;
        ptrs[i] = PyArray_DATA(a);
    }
    if (get_range(starto, stopo, PyArray_SIZE(out), &start, &stop)) goto fail;
    if (IS_F32(out))
        WITHOUT_GIL(dp_sum_buffers_f32(PyArray_DATA(out), (const float *const *)ptrs, (int)k, start, stop, (float)scale));
    else
        WITHOUT_GIL(dp_sum_buffers_f64(PyArray_DATA(out), (const double *const *)ptrs, (int)k, start, stop, scale));
    result = Py_None;
    Py_INCREF(result);
fail:
    Py_XDECREF(seq);
    return result;
}

static PyObject *py_scale(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buf", "alpha", "start", "stop", NULL};
    PyObject *bo, *starto = NULL, *stopo = NULL;
    double alpha;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Od|$OO:scale_", kwlist, &bo, &alpha, &starto, &stopo)) return NULL;
    PyArrayObject *b;
    ptrdiff_t start, stop;
    if (!(b = check_array(bo, "buf", NPY_NOTYPE, 1, 1)) || check_finite(alpha, "alpha") ||
        get_range(starto, stopo, PyArray_SIZE(b), &start, &stop))
        return NULL;
    if (IS_F32(b)) WITHOUT_GIL(dp_scale_f32((float *)PyArray_DATA(b) + start, stop - start, (float)alpha));
    else WITHOUT_GIL(dp_scale_f64((double *)PyArray_DATA(b) + start, stop - start, alpha));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ batch assembly */

static PyObject *py_gather_rows(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "index", "out", NULL};
    PyObject *xo, *io, *oo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:gather_rows", kwlist, &xo, &io, &oo)) return NULL;
    PyArrayObject *x, *idx, *out;
    if (!(idx = check_array(io, "index", NPY_INT64, 1, 0))) return NULL;
    if (!PyArray_Check(xo) || !PyArray_Check(oo))
        return PyErr_Format(PyExc_TypeError, "x and out must be numpy.ndarray"), NULL;
    x = (PyArrayObject *)xo;
    out = (PyArrayObject *)oo;
    if (PyArray_NDIM(x) < 1 || !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_IS_C_CONTIGUOUS(out) ||
        !PyArray_ISWRITEABLE(out))
        return PyErr_Format(PyExc_ValueError, "x must be a C-contiguous array and out a writeable "
                            "C-contiguous array"), NULL;
    /* rows are copied as bytes: only plain numbers may pass (an object array's copy would
     * duplicate references without counting them) */
    if (!PyTypeNum_ISNUMBER(PyArray_TYPE(x)) || PyDataType_REFCHK(PyArray_DESCR(x)))
        return PyErr_Format(PyExc_TypeError, "x has dtype %s: gather_rows copies rows of a numeric "
                            "dtype (bool, integer, floating or complex)", dtype_name(x)), NULL;
    if (!PyArray_EquivTypes(PyArray_DESCR(x), PyArray_DESCR(out)))
        return PyErr_Format(PyExc_TypeError, "out has dtype %s, expected %s (the dtype of x)",
                            dtype_name(out), dtype_name(x)), NULL;
    npy_intp n = PyArray_SIZE(idx), rows = PyArray_DIM(x, 0);
    npy_intp want[NPY_MAXDIMS];
    want[0] = n;
    for (int d = 1; d < PyArray_NDIM(x); d++) want[d] = PyArray_DIM(x, d);
    if (check_shape(out, "out", PyArray_NDIM(x), want) || check_no_overlap(out, "out", x, "x") ||
        check_no_overlap(out, "out", idx, "index"))
        return NULL;
    size_t row_bytes = rows ? (size_t)(PyArray_NBYTES(x) / rows) : 0;
    const int64_t *ix = PyArray_DATA(idx);
    for (npy_intp i = 0; i < n; i++)
        if (ix[i] < 0 || ix[i] >= rows)
            return PyErr_Format(PyExc_IndexError, "index[%ld] = %lld is out of range for %ld rows",
                                (long)i, (long long)ix[i], (long)rows), NULL;
    const char *src = PyArray_BYTES(x);
    char *dst = PyArray_BYTES(out);
    WITHOUT_GIL(for (npy_intp i = 0; i < n; i++) memcpy(dst + (size_t)i * row_bytes, src + (size_t)ix[i] * row_bytes, row_bytes));
    Py_RETURN_NONE;
}

static PyObject *py_zero(PyObject *self, PyObject *arg)
{
    PyArrayObject *a = check_array(arg, "buf", NPY_NOTYPE, -1, 1);
    if (!a) return NULL;
    void *p = PyArray_DATA(a);
    size_t n = (size_t)PyArray_NBYTES(a);
    WITHOUT_GIL(memset(p, 0, n));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ convolution, pooling */

/* The (C, H, W) -> (OC, OH, OW) geometry of x (B, C, H, W) and w (OC, C, KH, KW), checked. */
static int conv_geometry(PyArrayObject *x, PyArrayObject *w, int padding, dp_conv_geom *g, int *OH, int *OW)
{
    char xs[128], ws[128];
    shape_str(xs, sizeof xs, PyArray_NDIM(x), PyArray_DIMS(x));
    shape_str(ws, sizeof ws, PyArray_NDIM(w), PyArray_DIMS(w));
    if (padding < 0) return PyErr_Format(PyExc_ValueError, "padding must be >= 0, got %d", padding), -1;
    if (PyArray_DIM(w, 1) != PyArray_DIM(x, 1))
        return PyErr_Format(PyExc_ValueError, "w has shape %s, but x has shape %s: w.shape[1] must be "
                            "x's channel count %ld", ws, xs, (long)PyArray_DIM(x, 1)), -1;
    for (int i = 1; i < 4; i++)
        if (PyArray_DIM(x, i) < 1)
            return PyErr_Format(PyExc_ValueError, "x has shape %s, expected C, H, W >= 1", xs), -1;
    for (int i = 0; i < 4; i++)
        if (PyArray_DIM(w, i) < 1)
            return PyErr_Format(PyExc_ValueError, "w has shape %s, expected every size >= 1", ws), -1;
    g->C = (int)PyArray_DIM(x, 1);
    g->H = (int)PyArray_DIM(x, 2);
    g->W = (int)PyArray_DIM(x, 3);
    g->OC = (int)PyArray_DIM(w, 0);
    g->KH = (int)PyArray_DIM(w, 2);
    g->KW = (int)PyArray_DIM(w, 3);
    g->pad = padding;
    if (dp_conv_out(g, OH, OW) == DP_OK) return 0;
    if ((long long)g->H + 2LL * padding < g->KH || (long long)g->W + 2LL * padding < g->KW)
        return PyErr_Format(PyExc_ValueError, "w has shape %s: its %dx%d kernel is larger than the "
                            "%dx%d input of x %s with padding %d", ws, g->KH, g->KW, g->H, g->W, xs,
                            padding), -1;
    return PyErr_Format(PyExc_ValueError, "x %s and w %s with padding %d are too large for the "
                        "kernels' int sizes", xs, ws, padding), -1;
}

static PyObject *conv_forward_common(PyObject *args, PyObject *kwds, int naive)
{
    static char *kwlist[] = {"x", "w", "b", "y", "padding", "ctx", NULL};
    PyObject *xo, *wo, *bo, *yo, *ctxo = NULL;
    int padding = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, naive ? "OOOO|$iO:conv2d_forward_naive" : "OOOO|$iO:conv2d_forward",
                                     kwlist, &xo, &wo, &bo, &yo, &padding, &ctxo))
        return NULL;
    PyArrayObject *x, *w, *b, *y;
    ContextObject *cobj;
    dp_conv_geom g;
    int OH, OW;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) || !(w = check_array(wo, "w", NPY_NOTYPE, 4, 0)) ||
        !(b = check_array(bo, "b", NPY_NOTYPE, 1, 0)) || !(y = check_array(yo, "y", NPY_NOTYPE, 4, 1)) ||
        check_same_dtype(w, "w", x, "x") || check_same_dtype(b, "b", x, "x") ||
        check_same_dtype(y, "y", x, "x") || get_ctx(ctxo, &cobj) || conv_geometry(x, w, padding, &g, &OH, &OW))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), bd[1] = {g.OC}, yd[4] = {B, g.OC, OH, OW};
    if (check_shape(b, "b", 1, bd) || check_shape(y, "y", 4, yd) || check_no_overlap(y, "y", x, "x") ||
        check_no_overlap(y, "y", w, "w") || check_no_overlap(y, "y", b, "b"))
        return NULL;
    int rc = DP_OK;
    void *Y = PyArray_DATA(y);
    const void *X = PyArray_DATA(x), *Wp = PyArray_DATA(w), *Bp = PyArray_DATA(b);
    if (naive) {
        if (IS_F32(x)) WITHOUT_GIL(dp_conv2d_forward_naive_f32(Y, X, Wp, Bp, (int)B, &g));
        else WITHOUT_GIL(dp_conv2d_forward_naive_f64(Y, X, Wp, Bp, (int)B, &g));
    } else {
        dp_ctx *c = cobj ? &cobj->ctx : NULL;
        dp_scratch *col = cobj ? &cobj->col : NULL;
        if (IS_F32(x))
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_forward_f32(c, col, Y, X, Wp, Bp, (int)B, &g));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_forward_f64(c, col, Y, X, Wp, Bp, (int)B, &g));
    }
    if (rc) return raise_code(rc, "conv2d_forward");
    Py_RETURN_NONE;
}

static PyObject *conv_backward_common(PyObject *args, PyObject *kwds, int naive)
{
    static char *kwlist[] = {"dy", "x", "w", "dw", "db", "dx", "padding", "ctx", NULL};
    PyObject *dyo, *xo, *wo, *dwo, *dbo, *dxo = Py_None, *ctxo = NULL;
    int padding = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, naive ? "OOOOO|O$iO:conv2d_backward_naive" : "OOOOO|O$iO:conv2d_backward",
                                     kwlist, &dyo, &xo, &wo, &dwo, &dbo, &dxo, &padding, &ctxo))
        return NULL;
    PyArrayObject *dy, *x, *w, *dw, *db, *dx = NULL;
    ContextObject *cobj;
    dp_conv_geom g;
    int OH, OW;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 4, 0)) || !(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 4, 0)) || !(dw = check_array(dwo, "dw", NPY_NOTYPE, 4, 1)) ||
        !(db = check_array(dbo, "db", NPY_NOTYPE, 1, 1)) ||
        (dxo != Py_None && !(dx = check_array(dxo, "dx", NPY_NOTYPE, 4, 1))) ||
        check_same_dtype(x, "x", dy, "dy") || check_same_dtype(w, "w", dy, "dy") ||
        check_same_dtype(dw, "dw", dy, "dy") || check_same_dtype(db, "db", dy, "dy") ||
        (dx && check_same_dtype(dx, "dx", dy, "dy")) || get_ctx(ctxo, &cobj) ||
        conv_geometry(x, w, padding, &g, &OH, &OW))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), yd[4] = {B, g.OC, OH, OW}, bd[1] = {g.OC};
    if (check_shape(dy, "dy", 4, yd) || check_shape(dw, "dw", 4, PyArray_DIMS(w)) ||
        check_shape(db, "db", 1, bd) || (dx && check_shape(dx, "dx", 4, PyArray_DIMS(x))))
        return NULL;
    PyArrayObject *ins[3] = {dy, x, w};
    const char *in_names[3] = {"dy", "x", "w"};
    for (int i = 0; i < 3; i++)
        if (check_no_overlap(dw, "dw", ins[i], in_names[i]) || check_no_overlap(db, "db", ins[i], in_names[i]) ||
            (dx && check_no_overlap(dx, "dx", ins[i], in_names[i])))
            return NULL;
    if ((dx && (check_no_overlap(dx, "dx", dw, "dw") || check_no_overlap(dx, "dx", db, "db"))) ||
        check_no_overlap(db, "db", dw, "dw"))
        return NULL;
    int rc = DP_OK;
    void *DW = PyArray_DATA(dw), *DB = PyArray_DATA(db), *DX = dx ? PyArray_DATA(dx) : NULL;
    const void *DY = PyArray_DATA(dy), *X = PyArray_DATA(x), *Wp = PyArray_DATA(w);
    if (naive) {
        if (IS_F32(x)) WITHOUT_GIL(dp_conv2d_backward_naive_f32(DW, DB, DX, DY, X, Wp, (int)B, &g));
        else WITHOUT_GIL(dp_conv2d_backward_naive_f64(DW, DB, DX, DY, X, Wp, (int)B, &g));
    } else {
        dp_ctx *c = cobj ? &cobj->ctx : NULL;
        dp_scratch *col = cobj ? &cobj->col : NULL;
        if (IS_F32(x))
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_backward_f32(c, col, DW, DB, DX, DY, X, Wp, (int)B, &g));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_backward_f64(c, col, DW, DB, DX, DY, X, Wp, (int)B, &g));
    }
    if (rc) return raise_code(rc, "conv2d_backward");
    Py_RETURN_NONE;
}

static PyObject *py_conv2d_forward(PyObject *self, PyObject *args, PyObject *kwds) { return conv_forward_common(args, kwds, 0); }
static PyObject *py_conv2d_forward_naive(PyObject *self, PyObject *args, PyObject *kwds) { return conv_forward_common(args, kwds, 1); }
static PyObject *py_conv2d_backward(PyObject *self, PyObject *args, PyObject *kwds) { return conv_backward_common(args, kwds, 0); }
static PyObject *py_conv2d_backward_naive(PyObject *self, PyObject *args, PyObject *kwds) { return conv_backward_common(args, kwds, 1); }

/* The pooled shape (B, C, H / 2, W / 2) of a (B, C, H, W) array, H and W >= 2. */
static int pooled_shape(PyArrayObject *a, const char *name, npy_intp *out)
{
    if (PyArray_DIM(a, 2) < 2 || PyArray_DIM(a, 3) < 2) {
        char s[128];
        shape_str(s, sizeof s, 4, PyArray_DIMS(a));
        PyErr_Format(PyExc_ValueError, "%s has shape %s: 2x2 pooling needs H >= 2 and W >= 2", name, s);
        return -1;
    }
    out[0] = PyArray_DIM(a, 0);
    out[1] = PyArray_DIM(a, 1);
    out[2] = PyArray_DIM(a, 2) / 2;
    out[3] = PyArray_DIM(a, 3) / 2;
    return 0;
}

static PyObject *py_maxpool2_forward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"x", "y", "idx", NULL};
    PyObject *xo, *yo, *io;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:maxpool2_forward", kwlist, &xo, &yo, &io)) return NULL;
    PyArrayObject *x, *y, *idx;
    npy_intp yd[4];
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) || !(y = check_array(yo, "y", NPY_NOTYPE, 4, 1)) ||
        !(idx = check_array(io, "idx", NPY_UINT8, 4, 1)) || check_same_dtype(y, "y", x, "x") ||
        pooled_shape(x, "x", yd) || check_shape(y, "y", 4, yd) || check_shape(idx, "idx", 4, yd) ||
        check_no_overlap(y, "y", x, "x") || check_no_overlap(idx, "idx", x, "x") || check_no_overlap(idx, "idx", y, "y"))
        return NULL;
    ptrdiff_t planes = (ptrdiff_t)PyArray_DIM(x, 0) * PyArray_DIM(x, 1);
    int H = (int)PyArray_DIM(x, 2), W = (int)PyArray_DIM(x, 3);
    if (IS_F32(x)) WITHOUT_GIL(dp_maxpool2_forward_f32(PyArray_DATA(y), PyArray_DATA(idx), PyArray_DATA(x), planes, H, W));
    else WITHOUT_GIL(dp_maxpool2_forward_f64(PyArray_DATA(y), PyArray_DATA(idx), PyArray_DATA(x), planes, H, W));
    Py_RETURN_NONE;
}

static PyObject *py_maxpool2_backward(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dy", "idx", "dx", NULL};
    PyObject *dyo, *io, *dxo;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:maxpool2_backward", kwlist, &dyo, &io, &dxo)) return NULL;
    PyArrayObject *dy, *idx, *dx;
    npy_intp yd[4];
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 4, 0)) || !(idx = check_array(io, "idx", NPY_UINT8, 4, 0)) ||
        !(dx = check_array(dxo, "dx", NPY_NOTYPE, 4, 1)) || check_same_dtype(dx, "dx", dy, "dy") ||
        pooled_shape(dx, "dx", yd) || check_shape(dy, "dy", 4, yd) || check_shape(idx, "idx", 4, yd) ||
        check_no_overlap(dx, "dx", dy, "dy") || check_no_overlap(dx, "dx", idx, "idx"))
        return NULL;
    const uint8_t *code = PyArray_DATA(idx);
    npy_intp n = PyArray_SIZE(idx);
    for (npy_intp i = 0; i < n; i++)
        if (code[i] > 3)
            return PyErr_Format(PyExc_ValueError, "idx holds %d at flat position %ld: a window position "
                                "is 0..3 (as maxpool2_forward writes it)", (int)code[i], (long)i), NULL;
    ptrdiff_t planes = (ptrdiff_t)PyArray_DIM(dx, 0) * PyArray_DIM(dx, 1);
    int H = (int)PyArray_DIM(dx, 2), W = (int)PyArray_DIM(dx, 3);
    if (IS_F32(dy)) WITHOUT_GIL(dp_maxpool2_backward_f32(PyArray_DATA(dx), PyArray_DATA(dy), code, planes, H, W));
    else WITHOUT_GIL(dp_maxpool2_backward_f64(PyArray_DATA(dx), PyArray_DATA(dy), code, planes, H, W));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ Network and ConvNet */

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
    Py_TYPE(self)->tp_free((PyObject *)self);
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

static PyTypeObject NetworkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dptrain._core.Network",
    .tp_basicsize = sizeof(NetworkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Network(sizes, loss, params, grads, *, threads=1): dense layers with ReLU between "
              "them over caller-owned flat parameter and gradient arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Network_init,
    .tp_dealloc = (destructor)Network_dealloc,
    .tp_methods = Net_methods,
    .tp_getset = Network_getset,
};

static PyObject *py_param_count(PyObject *self, PyObject *arg)
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

static PyTypeObject ConvNetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dptrain._core.ConvNet",
    .tp_basicsize = sizeof(ConvNetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ConvNet(input_shape, channels, dense, params, grads, *, kernel=3, padding=0, threads=1): "
              "conv blocks (conv -> ReLU -> 2x2 max-pool) then dense layers with ReLU between them, "
              "softmax cross-entropy, over caller-owned flat parameter and gradient arrays.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ConvNet_init,
    .tp_dealloc = (destructor)ConvNet_dealloc,
    .tp_methods = Net_methods,
    .tp_getset = ConvNet_getset,
};

/* ------------------------------------------------------------------ ShmGroup */

static PyObject *GroupAborted;   /* dptrain._core.GroupAborted(RuntimeError) */

typedef struct {
    PyObject_HEAD
    PyObject *control;            /* the array holding the dp_barrier (owned) */
    PyObject *buffers;            /* tuple of the workers' flat buffers (owned) */
    PyObject *out_obj;            /* owned reference to the out array, or NULL */
    dp_group g;                   /* the handle the dp_group_* calls take; g.bufs is ptrs */
    void *ptrs[DP_MAX_GROUP];
    int f32;
    npy_intp length;
} ShmGroupObject;

static dp_barrier *control_barrier(PyObject *obj, const char *name)
{
    PyArrayObject *a = check_array(obj, name, NPY_UINT8, 1, 1);
    if (!a) return NULL;
    if (PyArray_SIZE(a) < (npy_intp)sizeof(dp_barrier) || ((uintptr_t)PyArray_DATA(a) % 64) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a writeable uint8 array of >= %d bytes at a "
                     "64-byte aligned address", name, (int)sizeof(dp_barrier));
        return NULL;
    }
    return (dp_barrier *)PyArray_DATA(a);
}

static PyObject *py_init_control(PyObject *self, PyObject *args)
{
    PyObject *co;
    int n;
    if (!PyArg_ParseTuple(args, "Oi:init_group_control", &co, &n)) return NULL;
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return NULL;
    if (n < 1 || n > DP_MAX_GROUP) return PyErr_Format(PyExc_ValueError, "n must be in [1, %d], got %d", DP_MAX_GROUP, n), NULL;
    memset(b, 0, (size_t)PyArray_NBYTES((PyArrayObject *)co));   /* the arrival counters too */
    dp_barrier_init(b, n);
    Py_RETURN_NONE;
}

static PyObject *py_group_control_bytes(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > DP_MAX_GROUP) return PyErr_Format(PyExc_ValueError, "n must be in [1, %d], got %ld", DP_MAX_GROUP, n), NULL;
    return PyLong_FromSize_t(dp_group_control_bytes((int)n));
}

static PyObject *py_abort_control(PyObject *self, PyObject *args)
{
    PyObject *co;
    unsigned int code = 1;
    if (!PyArg_ParseTuple(args, "O|I:abort_group_control", &co, &code)) return NULL;
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return NULL;
    if (b->magic != DP_BARRIER_MAGIC)
        return PyErr_Format(PyExc_ValueError, "control is not initialized"), NULL;
    dp_barrier_abort(b, code ? code : 1);
    Py_RETURN_NONE;
}

static int ShmGroup_init(ShmGroupObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"control", "buffers", "rank", "out", "spin", "yield_time", "timeout",
                             "algorithm", NULL};
    PyObject *co, *bo, *seq = NULL, *oo = Py_None;
    int rank, rc = -1, algorithm = -1;
    double spin = 200e-6, yield_time = 2e-3, timeout = 0.0;
    const char *alg_name = "native";
    if (self->g.barrier) {
        PyErr_SetString(PyExc_RuntimeError, "ShmGroup is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOi|$Oddds:ShmGroup", kwlist, &co, &bo, &rank, &oo,
                                     &spin, &yield_time, &timeout, &alg_name))
        return -1;
    for (int a = 0; a < DP_ALLREDUCE_COUNT; a++)
        if (strcmp(alg_name, dp_allreduce_name(a)) == 0) algorithm = a;
    if (algorithm < 0) {
        PyErr_Format(PyExc_ValueError, "algorithm is '%s', expected 'native', 'ring' or 'tree'", alg_name);
        return -1;
    }
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return -1;
    if (b->magic != DP_BARRIER_MAGIC) {
        PyErr_SetString(PyExc_ValueError, "control is not initialized: call init_group_control(control, n) once first");
        return -1;
    }
    if (!(seq = PySequence_Fast(bo, "buffers must be a sequence of arrays"))) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (b->n < 1 || b->n > DP_MAX_GROUP) {
        PyErr_Format(PyExc_ValueError, "control holds a group of %u workers, expected 1 to %d: "
                     "it is not a control block made by init_group_control", b->n, DP_MAX_GROUP);
        goto fail;
    }
    if (oo == Py_None && n != (Py_ssize_t)b->n) {
        PyErr_Format(PyExc_ValueError, "buffers has %zd arrays, but the group has %u workers", n, b->n);
        goto fail;
    }
    if (n < 1 || n > DP_MAX_GROUP) {
        PyErr_Format(PyExc_ValueError, "buffers has %zd arrays, expected 1 to %d", n, DP_MAX_GROUP);
        goto fail;
    }
    if (rank < 0 || rank >= (int)b->n) {
        PyErr_Format(PyExc_ValueError, "rank must be in [0, %u), got %d", b->n, rank);
        goto fail;
    }
    if (!(isfinite(spin) && spin >= 0 && isfinite(yield_time) && yield_time >= 0 && isfinite(timeout) && timeout >= 0)) {
        PyErr_SetString(PyExc_ValueError, "spin, yield_time and timeout must be finite numbers >= 0");
        goto fail;
    }
    PyArrayObject *first = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        char name[48];
        snprintf(name, sizeof name, "buffers[%zd]", i);
        PyArrayObject *a = check_array(PySequence_Fast_GET_ITEM(seq, i), name, NPY_NOTYPE, 1, 1);
        if (!a) goto fail;
        if (!first) first = a;
        else if (check_same_dtype(a, name, first, "buffers[0]") ||
                 check_shape(a, name, 1, PyArray_DIMS(first)))
            goto fail;
        for (Py_ssize_t j = 0; j < i; j++)
            if (check_no_overlap(a, name, (PyArrayObject *)PySequence_Fast_GET_ITEM(seq, j), "another buffer"))
                goto fail;
        if (check_no_overlap(a, name, (PyArrayObject *)co, "control"))   /* the barrier's memory */
            goto fail;
        self->ptrs[i] = PyArray_DATA(a);
    }
    if (oo != Py_None) {
        PyArrayObject *o = check_array(oo, "out", PyArray_TYPE(first), 1, 1);
        if (!o || check_shape(o, "out", 1, PyArray_DIMS(first))) goto fail;
        for (Py_ssize_t j = 0; j < n; j++)
            if (check_no_overlap(o, "out", (PyArrayObject *)PySequence_Fast_GET_ITEM(seq, j), "a buffer"))
                goto fail;
        if (check_no_overlap(o, "out", (PyArrayObject *)co, "control")) goto fail;
        Py_INCREF(oo);
        self->out_obj = oo;
        self->g.out = PyArray_DATA(o);
    }
    if (algorithm != DP_ALLREDUCE_NATIVE && (oo != Py_None || n != (Py_ssize_t)b->n)) {
        PyErr_Format(PyExc_ValueError, "algorithm '%s' needs one buffer per worker (%u, got %zd) "
                     "and no out array", alg_name, b->n, n);
        goto fail;
    }
    if (algorithm == DP_ALLREDUCE_TREE && PyArray_SIZE(first) > 0) {
        self->g.scratch = PyMem_RawMalloc((size_t)PyArray_SIZE(first) * PyArray_ITEMSIZE(first));
        if (!self->g.scratch) { PyErr_NoMemory(); goto fail; }
    }
    self->g.algorithm = algorithm;
    self->buffers = PySequence_Tuple(seq);
    if (!self->buffers) goto fail;
    Py_INCREF(co);
    self->control = co;
    self->g.barrier = b;
    self->g.arrivals = dp_group_arrivals(b, (size_t)PyArray_NBYTES((PyArrayObject *)co), (int)b->n);
    self->g.n = (int)b->n;
    self->g.k = (int)n;
    self->g.rank = rank;
    self->g.bufs = self->ptrs;
    self->f32 = IS_F32(first);
    self->length = PyArray_SIZE(first);
    self->g.policy.spin_s = spin;
    self->g.policy.yield_s = yield_time;
    self->g.policy.timeout_s = timeout;
    rc = 0;
fail:
    Py_XDECREF(seq);
    return rc;
}

static void ShmGroup_dealloc(ShmGroupObject *self)
{
    Py_XDECREF(self->control);
    Py_XDECREF(self->buffers);
    Py_XDECREF(self->out_obj);
    PyMem_RawFree(self->g.scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *group_error(ShmGroupObject *self, int rc, uint32_t code, const char *what)
{
    if (rc == DP_EABORT) {
        PyObject *err = Py_BuildValue("(sI)", "group aborted", code);
        if (err) PyErr_SetObject(GroupAborted, err);
        Py_XDECREF(err);
        return NULL;
    }
    if (rc == DP_ETIMEOUT) {
        char t[64], who[256] = "";
        int missing[16], k = self->g.arrivals ? dp_group_missing(self->g.arrivals, self->g.n, self->g.rank, missing, 16) : 0;
        if (k > 0) {
            size_t used = (size_t)snprintf(who, sizeof who, ": rank%s ", k > 1 ? "s" : "");
            for (int i = 0; i < k && i < 16 && used < sizeof who; i++)
                used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", i ? ", " : "", missing[i]);
            if (used < sizeof who)
                snprintf(who + used, sizeof who - used, "%s did not arrive", k > 16 ? ", ..." : "");
        }
        return PyErr_Format(PyExc_TimeoutError, "%s on rank %d timed out after %s s waiting for the "
                            "other %d workers%s", what, self->g.rank,
                            double_repr(t, sizeof t, self->g.policy.timeout_s), self->g.n - 1, who);
    }
    return raise_code(rc, what);
}

/* Built, and its arrays are still the ones it was built on (see held_array): the control
 * block where the barrier lives, every worker's buffer and the out array. */
static int group_control_ready(ShmGroupObject *self)
{
    if (!self->g.barrier) {
        PyErr_SetString(PyExc_RuntimeError, "ShmGroup is not initialized");
        return -1;
    }
    PyArrayObject *c = (PyArrayObject *)self->control;
    if (PyArray_DATA(c) != (void *)self->g.barrier || PyArray_TYPE(c) != NPY_UINT8 ||
        PyArray_NBYTES(c) < (npy_intp)sizeof(dp_barrier) || !PyArray_ISWRITEABLE(c))
        return PyErr_Format(PyExc_ValueError, "ShmGroup.control was changed after the ShmGroup "
                            "was built (moved, re-typed, shrunk or made read-only)"), -1;
    return 0;
}

static int group_ready(ShmGroupObject *self)
{
    if (group_control_ready(self)) return -1;
    int t = self->f32 ? NPY_FLOAT32 : NPY_FLOAT64;
    for (int i = 0; i < self->g.k; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(self->buffers, i);
        if (PyArray_DATA(a) != self->ptrs[i] || PyArray_TYPE(a) != t || PyArray_NDIM(a) != 1 ||
            PyArray_DIM(a, 0) != self->length || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISWRITEABLE(a))
            return PyErr_Format(PyExc_ValueError, "ShmGroup buffers[%d] was changed after the ShmGroup "
                                "was built: it must stay a writeable %s array of shape (%zd,) at its "
                                "memory", i, typenum_name(t), (Py_ssize_t)self->length), -1;
    }
    if (self->out_obj) {
        PyArrayObject *o = (PyArrayObject *)self->out_obj;
        if (PyArray_DATA(o) != self->g.out || PyArray_TYPE(o) != t || PyArray_NDIM(o) != 1 ||
            PyArray_DIM(o, 0) != self->length || !PyArray_IS_C_CONTIGUOUS(o) || !PyArray_ISWRITEABLE(o))
            return PyErr_Format(PyExc_ValueError, "ShmGroup out was changed after the ShmGroup was "
                                "built: it must stay a writeable %s array of shape (%zd,) at its memory",
                                typenum_name(t), (Py_ssize_t)self->length), -1;
    }
    return 0;
}

static PyObject *ShmGroup_barrier(ShmGroupObject *self, PyObject *unused)
{
    if (group_control_ready(self)) return NULL;
    uint32_t code = 0;
    double waited = 0;
    int rc;
    WITHOUT_GIL(rc = dp_group_barrier(&self->g, &waited, &code));
    if (rc) return group_error(self, rc, code, "barrier");
    return PyFloat_FromDouble(waited);
}

static PyObject *ShmGroup_allreduce(ShmGroupObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"scale", "start", "stop", NULL};
    double scale = 1.0;
    PyObject *starto = NULL, *stopo = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|dOO:allreduce", kwlist, &scale, &starto, &stopo)) return NULL;
    ptrdiff_t start, stop;
    if (group_ready(self) || check_finite(scale, "scale") || get_range(starto, stopo, self->length, &start, &stop))
        return NULL;
    uint32_t code = 0;
    double waited = 0;
    int rc;
    if (self->f32) WITHOUT_GIL(rc = dp_group_allreduce_f32(&self->g, start, stop, (float)scale, &waited, &code));
    else WITHOUT_GIL(rc = dp_group_allreduce_f64(&self->g, start, stop, scale, &waited, &code));
    if (rc) return group_error(self, rc, code, "allreduce");
    /* the wait at the entry barrier: this worker waiting for the slowest one (arrival skew),
     * not transfer */
    return PyFloat_FromDouble(waited);
}

static PyObject *ShmGroup_abort(ShmGroupObject *self, PyObject *args)
{
    unsigned int code = 1;
    if (!PyArg_ParseTuple(args, "|I:abort", &code)) return NULL;
    if (group_control_ready(self)) return NULL;    /* aborting needs the barrier alone */
    dp_barrier_abort(self->g.barrier, code ? code : 1);
    Py_RETURN_NONE;
}

static PyObject *ShmGroup_get_aborted(ShmGroupObject *self, void *c)
{
    if (!self->g.barrier) return PyLong_FromLong(0);
    if (group_control_ready(self)) return NULL;
    return PyLong_FromUnsignedLong(dp_barrier_abort_code(self->g.barrier));
}
static PyObject *ShmGroup_get_rank(ShmGroupObject *self, void *c) { return PyLong_FromLong(self->g.rank); }
static PyObject *ShmGroup_get_size(ShmGroupObject *self, void *c) { return PyLong_FromLong(self->g.n); }

static PyMethodDef ShmGroup_methods[] = {
    {"barrier", (PyCFunction)ShmGroup_barrier, METH_NOARGS, "barrier() -> seconds waited: wait until every worker arrives"},
    {"allreduce", (PyCFunction)(void (*)(void))ShmGroup_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(scale=1.0, start=0, stop=None) -> seconds waited at the entry barrier: every "
     "buffer[start:stop] (or only out[start:stop] when the group has an out array) = scale * the sum "
     "of all buffers[start:stop]; native: summed in buffer order, this worker reduces its slice; "
     "ring/tree: the point-to-point schedules of the group's algorithm"},
    {"abort", (PyCFunction)ShmGroup_abort, METH_VARARGS, "abort(code=1): wake every waiter with an error"},
    {NULL},
};

static PyGetSetDef ShmGroup_getset[] = {
    {"aborted", (getter)ShmGroup_get_aborted, NULL, "0, or the code the group was aborted with", NULL},
    {"rank", (getter)ShmGroup_get_rank, NULL, "this worker's rank", NULL},
    {"size", (getter)ShmGroup_get_size, NULL, "workers in the group", NULL},
    {NULL},
};

static PyTypeObject ShmGroupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dptrain._core.ShmGroup",
    .tp_basicsize = sizeof(ShmGroupObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ShmGroup(control, buffers, rank, *, out=None, spin=2e-4, yield_time=2e-3, timeout=0, "
              "algorithm='native'): "
              "one worker's handle on a group of workers that share memory (threads or processes).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ShmGroup_init,
    .tp_dealloc = (destructor)ShmGroup_dealloc,
    .tp_methods = ShmGroup_methods,
    .tp_getset = ShmGroup_getset,
};

/* ------------------------------------------------------------------ CPU features and FMA peak */
/* Included here, beside its only callers, so that this section stays one block. */
#include "dp_cpu.h"

static PyObject *py_cpu_features(PyObject *self, PyObject *unused)
{
    dp_cpu_features f;
    dp_cpu_detect(&f);
#define FLAG(x) (f.x ? Py_True : Py_False)
    return Py_BuildValue("{s:s,s:s,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:s}",
                         "vendor", f.vendor, "brand", f.brand, "avx", FLAG(avx), "fma", FLAG(fma),
                         "avx2", FLAG(avx2), "avx512f", FLAG(avx512f), "avx512bw", FLAG(avx512bw),
                         "avx512vl", FLAG(avx512vl), "avx512dq", FLAG(avx512dq),
                         "avx512_vnni", FLAG(avx512_vnni), "avx512_bf16", FLAG(avx512_bf16),
                         "widest_fma", dp_isa_name(dp_cpu_widest_isa(&f)));
#undef FLAG
}

/* ValueError: the CPU (or this build) lacks `isa`; names what it needs and what there is. */
static PyObject *isa_unavailable(int isa, const dp_cpu_features *f)
{
    char have[64] = "";
    for (int i = 0; i < DP_ISA_COUNT; i++)
        if (dp_cpu_has_isa(f, i))
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", *have ? ", " : "",
                     dp_isa_name(i));
    const char *needs = isa == DP_ISA_AVX512 ? "avx512f with the OS saving the ZMM state"
                                             : "avx2 and fma with the OS saving the YMM state";
    return PyErr_Format(PyExc_ValueError,
                        "isa '%s' is not available on this CPU (%s, %s): it needs %s "
                        "(available here: %s)", dp_isa_name(isa), *f->vendor ? f->vendor : "unknown vendor",
                        *f->brand ? f->brand : "unknown model", needs, have);
}

static PyObject *py_fma_peak(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"isa", "dtype", "seconds", NULL};
    const char *isa_name = "widest";
    PyArray_Descr *descr = NULL;
    double seconds = 0.2;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|sO&d:fma_peak", kwlist, &isa_name,
                                     PyArray_DescrConverter2, &descr, &seconds))
        return NULL;
    int typenum = descr ? descr->type_num : NPY_FLOAT32;
    if (typenum != NPY_FLOAT32 && typenum != NPY_FLOAT64) {
        PyErr_Format(PyExc_ValueError, "dtype must be float32 or float64, got %R", (PyObject *)descr);
        Py_XDECREF(descr);
        return NULL;
    }
    Py_XDECREF(descr);
    if (!(seconds > 0.0 && seconds <= 60.0)) {   /* false for NaN */
        char b[64];
        return PyErr_Format(PyExc_ValueError, "seconds must be a finite number in (0, 60], got %s",
                            double_repr(b, sizeof b, seconds));
    }
    dp_cpu_features f;
    dp_cpu_detect(&f);
    int isa = -1;
    if (strcmp(isa_name, "widest") == 0) isa = dp_cpu_widest_isa(&f);
    for (int i = 0; isa < 0 && i < DP_ISA_COUNT; i++)
        if (strcmp(isa_name, dp_isa_name(i)) == 0) isa = i;
    if (isa < 0)
        return PyErr_Format(PyExc_ValueError,
                            "isa must be 'widest', 'avx512', 'avx2' or 'generic', got '%s'", isa_name);
    if (!dp_cpu_has_isa(&f, isa)) return isa_unavailable(isa, &f);
    double gflops = 0.0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = typenum == NPY_FLOAT32 ? dp_fma_peak_f32(isa, seconds, &gflops)
                                : dp_fma_peak_f64(isa, seconds, &gflops);
    Py_END_ALLOW_THREADS
    if (rc == DP_ENOTSUP) return isa_unavailable(isa, &f);
    if (rc) return raise_code(rc, "fma_peak");
    return PyFloat_FromDouble(gflops);
}

/* ------------------------------------------------------------------ build info */

static PyObject *py_build_info(PyObject *self, PyObject *unused)
{
    int mr32, nr32, kc32, mc32, nc32, mr64, nr64, kc64, mc64, nc64;
    dp_gemm_blocking(4, &mr32, &nr32, &kc32, &mc32, &nc32);
    dp_gemm_blocking(8, &mr64, &nr64, &kc64, &mc64, &nc64);
#if defined(__clang__)
    const char *compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *compiler = "gcc " __VERSION__;
#else
    const char *compiler = "unknown";
#endif
#if defined(DP_NO_PTHREADS) || defined(_WIN32)
    const char *threads = "none (single-threaded build)";
#else
    const char *threads = "pthreads (own pool)";
#endif
    return Py_BuildValue(
        "{s:s,s:s,s:(ss),s:s,s:O,s:i,s:{s:(iiiii),s:(iiiii)},s:s}",
        "simd", dp_gemm_isa(), "compiler", compiler, "dtypes", "float32", "float64",
        "threads", threads, "openmp", Py_False, "max_threads", DP_MAX_THREADS,
        "gemm_blocking_mr_nr_kc_mc_nc", "float32", mr32, nr32, kc32, mc32, nc32,
        "float64", mr64, nr64, kc64, mc64, nc64, "numpy_build_api", NPY_FEATURE_VERSION_STRING);
}

/* ------------------------------------------------------------------ module */

#define KW (METH_VARARGS | METH_KEYWORDS)
#define FN(f) ((PyCFunction)(void (*)(void))(f))

static PyMethodDef module_methods[] = {
    {"gemm", FN(py_gemm), KW, "gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, ctx=None): c = alpha op(a) op(b) + beta c"},
    {"gemm_naive", FN(py_gemm_naive), KW, "gemm_naive(...): the triple-loop twin of gemm"},
    {"dense_forward", FN(py_dense_forward), KW, "dense_forward(x, w, b, y, *, ctx=None): y = x w^T + b"},
    {"dense_backward", FN(py_dense_backward), KW, "dense_backward(dy, x, w, dw, db, dx=None, *, ctx=None): dw += dy^T x; db += sum(dy); dx = dy w"},
    {"conv2d_forward", FN(py_conv2d_forward), KW, "conv2d_forward(x, w, b, y, *, padding=0, ctx=None): y = conv(x, w) + b; x (B, C, H, W), w (OC, C, KH, KW), stride 1"},
    {"conv2d_forward_naive", FN(py_conv2d_forward_naive), KW, "conv2d_forward_naive(x, w, b, y, *, padding=0): the loop twin of conv2d_forward"},
    {"conv2d_backward", FN(py_conv2d_backward), KW, "conv2d_backward(dy, x, w, dw, db, dx=None, *, padding=0, ctx=None): dw += d/dw, db += d/db; dx = d/dx (written)"},
    {"conv2d_backward_naive", FN(py_conv2d_backward_naive), KW, "conv2d_backward_naive(...): the loop twin of conv2d_backward"},
    {"maxpool2_forward", FN(py_maxpool2_forward), KW, "maxpool2_forward(x, y, idx): 2x2 max-pooling, stride 2; idx (uint8) = the window position 0..3 of each maximum"},
    {"maxpool2_backward", FN(py_maxpool2_backward), KW, "maxpool2_backward(dy, idx, dx): dx = dy at each window's maximum, 0 elsewhere (written)"},
    {"relu_forward", FN(py_relu_forward), KW, "relu_forward(x, y): y = max(x, 0)"},
    {"relu_backward", FN(py_relu_backward), KW, "relu_backward(dy, y, dx): dx = dy * (y > 0)"},
    {"softmax_xent", FN(py_softmax_xent), KW, "softmax_xent(logits, labels, dlogits=None, grad_scale=None) -> loss sum"},
    {"sigmoid_bce", FN(py_sigmoid_bce), KW, "sigmoid_bce(logits, labels, dlogits=None, grad_scale=None) -> loss sum"},
    {"argmax", FN(py_argmax), KW, "argmax(x, out): out = x.argmax(1)"},
    {"count_correct", FN(py_count_correct), KW, "count_correct(logits, labels) -> int"},
    {"sgd_step", FN(py_sgd_step), KW, "sgd_step(params, grads, velocity, *, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, first_step=False)"},
    {"sum_buffers", FN(py_sum_buffers), KW, "sum_buffers(out, inputs, *, scale=1.0, start=0, stop=None)"},
    {"scale_", FN(py_scale), KW, "scale_(buf, alpha, *, start=0, stop=None): buf[start:stop] *= alpha"},
    {"cpu_features", py_cpu_features, METH_NOARGS, "cpu_features() -> dict: vendor, brand, the x86 vector flags the CPU has and the OS enables (avx, fma, avx2, avx512f/bw/vl/dq, avx512_vnni, avx512_bf16), widest_fma"},
    {"fma_peak", FN(py_fma_peak), KW, "fma_peak(isa='widest', dtype='float32', seconds=0.2) -> GFLOP/s of one thread's FMA loop ('widest', 'avx512', 'avx2', 'generic'); ValueError where the CPU lacks the isa"},
    {"gather_rows", FN(py_gather_rows), KW, "gather_rows(x, index, out): out[i] = x[index[i]] (rows, any dtype; GIL released)"},
    {"zero_", py_zero, METH_O, "zero_(buf): buf[:] = 0 with the GIL released"},
    {"param_count", py_param_count, METH_O, "param_count(sizes) -> length of the flat parameter layout"},
    {"build_info", py_build_info, METH_NOARGS, "build_info() -> dict describing this build"},
    {"group_control_bytes", py_group_control_bytes, METH_O, "group_control_bytes(n) -> bytes of a ShmGroup control block for n workers that also tracks who arrived (a timeout then names the workers that did not)"},
    {"init_group_control", py_init_control, METH_VARARGS, "init_group_control(control, n): set up a ShmGroup's barrier memory for n workers"},
    {"abort_group_control", py_abort_control, METH_VARARGS, "abort_group_control(control, code=1): abort the group that waits on this control block (e.g. from the launcher when a worker died)"},
    {NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "dptrain._core",
    "The C core of dptrain: GEMM, layer, convolution, loss, optimizer and buffer kernels (see docs/core_api.md).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    if (PyType_Ready(&ContextType) < 0 || PyType_Ready(&NetworkType) < 0 ||
        PyType_Ready(&ConvNetType) < 0 || PyType_Ready(&ShmGroupType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    GroupAborted = PyErr_NewExceptionWithDoc(
        "dptrain._core.GroupAborted",
        "A worker of a shared-memory group aborted it; args are (message, code).",
        PyExc_RuntimeError, NULL);
    if (!GroupAborted || PyModule_AddObject(m, "GroupAborted", GroupAborted) < 0) goto fail;
    Py_INCREF(GroupAborted);   /* one reference for the module, one for this file */
    Py_INCREF(&ContextType);
    if (PyModule_AddObject(m, "Context", (PyObject *)&ContextType) < 0) { Py_DECREF(&ContextType); goto fail; }
    Py_INCREF(&NetworkType);
    if (PyModule_AddObject(m, "Network", (PyObject *)&NetworkType) < 0) { Py_DECREF(&NetworkType); goto fail; }
    Py_INCREF(&ConvNetType);
    if (PyModule_AddObject(m, "ConvNet", (PyObject *)&ConvNetType) < 0) { Py_DECREF(&ConvNetType); goto fail; }
    Py_INCREF(&ShmGroupType);
    if (PyModule_AddObject(m, "ShmGroup", (PyObject *)&ShmGroupType) < 0) { Py_DECREF(&ShmGroupType); goto fail; }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
