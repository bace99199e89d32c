/* mod_kernels.c - the module-level functions of dptrain._core that run a kernel: one binding
 * per kernel family (gemm, dense, ReLU, losses, argmax, count_correct, sgd_step, adam_step,
 * sum_buffers, scale_, gather_rows, zero_, conv2d, maxpool2). Each follows the recipe of
 * mod_common.h; the contract and the NumPy twins are in docs/core_api.md.
 * Leaves out on purpose: the objects (mod_context.c, mod_model.c, mod_group.c), and what
 * describes or chooses the build and the CPU (mod_build.c).
 */
#include "mod_common.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "dp_act.h"
#include "dp_adam.h"
#include "dp_buffers.h"
#include "dp_conv.h"
#include "dp_pool.h"
#include "dp_dense.h"
#include "dp_gemm.h"
#include "dp_loss.h"
#include "dp_sgd.h"

/* name(...): common(...) with its last argument, an int, fixed to `arg` (the entry points
 * that share a body: gemm and gemm_naive, the two losses, the bf16 conversions, conv2d's
 * kernels and their naive twins) */
#define FIXED_ARG(name, common, arg)                                                 \
    static PyObject *name(PyObject *module, PyObject *const *args, Py_ssize_t nargs, \
                          PyObject *kwnames)                                         \
    { return common(module, args, nargs, kwnames, arg); }

/* ------------------------------------------------------------------ GEMM */

static PyObject *gemm_common(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames, int naive)
{
    static const char *const kwlist[] = {"a",     "b",    "c",   "trans_a", "trans_b",
                                         "alpha", "beta", "ctx", NULL};
    PyObject *ao, *bo, *co, *ctxo = NULL;
    int ta = 0, tb = 0;
    double alpha = 1.0, beta = 0.0;
    if (parse_args(args, nargs, kwnames, naive ? "OOO|$ppddO:gemm_naive" : "OOO|$ppddO:gemm",
                   kwlist, &ao, &bo, &co, &ta, &tb, &alpha, &beta, &ctxo))
        return NULL;
    PyArrayObject *a, *b, *c;
    ContextObject *cobj;
    if (!(a = check_array(ao, "a", NPY_NOTYPE, 2, 0)) ||
        !(b = check_array(bo, "b", NPY_NOTYPE, 2, 0)) ||
        !(c = check_array(co, "c", NPY_NOTYPE, 2, 1)) || check_same_dtype(b, "b", a, "a") ||
        check_same_dtype(c, "c", a, "a") || get_ctx(module, ctxo, a, "a", &cobj) ||
        check_finite(alpha, "alpha") || check_finite(beta, "beta"))
        return NULL;
    npy_intp M = PyArray_DIM(a, ta ? 1 : 0), K = PyArray_DIM(a, ta ? 0 : 1);
    npy_intp N = PyArray_DIM(b, tb ? 0 : 1), Kb = PyArray_DIM(b, tb ? 1 : 0);
    if (Kb != K) {
        npy_intp want[2] = {tb ? PyArray_DIM(b, 0) : K, tb ? K : PyArray_DIM(b, 1)};
        return check_shape(b, tb ? "b (transposed)" : "b", 2, want), NULL;
    }
    npy_intp cdims[2] = {M, N};
    if (check_shape(c, "c", 2, cdims) || check_no_overlap(c, "c", a, "a") ||
        check_no_overlap(c, "c", b, "b"))
        return NULL;
    /* op(a)(i, k) = a[i, k] or a[k, i]: strides in elements */
    ptrdiff_t lda = PyArray_DIM(a, 1), ldb = PyArray_DIM(b, 1);
    ptrdiff_t rsa = ta ? 1 : lda, csa = ta ? lda : 1, rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    int rc = 0;
    void *C = PyArray_DATA(c);
    const void *A = PyArray_DATA(a), *B = PyArray_DATA(b);
    if (IS_F32(a)) {
        if (naive)
            WITHOUT_GIL(dp_gemm_naive_f32(C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K,
                                          (float)alpha, (float)beta));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                               rc = dp_gemm_f32(cobj ? &cobj->ctx : NULL, C, N, A, rsa, csa, B, rsb,
                                                csb, (int)M, (int)N, (int)K, (float)alpha,
                                                (float)beta));
    } else {
        if (naive)
            WITHOUT_GIL(dp_gemm_naive_f64(C, N, A, rsa, csa, B, rsb, csb, (int)M, (int)N, (int)K,
                                          alpha, beta));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                               rc = dp_gemm_f64(cobj ? &cobj->ctx : NULL, C, N, A, rsa, csa, B, rsb,
                                                csb, (int)M, (int)N, (int)K, alpha, beta));
    }
    if (rc) return raise_code(rc, "gemm");
    Py_RETURN_NONE;
}

FIXED_ARG(py_gemm, gemm_common, 0)
FIXED_ARG(py_gemm_naive, gemm_common, 1)

/* ------------------------------------------------------------------ dense layer */

static PyObject *py_dense_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "w", "b", "y", "ctx", NULL};
    PyObject *xo, *wo, *bo, *yo, *ctxo = NULL;
    if (parse_args(args, nargs, kwnames, "OOOO|$O:dense_forward", kwlist, &xo, &wo, &bo, &yo,
                   &ctxo))
        return NULL;
    PyArrayObject *x, *w, *b, *y;
    ContextObject *cobj;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 2, 0)) ||
        !(b = check_array(bo, "b", NPY_NOTYPE, 1, 0)) ||
        !(y = check_array(yo, "y", NPY_NOTYPE, 2, 1)) || check_same_dtype(w, "w", x, "x") ||
        check_same_dtype(b, "b", x, "x") || check_same_dtype(y, "y", x, "x") ||
        get_ctx(module, ctxo, x, "x", &cobj))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), IN = PyArray_DIM(x, 1), OUT = PyArray_DIM(w, 0);
    npy_intp wd[2] = {OUT, IN}, bd[1] = {OUT}, yd[2] = {B, OUT};
    if (check_shape(w, "w", 2, wd) || check_shape(b, "b", 1, bd) || check_shape(y, "y", 2, yd) ||
        check_no_overlap(y, "y", x, "x") || check_no_overlap(y, "y", w, "w") ||
        check_no_overlap(y, "y", b, "b"))
        return NULL;
    int rc;
    dp_ctx *c = cobj ? &cobj->ctx : NULL;
    if (IS_F32(x))
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_forward_f32(
                                               c, PyArray_DATA(y), PyArray_DATA(x), PyArray_DATA(w),
                                               PyArray_DATA(b), (int)B, (int)IN, (int)OUT));
    else
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_dense_forward_f64(
                                               c, PyArray_DATA(y), PyArray_DATA(x), PyArray_DATA(w),
                                               PyArray_DATA(b), (int)B, (int)IN, (int)OUT));
    if (rc) return raise_code(rc, "dense_forward");
    Py_RETURN_NONE;
}

static PyObject *py_dense_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    static const char *const kwlist[] = {"dy", "x", "w", "dw", "db", "dx", "ctx", NULL};
    PyObject *dyo, *xo, *wo, *dwo, *dbo, *dxo = Py_None, *ctxo = NULL;
    if (parse_args(args, nargs, kwnames, "OOOOO|O$O:dense_backward", kwlist, &dyo, &xo, &wo, &dwo,
                   &dbo, &dxo, &ctxo))
        return NULL;
    PyArrayObject *dy, *x, *w, *dw, *db, *dx = NULL;
    ContextObject *cobj;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 2, 0)) ||
        !(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 2, 0)) ||
        !(dw = check_array(dwo, "dw", NPY_NOTYPE, 2, 1)) ||
        !(db = check_array(dbo, "db", NPY_NOTYPE, 1, 1)) ||
        (dxo != Py_None && !(dx = check_array(dxo, "dx", NPY_NOTYPE, 2, 1))) ||
        check_same_dtype(x, "x", dy, "dy") || check_same_dtype(w, "w", dy, "dy") ||
        check_same_dtype(dw, "dw", dy, "dy") || check_same_dtype(db, "db", dy, "dy") ||
        (dx && check_same_dtype(dx, "dx", dy, "dy")) || get_ctx(module, ctxo, dy, "dy", &cobj))
        return NULL;
    npy_intp B = PyArray_DIM(dy, 0), OUT = PyArray_DIM(dy, 1), IN = PyArray_DIM(w, 1);
    npy_intp xd[2] = {B, IN}, wd[2] = {OUT, IN}, bd[1] = {OUT};
    if (check_shape(x, "x", 2, xd) || check_shape(w, "w", 2, wd) || check_shape(dw, "dw", 2, wd) ||
        check_shape(db, "db", 1, bd) || (dx && check_shape(dx, "dx", 2, xd)))
        return NULL;
    PyArrayObject *ins[3] = {dy, x, w};
    const char *in_names[3] = {"dy", "x", "w"};
    for (int i = 0; i < 3; i++)
        if (check_no_overlap(dw, "dw", ins[i], in_names[i]) ||
            check_no_overlap(db, "db", ins[i], in_names[i]) ||
            (dx && check_no_overlap(dx, "dx", ins[i], in_names[i])))
            return NULL;
    if ((dx && (check_no_overlap(dx, "dx", dw, "dw") || check_no_overlap(dx, "dx", db, "db"))) ||
        check_no_overlap(db, "db", dw, "dw"))
        return NULL;
    int rc;
    dp_ctx *c = cobj ? &cobj->ctx : NULL;
    void *dxp = dx ? PyArray_DATA(dx) : NULL;
    if (IS_F32(dy))
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                           rc = dp_dense_backward_f32(c, PyArray_DATA(dw), PyArray_DATA(db), dxp,
                                                      PyArray_DATA(dy), PyArray_DATA(x),
                                                      PyArray_DATA(w), (int)B, (int)IN, (int)OUT));
    else
        WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                           rc = dp_dense_backward_f64(c, PyArray_DATA(dw), PyArray_DATA(db), dxp,
                                                      PyArray_DATA(dy), PyArray_DATA(x),
                                                      PyArray_DATA(w), (int)B, (int)IN, (int)OUT));
    if (rc) return raise_code(rc, "dense_backward");
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ activations */

/* Element-wise kernels: every array has the shape of the first; the output may be the very
 * same array as an input (in place) but must not partially overlap one. */
static int check_elementwise(PyArrayObject *out, const char *oname, PyArrayObject *in,
                             const char *iname)
{
    if (check_same_dtype(out, oname, in, iname) ||
        check_shape(out, oname, PyArray_NDIM(in), PyArray_DIMS(in)))
        return -1;
    if (PyArray_DATA(out) == PyArray_DATA(in)) return 0;
    return check_no_overlap(out, oname, in, iname);
}

static PyObject *py_relu_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "y", NULL};
    PyObject *xo, *yo;
    if (parse_args(args, nargs, kwnames, "OO:relu_forward", kwlist, &xo, &yo)) return NULL;
    PyArrayObject *x, *y;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, -1, 0)) ||
        !(y = check_array(yo, "y", NPY_NOTYPE, -1, 1)) || check_elementwise(y, "y", x, "x"))
        return NULL;
    ptrdiff_t n = PyArray_SIZE(x);
    if (IS_F32(x))
        WITHOUT_GIL(dp_relu_forward_f32(PyArray_DATA(y), PyArray_DATA(x), n));
    else
        WITHOUT_GIL(dp_relu_forward_f64(PyArray_DATA(y), PyArray_DATA(x), n));
    Py_RETURN_NONE;
}

static PyObject *py_relu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const kwlist[] = {"dy", "y", "dx", NULL};
    PyObject *dyo, *yo, *dxo;
    if (parse_args(args, nargs, kwnames, "OOO:relu_backward", kwlist, &dyo, &yo, &dxo)) return NULL;
    PyArrayObject *dy, *y, *dx;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, -1, 0)) ||
        !(y = check_array(yo, "y", NPY_NOTYPE, -1, 0)) ||
        !(dx = check_array(dxo, "dx", NPY_NOTYPE, -1, 1)) || check_elementwise(y, "y", dy, "dy") ||
        check_elementwise(dx, "dx", dy, "dy") || check_no_overlap(dx, "dx", y, "y"))
        return NULL;
    ptrdiff_t n = PyArray_SIZE(dy);
    if (IS_F32(dy))
        WITHOUT_GIL(dp_relu_backward_f32(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(y), n));
    else
        WITHOUT_GIL(dp_relu_backward_f64(PyArray_DATA(dx), PyArray_DATA(dy), PyArray_DATA(y), n));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ losses */

static PyObject *loss_common(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames, int binary)
{
    static const char *const kwlist[] = {"logits", "labels", "dlogits", "grad_scale", NULL};
    PyObject *zo, *lo, *dzo = Py_None, *gso = Py_None;
    if (parse_args(args, nargs, kwnames, binary ? "OO|OO:sigmoid_bce" : "OO|OO:softmax_xent",
                   kwlist, &zo, &lo, &dzo, &gso))
        return NULL;
    PyArrayObject *z, *l, *dz = NULL;
    if (!(z = check_array(zo, "logits", NPY_NOTYPE, -1, 0)) ||
        !(l = check_array(lo, "labels", NPY_INT64, 1, 0)))
        return NULL;
    int nd = PyArray_NDIM(z);
    if (binary ? !(nd == 1 || (nd == 2 && PyArray_DIM(z, 1) == 1)) : nd != 2) {
        char s[128];
        shape_str(s, sizeof s, nd, PyArray_DIMS(z));
        PyErr_Format(PyExc_ValueError, "logits has shape %s, expected %s", s,
                     binary ? "(B,) or (B, 1)" : "(B, C)");
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
        if (IS_F32(z))
            WITHOUT_GIL(rc = dp_sigmoid_bce_f32(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l),
                                                (int)B, (float)gs));
        else
            WITHOUT_GIL(
                rc = dp_sigmoid_bce_f64(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l), (int)B, gs));
    } else {
        if (IS_F32(z))
            WITHOUT_GIL(rc = dp_softmax_xent_f32(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l),
                                                 (int)B, (int)C, (float)gs));
        else
            WITHOUT_GIL(rc = dp_softmax_xent_f64(dzp, &loss, PyArray_DATA(z), PyArray_DATA(l),
                                                 (int)B, (int)C, gs));
    }
    if (rc == DP_ELABEL) return label_error(l, binary ? 2 : C), NULL;
    if (rc) return raise_code(rc, binary ? "sigmoid_bce" : "softmax_xent");
    return PyFloat_FromDouble(loss);
}

FIXED_ARG(py_softmax_xent, loss_common, 0)
FIXED_ARG(py_sigmoid_bce, loss_common, 1)

static PyObject *py_argmax(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "out", NULL};
    PyObject *xo, *oo;
    if (parse_args(args, nargs, kwnames, "OO:argmax", kwlist, &xo, &oo)) return NULL;
    PyArrayObject *x, *o;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) ||
        !(o = check_array(oo, "out", NPY_INT64, 1, 1)))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), C = PyArray_DIM(x, 1), od[1] = {B};
    if (C < 1)
        return PyErr_Format(PyExc_ValueError, "x has shape (%ld, 0): no column to pick", (long)B),
               NULL;
    if (check_shape(o, "out", 1, od) || check_no_overlap(o, "out", x, "x")) return NULL;
    if (IS_F32(x))
        WITHOUT_GIL(dp_argmax_f32(PyArray_DATA(o), PyArray_DATA(x), (int)B, (int)C));
    else
        WITHOUT_GIL(dp_argmax_f64(PyArray_DATA(o), PyArray_DATA(x), (int)B, (int)C));
    Py_RETURN_NONE;
}

static PyObject *py_count_correct(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static const char *const kwlist[] = {"logits", "labels", NULL};
    PyObject *zo, *lo;
    if (parse_args(args, nargs, kwnames, "OO:count_correct", kwlist, &zo, &lo)) return NULL;
    PyArrayObject *z, *l;
    if (!(z = check_array(zo, "logits", NPY_NOTYPE, -1, 0)) ||
        !(l = check_array(lo, "labels", NPY_INT64, 1, 0)))
        return NULL;
    if (PyArray_NDIM(z) != 1 && PyArray_NDIM(z) != 2) {
        char s[128];
        shape_str(s, sizeof s, PyArray_NDIM(z), PyArray_DIMS(z));
        return PyErr_Format(PyExc_ValueError, "logits has shape %s, expected (B,) or (B, C)", s),
               NULL;
    }
    npy_intp B = PyArray_DIM(z, 0), C = PyArray_NDIM(z) == 2 ? PyArray_DIM(z, 1) : 1, ld[1] = {B};
    if (C < 1) return PyErr_Format(PyExc_ValueError, "logits has 0 classes"), NULL;
    if (check_shape(l, "labels", 1, ld)) return NULL;
    int64_t n;
    int rc;
    if (IS_F32(z))
        WITHOUT_GIL(rc =
                        dp_count_correct_f32(&n, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C));
    else
        WITHOUT_GIL(rc =
                        dp_count_correct_f64(&n, PyArray_DATA(z), PyArray_DATA(l), (int)B, (int)C));
    if (rc == DP_ELABEL) return label_error(l, C == 1 ? 2 : C), NULL;
    return PyLong_FromLongLong(n);
}

/* ------------------------------------------------------------------ optimizer, buffers */

static PyObject *py_sgd_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    static const char *const kwlist[] = {
        "params",       "grads",    "velocity",   "lr",  "momentum", "dampening",
        "weight_decay", "nesterov", "first_step", "ctx", NULL};
    PyObject *po, *go, *vo, *ctxo = NULL;
    double lr, mom = 0, damp = 0, wd = 0;
    int nesterov = 0, first = 0;
    dp_threads *team;
    PyThread_type_lock lock;
    if (parse_args(args, nargs, kwnames, "OOO$d|dddppO:sgd_step", kwlist, &po, &go, &vo, &lr, &mom,
                   &damp, &wd, &nesterov, &first, &ctxo) ||
        get_team(module, ctxo, &team, &lock))
        return NULL;
    PyArrayObject *p, *g, *v = NULL;
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 1)) ||
        !(g = check_array(go, "grads", NPY_NOTYPE, 1, 0)) ||
        check_elementwise(g, "grads", p, "params") || check_finite(lr, "lr") ||
        check_finite(mom, "momentum") || check_finite(damp, "dampening") ||
        check_finite(wd, "weight_decay"))
        return NULL;
    char b1[64], b2[64];
    if (lr < 0)
        return PyErr_Format(PyExc_ValueError, "lr must be >= 0, got %s",
                            double_repr(b1, sizeof b1, lr)),
               NULL;
    if (mom < 0)
        return PyErr_Format(PyExc_ValueError, "momentum must be >= 0, got %s",
                            double_repr(b1, sizeof b1, mom)),
               NULL;
    if (wd < 0)
        return PyErr_Format(PyExc_ValueError, "weight_decay must be >= 0, got %s",
                            double_repr(b1, sizeof b1, wd)),
               NULL;
    if (nesterov && (mom <= 0 || damp != 0))
        return PyErr_Format(
                   PyExc_ValueError,
                   "nesterov needs momentum > 0 and dampening == 0 (momentum=%s, dampening=%s)",
                   double_repr(b1, sizeof b1, mom), double_repr(b2, sizeof b2, damp)),
               NULL;
    if (PyArray_DATA(p) == PyArray_DATA(g))
        return PyErr_Format(PyExc_ValueError, "grads shares memory with params"), NULL;
    if (mom != 0) {
        if (vo == Py_None)
            return PyErr_Format(PyExc_ValueError, "velocity is None, but momentum=%s needs it",
                                double_repr(b1, sizeof b1, mom)),
                   NULL;
        if (!(v = check_array(vo, "velocity", NPY_NOTYPE, 1, 1)) ||
            check_elementwise(v, "velocity", p, "params") ||
            check_no_overlap(v, "velocity", p, "params") ||
            check_no_overlap(v, "velocity", g, "grads"))
            return NULL;
    }
    if (check_no_overlap(p, "params", g, "grads")) return NULL;
    ptrdiff_t n = PyArray_SIZE(p);
    void *vp = v ? PyArray_DATA(v) : NULL;
    if (IS_F32(p))
        WITHOUT_GIL_LOCKED(lock, dp_sgd_step_team_f32(team, PyArray_DATA(p), vp, PyArray_DATA(g), n,
                                                      (float)lr, (float)mom, (float)damp, (float)wd,
                                                      nesterov, first));
    else
        WITHOUT_GIL_LOCKED(lock, dp_sgd_step_team_f64(team, PyArray_DATA(p), vp, PyArray_DATA(g), n,
                                                      lr, mom, damp, wd, nesterov, first));
    Py_RETURN_NONE;
}

/* An Adam buffer: a writeable 1-D array of params' dtype and shape that shares no memory with
 * params, grads or the buffers checked before it (others[0 .. nothers)). */
static PyArrayObject *adam_buffer(PyObject *obj, const char *name, PyArrayObject *p,
                                  PyArrayObject *const *others, const char *const *other_names,
                                  int nothers)
{
    PyArrayObject *a = check_array(obj, name, NPY_NOTYPE, 1, 1);
    if (!a || check_same_dtype(a, name, p, "params") || check_shape(a, name, 1, PyArray_DIMS(p)) ||
        check_no_overlap(a, name, p, "params"))
        return NULL;
    for (int i = 0; i < nothers; i++)
        if (check_no_overlap(a, name, others[i], other_names[i])) return NULL;
    return a;
}

static PyObject *py_adam_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    static const char *const kwlist[] = {
        "params", "grads", "exp_avg",      "exp_avg_sq", "max_exp_avg_sq", "step", "lr", "beta1",
        "beta2",  "eps",   "weight_decay", "amsgrad",    "decoupled",      "ctx",  NULL};
    PyObject *po, *go, *mo, *vo, *vmo, *ctxo = NULL;
    int step, amsgrad = 0, decoupled = 0;
    double lr, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0;
    dp_threads *team;
    PyThread_type_lock lock;
    if (parse_args(args, nargs, kwnames, "OOOOO$id|ddddppO:adam_step", kwlist, &po, &go, &mo, &vo,
                   &vmo, &step, &lr, &beta1, &beta2, &eps, &wd, &amsgrad, &decoupled, &ctxo) ||
        get_team(module, ctxo, &team, &lock))
        return NULL;
    char b[64];
    if (step < 1)
        return PyErr_Format(PyExc_ValueError, "step must be >= 1 (the first step is 1), got %d",
                            step),
               NULL;
    const char *const scalar[] = {"lr", "eps", "weight_decay"};
    const double value[] = {lr, eps, wd};
    for (int i = 0; i < 3; i++) {
        if (check_finite(value[i], scalar[i])) return NULL;
        if (value[i] < 0)
            return PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %s", scalar[i],
                                double_repr(b, sizeof b, value[i])),
                   NULL;
    }
    const char *const beta_name[] = {"beta1", "beta2"};
    const double beta[] = {beta1, beta2};
    for (int i = 0; i < 2; i++)
        if (!(beta[i] >= 0 && beta[i] < 1)) /* also NaN */
            return PyErr_Format(PyExc_ValueError, "%s must be in [0, 1), got %s", beta_name[i],
                                double_repr(b, sizeof b, beta[i])),
                   NULL;
    PyArrayObject *p, *g, *m, *v, *vmax = NULL;
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 1)) ||
        !(g = check_array(go, "grads", NPY_NOTYPE, 1, 0)) ||
        check_elementwise(g, "grads", p, "params") || check_no_overlap(p, "params", g, "grads"))
        return NULL;
    PyArrayObject *seen[3] = {g};
    const char *const seen_names[] = {"grads", "exp_avg", "exp_avg_sq"};
    if (!(m = adam_buffer(mo, "exp_avg", p, seen, seen_names, 1))) return NULL;
    seen[1] = m;
    if (!(v = adam_buffer(vo, "exp_avg_sq", p, seen, seen_names, 2))) return NULL;
    seen[2] = v;
    if (amsgrad) {
        if (vmo == Py_None)
            return PyErr_Format(PyExc_ValueError,
                                "max_exp_avg_sq is None, but amsgrad=True needs it"),
                   NULL;
        if (!(vmax = adam_buffer(vmo, "max_exp_avg_sq", p, seen, seen_names, 3))) return NULL;
    }
    ptrdiff_t n = PyArray_SIZE(p);
    void *vm = vmax ? PyArray_DATA(vmax) : NULL;
    if (IS_F32(p)) {
        dp_adam_hyper_f32 h;
        dp_adam_prepare_f32(&h, lr, beta1, beta2, eps, wd, decoupled, step);
        WITHOUT_GIL_LOCKED(lock,
                           dp_adam_step_team_f32(team, PyArray_DATA(p), PyArray_DATA(m),
                                                 PyArray_DATA(v), vm, PyArray_DATA(g), n, &h));
    } else {
        dp_adam_hyper_f64 h;
        dp_adam_prepare_f64(&h, lr, beta1, beta2, eps, wd, decoupled, step);
        WITHOUT_GIL_LOCKED(lock,
                           dp_adam_step_team_f64(team, PyArray_DATA(p), PyArray_DATA(m),
                                                 PyArray_DATA(v), vm, PyArray_DATA(g), n, &h));
    }
    Py_RETURN_NONE;
}

static PyObject *py_rmsprop_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const kwlist[] = {
        "params",   "grads", "square_avg", "grad_avg",     "momentum_buffer",
        "lr",       "alpha", "eps",        "weight_decay", "momentum",
        "centered", "ctx",   NULL};
    PyObject *po, *go, *so, *gao, *bo, *ctxo = NULL;
    int centered = 0;
    double lr, alpha = 0.99, eps = 1e-8, wd = 0, mom = 0;
    dp_threads *team;
    PyThread_type_lock lock;
    if (parse_args(args, nargs, kwnames, "OOOOO$d|ddddpO:rmsprop_step", kwlist, &po, &go, &so, &gao,
                   &bo, &lr, &alpha, &eps, &wd, &mom, &centered, &ctxo) ||
        get_team(module, ctxo, &team, &lock))
        return NULL;
    char b[64];
    const char *const scalar[] = {"lr", "eps", "weight_decay", "momentum"};
    const double value[] = {lr, eps, wd, mom};
    for (int i = 0; i < 4; i++) {
        if (check_finite(value[i], scalar[i])) return NULL;
        if (value[i] < 0)
            return PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %s", scalar[i],
                                double_repr(b, sizeof b, value[i])),
                   NULL;
    }
    if (check_finite(alpha, "alpha")) return NULL;
    if (!(alpha >= 0 && alpha <= 1))
        return PyErr_Format(PyExc_ValueError, "alpha must be in [0, 1], got %s",
                            double_repr(b, sizeof b, alpha)),
               NULL;
    PyArrayObject *p, *g, *sq, *gavg = NULL, *buf = NULL;
    if (!(p = check_array(po, "params", NPY_NOTYPE, 1, 1)) ||
        !(g = check_array(go, "grads", NPY_NOTYPE, 1, 0)) ||
        check_elementwise(g, "grads", p, "params") || check_no_overlap(p, "params", g, "grads"))
        return NULL;
    PyArrayObject *seen[3] = {g};
    const char *const seen_names[] = {"grads", "square_avg", "grad_avg"};
    if (!(sq = adam_buffer(so, "square_avg", p, seen, seen_names, 1))) return NULL;
    seen[1] = sq;
    if (centered) {
        if (gao == Py_None)
            return PyErr_Format(PyExc_ValueError, "grad_avg is None, but centered=True needs it"),
                   NULL;
        if (!(gavg = adam_buffer(gao, "grad_avg", p, seen, seen_names, 2))) return NULL;
        seen[2] = gavg;
    }
    if (mom > 0) {
        if (bo == Py_None)
            return PyErr_Format(PyExc_ValueError,
                                "momentum_buffer is None, but momentum > 0 needs it"),
                   NULL;
        if (!(buf = adam_buffer(bo, "momentum_buffer", p, seen, seen_names, centered ? 3 : 2)))
            return NULL;
    }
    ptrdiff_t n = PyArray_SIZE(p);
    void *ga = gavg ? PyArray_DATA(gavg) : NULL, *bu = buf ? PyArray_DATA(buf) : NULL;
    if (IS_F32(p)) {
        dp_rmsprop_hyper_f32 h = {(float)lr,  (float)alpha, (float)(1.0 - alpha),
                                  (float)eps, (float)wd,    (float)mom};
        WITHOUT_GIL_LOCKED(lock, dp_rmsprop_step_team_f32(team, PyArray_DATA(p), PyArray_DATA(sq),
                                                          ga, bu, PyArray_DATA(g), n, &h));
    } else {
        dp_rmsprop_hyper_f64 h = {lr, alpha, 1.0 - alpha, eps, wd, mom};
        WITHOUT_GIL_LOCKED(lock, dp_rmsprop_step_team_f64(team, PyArray_DATA(p), PyArray_DATA(sq),
                                                          ga, bu, PyArray_DATA(g), n, &h));
    }
    Py_RETURN_NONE;
}

#define MAX_SUM_INPUTS 1024

static PyObject *py_sum_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const kwlist[] = {"out", "inputs", "scale", "start", "stop", NULL};
    PyObject *oo, *ino, *starto = NULL, *stopo = NULL, *seq = NULL, *result = NULL;
    double scale = 1.0;
    if (parse_args(args, nargs, kwnames, "OO|$dOO:sum_buffers", kwlist, &oo, &ino, &scale, &starto,
                   &stopo))
        return NULL;
    PyArrayObject *out;
    /* uint16 arrays hold bfloat16 values: summed in float32, rounded to bfloat16 */
    int bf16 = PyArray_Check(oo) && PyArray_TYPE((PyArrayObject *)oo) == NPY_UINT16;
    if (!(out = check_array(oo, "out", bf16 ? NPY_UINT16 : NPY_NOTYPE, 1, 1)) ||
        check_finite(scale, "scale"))
        return NULL;
    if (!(seq = PySequence_Fast(ino, "inputs must be a sequence of arrays"))) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    const void *ptrs[MAX_SUM_INPUTS];
    ptrdiff_t start, stop;
    if (k == 0) {
        PyErr_SetString(PyExc_ValueError, "inputs is empty: sum_buffers needs at least one array");
        goto fail;
    }
    if (k > MAX_SUM_INPUTS) {
        PyErr_Format(PyExc_ValueError, "inputs has %zd arrays, at most %d are supported", k,
                     MAX_SUM_INPUTS);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        char name[48];
        snprintf(name, sizeof name, "inputs[%zd]", i);
        PyArrayObject *a = check_array(PySequence_Fast_GET_ITEM(seq, i), name,
                                       bf16 ? NPY_UINT16 : NPY_NOTYPE, 1, 0);
        if (!a || check_elementwise(a, name, out, "out")) goto fail;
        ptrs[i] = PyArray_DATA(a);
    }
    if (get_range(starto, stopo, PyArray_SIZE(out), &start, &stop)) goto fail;
    if (bf16)
        WITHOUT_GIL(dp_sum_bf16(PyArray_DATA(out), (const uint16_t *const *)ptrs, (int)k, start,
                                stop, (float)scale));
    else if (IS_F32(out))
        WITHOUT_GIL(dp_sum_buffers_f32(PyArray_DATA(out), (const float *const *)ptrs, (int)k, start,
                                       stop, (float)scale));
    else
        WITHOUT_GIL(dp_sum_buffers_f64(PyArray_DATA(out), (const double *const *)ptrs, (int)k,
                                       start, stop, scale));
    result = Py_None;
    Py_INCREF(result);
fail:
    Py_XDECREF(seq);
    return result;
}

/* to_bf16 (to = 1: float32 x -> uint16 out) and from_bf16 (to = 0: the reverse) */
static PyObject *bf16_convert(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames, int to)
{
    static const char *const kwlist[] = {"x", "out", NULL};
    PyObject *xo, *oo;
    if (parse_args(args, nargs, kwnames, to ? "OO:to_bf16" : "OO:from_bf16", kwlist, &xo, &oo))
        return NULL;
    PyArrayObject *x, *out;
    if (!(x = check_array(xo, "x", to ? NPY_FLOAT32 : NPY_UINT16, -1, 0)) ||
        !(out = check_array(oo, "out", to ? NPY_UINT16 : NPY_FLOAT32, -1, 1)) ||
        check_shape(out, "out", PyArray_NDIM(x), PyArray_DIMS(x)) ||
        check_no_overlap(out, "out", x, "x"))
        return NULL;
    if (to)
        WITHOUT_GIL(dp_to_bf16(PyArray_DATA(out), PyArray_DATA(x), PyArray_SIZE(x)));
    else
        WITHOUT_GIL(dp_from_bf16(PyArray_DATA(out), PyArray_DATA(x), PyArray_SIZE(x)));
    Py_RETURN_NONE;
}

FIXED_ARG(py_to_bf16, bf16_convert, 1)
FIXED_ARG(py_from_bf16, bf16_convert, 0)

static PyObject *py_scale(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    static const char *const kwlist[] = {"buf", "alpha", "start", "stop", NULL};
    PyObject *bo, *starto = NULL, *stopo = NULL;
    double alpha;
    if (parse_args(args, nargs, kwnames, "Od|$OO:scale_", kwlist, &bo, &alpha, &starto, &stopo))
        return NULL;
    PyArrayObject *b;
    ptrdiff_t start, stop;
    if (!(b = check_array(bo, "buf", NPY_NOTYPE, 1, 1)) || check_finite(alpha, "alpha") ||
        get_range(starto, stopo, PyArray_SIZE(b), &start, &stop))
        return NULL;
    if (IS_F32(b))
        WITHOUT_GIL(dp_scale_f32((float *)PyArray_DATA(b) + start, stop - start, (float)alpha));
    else
        WITHOUT_GIL(dp_scale_f64((double *)PyArray_DATA(b) + start, stop - start, alpha));
    Py_RETURN_NONE;
}

static PyObject *py_augment_images(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    static const char *const kwlist[] = {"x",    "out",   "ids",  "shape", "pad",
                                         "seed", "epoch", "flip", NULL};
    PyObject *xo, *oo, *io, *so, *seedo, *epocho;
    int pad, flip = 0;
    if (parse_args(args, nargs, kwnames, "OOO$OiOO|p:augment_images", kwlist, &xo, &oo, &io, &so,
                   &pad, &seedo, &epocho, &flip))
        return NULL;
    if (!PyLong_Check(seedo) || !PyLong_Check(epocho))
        return PyErr_Format(PyExc_TypeError, "seed and epoch must be ints"), NULL;
    /* the seed's low 64 bits (any int, as numpy's seeds), the epoch's as a signed count */
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(seedo);
    long long epoch = PyLong_AsLongLong(epocho);
    if ((seed == (unsigned long long)-1 || epoch == -1) && PyErr_Occurred()) return NULL;
    PyArrayObject *x, *out, *ids;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 2, 0)) ||
        !(out = check_array(oo, "out", PyArray_TYPE(x), 2, 1)) ||
        !(ids = check_array(io, "ids", NPY_INT64, 1, 0)))
        return NULL;
    Py_ssize_t C, H, W;
    if (!PyTuple_Check(so) || !PyArg_ParseTuple(so, "nnn", &C, &H, &W) || C < 1 || H < 1 || W < 1)
        return PyErr_Clear(),
               PyErr_Format(PyExc_ValueError, "shape must be a tuple (C, H, W) of positive ints"),
               NULL;
    npy_intp n = PyArray_DIM(x, 0);
    if (PyArray_DIM(x, 1) != C * H * W)
        return PyErr_Format(PyExc_ValueError,
                            "x has %ld values a row, but shape (%zd, %zd, %zd) has %zd",
                            (long)PyArray_DIM(x, 1), C, H, W, C * H * W),
               NULL;
    if (pad < 0 || pad >= H || pad >= W)
        return PyErr_Format(PyExc_ValueError,
                            "pad must be >= 0 and smaller than the image's %zd x %zd, got %d", H, W,
                            pad),
               NULL;
    npy_intp want[2] = {n, C * H * W}, want_ids[1] = {n};
    if (check_shape(out, "out", 2, want) || check_shape(ids, "ids", 1, want_ids) ||
        check_no_overlap(out, "out", x, "x") || check_no_overlap(out, "out", ids, "ids"))
        return NULL;
    int itemsize = (int)PyArray_ITEMSIZE(x);
    WITHOUT_GIL(dp_augment_images(PyArray_DATA(out), PyArray_DATA(x), PyArray_DATA(ids), n, (int)C,
                                  (int)H, (int)W, itemsize, pad, flip, (uint64_t)seed,
                                  (int64_t)epoch));
    Py_RETURN_NONE;
}

static PyObject *py_sum_squares(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", NULL};
    PyObject *xo;
    if (parse_args(args, nargs, kwnames, "O:sum_squares", kwlist, &xo)) return NULL;
    PyArrayObject *x;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 1, 0))) return NULL;
    double s;
    if (IS_F32(x))
        WITHOUT_GIL(s = dp_sum_squares_f32(PyArray_DATA(x), PyArray_SIZE(x)));
    else
        WITHOUT_GIL(s = dp_sum_squares_f64(PyArray_DATA(x), PyArray_SIZE(x)));
    return PyFloat_FromDouble(s);
}

/* ------------------------------------------------------------------ batch assembly */

static PyObject *py_gather_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "index", "out", NULL};
    PyObject *xo, *io, *oo;
    if (parse_args(args, nargs, kwnames, "OOO:gather_rows", kwlist, &xo, &io, &oo)) return NULL;
    PyArrayObject *x, *idx, *out;
    if (!(idx = check_array(io, "index", NPY_INT64, 1, 0))) return NULL;
    if (!PyArray_Check(xo) || !PyArray_Check(oo))
        return PyErr_Format(PyExc_TypeError, "x and out must be numpy.ndarray"), NULL;
    x = (PyArrayObject *)xo;
    out = (PyArrayObject *)oo;
    if (PyArray_NDIM(x) < 1 || !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_IS_C_CONTIGUOUS(out) ||
        !PyArray_ISWRITEABLE(out))
        return PyErr_Format(PyExc_ValueError, "x must be a C-contiguous array and out a writeable "
                                              "C-contiguous array"),
               NULL;
    /* rows are copied as bytes: only plain numbers may pass (an object array's copy would
     * duplicate references without counting them) */
    if (!PyTypeNum_ISNUMBER(PyArray_TYPE(x)) || PyDataType_REFCHK(PyArray_DESCR(x)))
        return PyErr_Format(PyExc_TypeError,
                            "x has dtype %s: gather_rows copies rows of a numeric "
                            "dtype (bool, integer, floating or complex)",
                            dtype_name(x)),
               NULL;
    if (!PyArray_EquivTypes(PyArray_DESCR(x), PyArray_DESCR(out)))
        return PyErr_Format(PyExc_TypeError, "out has dtype %s, expected %s (the dtype of x)",
                            dtype_name(out), dtype_name(x)),
               NULL;
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
                                (long)i, (long long)ix[i], (long)rows),
                   NULL;
    const char *src = PyArray_BYTES(x);
    char *dst = PyArray_BYTES(out);
    WITHOUT_GIL(dp_gather_rows(dst, src, ix, n, row_bytes));
    Py_RETURN_NONE;
}

static PyObject *py_zero(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    static const char *const kwlist[] = {"buf", "ctx", NULL};
    PyObject *bo, *ctxo = NULL;
    dp_threads *team;
    PyThread_type_lock lock;
    if (parse_args(args, nargs, kwnames, "O|$O:zero_", kwlist, &bo, &ctxo) ||
        get_team(module, ctxo, &team, &lock))
        return NULL;
    PyArrayObject *a = check_array(bo, "buf", NPY_NOTYPE, -1, 1);
    if (!a) return NULL;
    void *p = PyArray_DATA(a);
    ptrdiff_t n = PyArray_SIZE(a);
    size_t size = (size_t)PyArray_ITEMSIZE(a);
    WITHOUT_GIL_LOCKED(lock, dp_zero_team(team, p, n, size));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ convolution, pooling */

/* The (C, H, W) -> (OC, OH, OW) geometry of x (B, C, H, W) and w (OC, C, KH, KW), checked. */
static int conv_geometry(PyArrayObject *x, PyArrayObject *w, int padding, dp_conv_geom *g, int *OH,
                         int *OW)
{
    char xs[128], ws[128];
    shape_str(xs, sizeof xs, PyArray_NDIM(x), PyArray_DIMS(x));
    shape_str(ws, sizeof ws, PyArray_NDIM(w), PyArray_DIMS(w));
    if (padding < 0)
        return PyErr_Format(PyExc_ValueError, "padding must be >= 0, got %d", padding), -1;
    if (PyArray_DIM(w, 1) != PyArray_DIM(x, 1))
        return PyErr_Format(PyExc_ValueError,
                            "w has shape %s, but x has shape %s: w.shape[1] must be "
                            "x's channel count %ld",
                            ws, xs, (long)PyArray_DIM(x, 1)),
               -1;
    for (int i = 1; i < 4; i++)
        if (PyArray_DIM(x, i) < 1)
            return PyErr_Format(PyExc_ValueError, "x has shape %s, expected C, H, W >= 1", xs), -1;
    for (int i = 0; i < 4; i++)
        if (PyArray_DIM(w, i) < 1)
            return PyErr_Format(PyExc_ValueError, "w has shape %s, expected every size >= 1", ws),
                   -1;
    memset(g, 0, sizeof *g); /* stride 0: 1 (the standalone kernels' only stride) */
    g->C = (int)PyArray_DIM(x, 1);
    g->H = (int)PyArray_DIM(x, 2);
    g->W = (int)PyArray_DIM(x, 3);
    g->OC = (int)PyArray_DIM(w, 0);
    g->KH = (int)PyArray_DIM(w, 2);
    g->KW = (int)PyArray_DIM(w, 3);
    g->pad = padding;
    if (dp_conv_out(g, OH, OW) == DP_OK) return 0;
    if ((long long)g->H + 2LL * padding < g->KH || (long long)g->W + 2LL * padding < g->KW)
        return PyErr_Format(PyExc_ValueError,
                            "w has shape %s: its %dx%d kernel is larger than the "
                            "%dx%d input of x %s with padding %d",
                            ws, g->KH, g->KW, g->H, g->W, xs, padding),
               -1;
    return PyErr_Format(PyExc_ValueError,
                        "x %s and w %s with padding %d are too large for the "
                        "kernels' int sizes",
                        xs, ws, padding),
           -1;
}

static PyObject *conv_forward_common(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames, int naive)
{
    static const char *const kwlist[] = {"x", "w", "b", "y", "padding", "ctx", NULL};
    PyObject *xo, *wo, *bo, *yo, *ctxo = NULL;
    int padding = 0;
    if (parse_args(args, nargs, kwnames,
                   naive ? "OOOO|$iO:conv2d_forward_naive" : "OOOO|$iO:conv2d_forward", kwlist, &xo,
                   &wo, &bo, &yo, &padding, &ctxo))
        return NULL;
    PyArrayObject *x, *w, *b, *y;
    ContextObject *cobj;
    dp_conv_geom g;
    int OH, OW;
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 4, 0)) ||
        !(b = check_array(bo, "b", NPY_NOTYPE, 1, 0)) ||
        !(y = check_array(yo, "y", NPY_NOTYPE, 4, 1)) || check_same_dtype(w, "w", x, "x") ||
        check_same_dtype(b, "b", x, "x") || check_same_dtype(y, "y", x, "x") ||
        get_ctx(module, ctxo, x, "x", &cobj) || conv_geometry(x, w, padding, &g, &OH, &OW))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), bd[1] = {g.OC}, yd[4] = {B, g.OC, OH, OW};
    if (check_shape(b, "b", 1, bd) || check_shape(y, "y", 4, yd) ||
        check_no_overlap(y, "y", x, "x") || check_no_overlap(y, "y", w, "w") ||
        check_no_overlap(y, "y", b, "b"))
        return NULL;
    int rc = DP_OK;
    void *Y = PyArray_DATA(y);
    const void *X = PyArray_DATA(x), *Wp = PyArray_DATA(w), *Bp = PyArray_DATA(b);
    if (naive) {
        if (IS_F32(x))
            WITHOUT_GIL(dp_conv2d_forward_naive_f32(Y, X, Wp, Bp, (int)B, &g));
        else
            WITHOUT_GIL(dp_conv2d_forward_naive_f64(Y, X, Wp, Bp, (int)B, &g));
    } else {
        dp_ctx *c = cobj ? &cobj->ctx : NULL;
        dp_scratch *col = cobj ? &cobj->col : NULL;
        if (IS_F32(x))
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                               rc = dp_conv2d_forward_f32(c, col, Y, X, Wp, Bp, (int)B, &g));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj),
                               rc = dp_conv2d_forward_f64(c, col, Y, X, Wp, Bp, (int)B, &g));
    }
    if (rc) return raise_code(rc, "conv2d_forward");
    Py_RETURN_NONE;
}

static PyObject *conv_backward_common(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames, int naive)
{
    static const char *const kwlist[] = {"dy", "x", "w", "dw", "db", "dx", "padding", "ctx", NULL};
    PyObject *dyo, *xo, *wo, *dwo, *dbo, *dxo = Py_None, *ctxo = NULL;
    int padding = 0;
    if (parse_args(args, nargs, kwnames,
                   naive ? "OOOOO|O$iO:conv2d_backward_naive" : "OOOOO|O$iO:conv2d_backward",
                   kwlist, &dyo, &xo, &wo, &dwo, &dbo, &dxo, &padding, &ctxo))
        return NULL;
    PyArrayObject *dy, *x, *w, *dw, *db, *dx = NULL;
    ContextObject *cobj;
    dp_conv_geom g;
    int OH, OW;
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 4, 0)) ||
        !(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) ||
        !(w = check_array(wo, "w", NPY_NOTYPE, 4, 0)) ||
        !(dw = check_array(dwo, "dw", NPY_NOTYPE, 4, 1)) ||
        !(db = check_array(dbo, "db", NPY_NOTYPE, 1, 1)) ||
        (dxo != Py_None && !(dx = check_array(dxo, "dx", NPY_NOTYPE, 4, 1))) ||
        check_same_dtype(x, "x", dy, "dy") || check_same_dtype(w, "w", dy, "dy") ||
        check_same_dtype(dw, "dw", dy, "dy") || check_same_dtype(db, "db", dy, "dy") ||
        (dx && check_same_dtype(dx, "dx", dy, "dy")) || get_ctx(module, ctxo, dy, "dy", &cobj) ||
        conv_geometry(x, w, padding, &g, &OH, &OW))
        return NULL;
    npy_intp B = PyArray_DIM(x, 0), yd[4] = {B, g.OC, OH, OW}, bd[1] = {g.OC};
    if (check_shape(dy, "dy", 4, yd) || check_shape(dw, "dw", 4, PyArray_DIMS(w)) ||
        check_shape(db, "db", 1, bd) || (dx && check_shape(dx, "dx", 4, PyArray_DIMS(x))))
        return NULL;
    PyArrayObject *ins[3] = {dy, x, w};
    const char *in_names[3] = {"dy", "x", "w"};
    for (int i = 0; i < 3; i++)
        if (check_no_overlap(dw, "dw", ins[i], in_names[i]) ||
            check_no_overlap(db, "db", ins[i], in_names[i]) ||
            (dx && check_no_overlap(dx, "dx", ins[i], in_names[i])))
            return NULL;
    if ((dx && (check_no_overlap(dx, "dx", dw, "dw") || check_no_overlap(dx, "dx", db, "db"))) ||
        check_no_overlap(db, "db", dw, "dw"))
        return NULL;
    int rc = DP_OK;
    void *DW = PyArray_DATA(dw), *DB = PyArray_DATA(db), *DX = dx ? PyArray_DATA(dx) : NULL;
    const void *DY = PyArray_DATA(dy), *X = PyArray_DATA(x), *Wp = PyArray_DATA(w);
    if (naive) {
        if (IS_F32(x))
            WITHOUT_GIL(dp_conv2d_backward_naive_f32(DW, DB, DX, DY, X, Wp, (int)B, &g));
        else
            WITHOUT_GIL(dp_conv2d_backward_naive_f64(DW, DB, DX, DY, X, Wp, (int)B, &g));
    } else {
        dp_ctx *c = cobj ? &cobj->ctx : NULL;
        dp_scratch *col = cobj ? &cobj->col : NULL;
        if (IS_F32(x))
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_backward_f32(c, col, DW, DB, DX, DY,
                                                                           X, Wp, (int)B, &g));
        else
            WITHOUT_GIL_LOCKED(CTX_LOCK(cobj), rc = dp_conv2d_backward_f64(c, col, DW, DB, DX, DY,
                                                                           X, Wp, (int)B, &g));
    }
    if (rc) return raise_code(rc, "conv2d_backward");
    Py_RETURN_NONE;
}

FIXED_ARG(py_conv2d_forward, conv_forward_common, 0)
FIXED_ARG(py_conv2d_forward_naive, conv_forward_common, 1)
FIXED_ARG(py_conv2d_backward, conv_backward_common, 0)
FIXED_ARG(py_conv2d_backward_naive, conv_backward_common, 1)

/* The pooled shape (B, C, H / 2, W / 2) of a (B, C, H, W) array, H and W >= 2. */
static int pooled_shape(PyArrayObject *a, const char *name, npy_intp *out)
{
    if (PyArray_DIM(a, 2) < 2 || PyArray_DIM(a, 3) < 2) {
        char s[128];
        shape_str(s, sizeof s, 4, PyArray_DIMS(a));
        PyErr_Format(PyExc_ValueError, "%s has shape %s: 2x2 pooling needs H >= 2 and W >= 2", name,
                     s);
        return -1;
    }
    out[0] = PyArray_DIM(a, 0);
    out[1] = PyArray_DIM(a, 1);
    out[2] = PyArray_DIM(a, 2) / 2;
    out[3] = PyArray_DIM(a, 3) / 2;
    return 0;
}

static PyObject *py_maxpool2_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    static const char *const kwlist[] = {"x", "y", "idx", NULL};
    PyObject *xo, *yo, *io;
    if (parse_args(args, nargs, kwnames, "OOO:maxpool2_forward", kwlist, &xo, &yo, &io))
        return NULL;
    PyArrayObject *x, *y, *idx;
    npy_intp yd[4];
    if (!(x = check_array(xo, "x", NPY_NOTYPE, 4, 0)) ||
        !(y = check_array(yo, "y", NPY_NOTYPE, 4, 1)) ||
        !(idx = check_array(io, "idx", NPY_UINT8, 4, 1)) || check_same_dtype(y, "y", x, "x") ||
        pooled_shape(x, "x", yd) || check_shape(y, "y", 4, yd) || check_shape(idx, "idx", 4, yd) ||
        check_no_overlap(y, "y", x, "x") || check_no_overlap(idx, "idx", x, "x") ||
        check_no_overlap(idx, "idx", y, "y"))
        return NULL;
    ptrdiff_t planes = (ptrdiff_t)PyArray_DIM(x, 0) * PyArray_DIM(x, 1);
    int H = (int)PyArray_DIM(x, 2), W = (int)PyArray_DIM(x, 3);
    if (IS_F32(x))
        WITHOUT_GIL(dp_maxpool2_forward_f32(PyArray_DATA(y), PyArray_DATA(idx), PyArray_DATA(x),
                                            planes, H, W));
    else
        WITHOUT_GIL(dp_maxpool2_forward_f64(PyArray_DATA(y), PyArray_DATA(idx), PyArray_DATA(x),
                                            planes, H, W));
    Py_RETURN_NONE;
}

static PyObject *py_maxpool2_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    static const char *const kwlist[] = {"dy", "idx", "dx", NULL};
    PyObject *dyo, *io, *dxo;
    if (parse_args(args, nargs, kwnames, "OOO:maxpool2_backward", kwlist, &dyo, &io, &dxo))
        return NULL;
    PyArrayObject *dy, *idx, *dx;
    npy_intp yd[4];
    if (!(dy = check_array(dyo, "dy", NPY_NOTYPE, 4, 0)) ||
        !(idx = check_array(io, "idx", NPY_UINT8, 4, 0)) ||
        !(dx = check_array(dxo, "dx", NPY_NOTYPE, 4, 1)) || check_same_dtype(dx, "dx", dy, "dy") ||
        pooled_shape(dx, "dx", yd) || check_shape(dy, "dy", 4, yd) ||
        check_shape(idx, "idx", 4, yd) || check_no_overlap(dx, "dx", dy, "dy") ||
        check_no_overlap(dx, "dx", idx, "idx"))
        return NULL;
    const uint8_t *code = PyArray_DATA(idx);
    npy_intp n = PyArray_SIZE(idx);
    for (npy_intp i = 0; i < n; i++)
        if (code[i] > 3)
            return PyErr_Format(PyExc_ValueError,
                                "idx holds %d at flat position %ld: a window position "
                                "is 0..3 (as maxpool2_forward writes it)",
                                (int)code[i], (long)i),
                   NULL;
    ptrdiff_t planes = (ptrdiff_t)PyArray_DIM(dx, 0) * PyArray_DIM(dx, 1);
    int H = (int)PyArray_DIM(dx, 2), W = (int)PyArray_DIM(dx, 3);
    if (IS_F32(dy))
        WITHOUT_GIL(
            dp_maxpool2_backward_f32(PyArray_DATA(dx), PyArray_DATA(dy), code, planes, H, W));
    else
        WITHOUT_GIL(
            dp_maxpool2_backward_f64(PyArray_DATA(dx), PyArray_DATA(dy), code, planes, H, W));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the functions */

PyMethodDef mod_kernels_functions[] = {
    {"gemm", FASTFN(py_gemm), FASTKW,
     "gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, ctx=None): c = alpha "
     "op(a) op(b) + beta c"},
    {"gemm_naive", FASTFN(py_gemm_naive), FASTKW, "gemm_naive(...): the triple-loop twin of gemm"},
    {"dense_forward", FASTFN(py_dense_forward), FASTKW,
     "dense_forward(x, w, b, y, *, ctx=None): y = x w^T + b"},
    {"dense_backward", FASTFN(py_dense_backward), FASTKW,
     "dense_backward(dy, x, w, dw, db, dx=None, *, ctx=None): dw += dy^T x; db += sum(dy); dx = dy "
     "w"},
    {"conv2d_forward", FASTFN(py_conv2d_forward), FASTKW,
     "conv2d_forward(x, w, b, y, *, padding=0, ctx=None): y = conv(x, w) + b; x (B, C, H, W), w "
     "(OC, C, KH, KW), stride 1"},
    {"conv2d_forward_naive", FASTFN(py_conv2d_forward_naive), FASTKW,
     "conv2d_forward_naive(x, w, b, y, *, padding=0): the loop twin of conv2d_forward"},
    {"conv2d_backward", FASTFN(py_conv2d_backward), FASTKW,
     "conv2d_backward(dy, x, w, dw, db, dx=None, *, padding=0, ctx=None): dw += d/dw, db += d/db; "
     "dx = d/dx (written)"},
    {"conv2d_backward_naive", FASTFN(py_conv2d_backward_naive), FASTKW,
     "conv2d_backward_naive(...): the loop twin of conv2d_backward"},
    {"maxpool2_forward", FASTFN(py_maxpool2_forward), FASTKW,
     "maxpool2_forward(x, y, idx): 2x2 max-pooling, stride 2; idx (uint8) = the window position "
     "0..3 of each maximum"},
    {"maxpool2_backward", FASTFN(py_maxpool2_backward), FASTKW,
     "maxpool2_backward(dy, idx, dx): dx = dy at each window's maximum, 0 elsewhere (written)"},
    {"relu_forward", FASTFN(py_relu_forward), FASTKW, "relu_forward(x, y): y = max(x, 0)"},
    {"relu_backward", FASTFN(py_relu_backward), FASTKW,
     "relu_backward(dy, y, dx): dx = dy * (y > 0)"},
    {"softmax_xent", FASTFN(py_softmax_xent), FASTKW,
     "softmax_xent(logits, labels, dlogits=None, grad_scale=None) -> loss sum"},
    {"sigmoid_bce", FASTFN(py_sigmoid_bce), FASTKW,
     "sigmoid_bce(logits, labels, dlogits=None, grad_scale=None) -> loss sum"},
    {"argmax", FASTFN(py_argmax), FASTKW, "argmax(x, out): out = x.argmax(1)"},
    {"count_correct", FASTFN(py_count_correct), FASTKW, "count_correct(logits, labels) -> int"},
    {"sgd_step", FASTFN(py_sgd_step), FASTKW,
     "sgd_step(params, grads, velocity, *, lr, momentum=0, dampening=0, weight_decay=0, "
     "nesterov=False, first_step=False, ctx=None): one torch.optim.SGD step in place; ctx (a "
     "Context, or the Model that computed grads) splits it over that object's threads"},
    {"adam_step", FASTFN(py_adam_step), FASTKW,
     "adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, *, step, lr, beta1=0.9, "
     "beta2=0.999, eps=1e-8, weight_decay=0, amsgrad=False, decoupled=False, ctx=None): step "
     "number `step` (1-based) of torch.optim.Adam (decoupled: AdamW) in place; "
     "max_exp_avg_sq is used only with amsgrad (may be None otherwise); ctx as sgd_step's"},
    {"rmsprop_step", FASTFN(py_rmsprop_step), FASTKW,
     "rmsprop_step(params, grads, square_avg, grad_avg, momentum_buffer, *, lr, alpha=0.99, "
     "eps=1e-8, weight_decay=0, momentum=0, centered=False, ctx=None): one torch.optim.RMSprop "
     "step in place; grad_avg is used only when centered, momentum_buffer only with momentum > "
     "0 (either may be None otherwise); ctx as sgd_step's"},
    {"sum_buffers", FASTFN(py_sum_buffers), FASTKW,
     "sum_buffers(out, inputs, *, scale=1.0, start=0, stop=None): "
     "out[start:stop] = scale * sum(inputs)[start:stop], added in order; uint16 arrays hold "
     "bfloat16 "
     "values: summed in float32, the result rounded to bfloat16"},
    {"to_bf16", FASTFN(py_to_bf16), FASTKW,
     "to_bf16(x, out): out (uint16, x's shape) = float32 x rounded to the "
     "nearest bfloat16 (ties to even), its bits"},
    {"from_bf16", FASTFN(py_from_bf16), FASTKW,
     "from_bf16(x, out): out (float32, x's shape) = the bfloat16 values "
     "whose bits x (uint16) holds, exactly"},
    {"augment_images", FASTFN(py_augment_images), FASTKW,
     "augment_images(x, out, ids, *, shape, pad, flip=False, seed, epoch): out[i] = image "
     "x[i] (shape (C, H, W), flat rows of float32 or float64) randomly cropped from its "
     "zero-padded copy (pad on each side) and, with flip, mirrored left-right by a coin; the "
     "draw depends on (seed, epoch, ids[i]) alone (GIL released)"},
    {"sum_squares", FASTFN(py_sum_squares), FASTKW,
     "sum_squares(x) -> float: the sum of x**2 in double, in 16 interleaved partial sums added "
     "in order (the same bits on every worker and ISA for float32; GIL released)"},
    {"scale_", FASTFN(py_scale), FASTKW,
     "scale_(buf, alpha, *, start=0, stop=None): buf[start:stop] *= alpha"},
    {"gather_rows", FASTFN(py_gather_rows), FASTKW,
     "gather_rows(x, index, out): out[i] = x[index[i]] (rows, any dtype; GIL released)"},
    {"zero_", FASTFN(py_zero), FASTKW,
     "zero_(buf, *, ctx=None): buf[:] = 0 with the GIL released; ctx (as sgd_step's) splits it "
     "over that object's threads"},
    {NULL},
};
