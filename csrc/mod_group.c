/* mod_group.c - dptrain._core.ShmGroup, one worker's handle on a group of workers that share
 * memory (threads of one process, or processes mapping one segment), and the functions of the
 * group's control block (group_control_bytes, init_group_control, abort_group_control).
 *
 * The collective itself is plain C (dp_group_barrier in dp_sync.c, dp_allreduce_f32 / _f64 /
 * _bf16 in dp_allreduce.c); this file validates the arrays once when the group is built, re-checks them on
 * every call (Python can move, re-type or resize an array in place), releases the GIL around
 * the call and turns its code into an exception: an abort raises the module's GroupAborted
 * ("group aborted", code), a timeout a TimeoutError naming the ranks that did not arrive.
 * Leaves out on purpose: pickling (a handle on shared memory is not picklable), and any
 * transport but shared memory (dptrain's communicators wrap this one and MPI's).
 */
#include "mod_common.h"

#include <math.h>
#include <string.h>

#include "dp_allreduce.h"
#include "dp_sync.h"

typedef struct {
    PyObject_HEAD
    PyObject *control;   /* the array holding the dp_barrier (owned) */
    PyObject *buffers;   /* tuple of the workers' flat buffers (owned) */
    PyObject *out_obj;   /* owned reference to the out array, or NULL */
    PyObject *world_obj; /* owned reference to the world control array, or NULL */
    dp_group g;          /* the handle the dp_group_* calls take; g.bufs is ptrs */
    void *ptrs[DP_MAX_GROUP];
    int btype; /* the buffers' (and out's) typenum: float32, float64, or
                                   * uint16 (bfloat16 bits, summed in float32) */
    npy_intp length;
} ShmGroupObject;

/* ------------------------------------------------------------------ the control block */

/* The dp_barrier at the start of `obj`: a writeable uint8 array, 64-byte aligned. */
static dp_barrier *control_barrier(PyObject *obj, const char *name)
{
    PyArrayObject *a = check_array(obj, name, NPY_UINT8, 1, 1);
    if (!a) return NULL;
    if (PyArray_SIZE(a) < (npy_intp)sizeof(dp_barrier) || ((uintptr_t)PyArray_DATA(a) % 64) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be a writeable uint8 array of >= %d bytes at a "
                     "64-byte aligned address",
                     name, (int)sizeof(dp_barrier));
        return NULL;
    }
    return (dp_barrier *)PyArray_DATA(a);
}

static PyObject *py_init_control(PyObject *module, PyObject *args)
{
    PyObject *co;
    int n;
    if (!PyArg_ParseTuple(args, "Oi:init_group_control", &co, &n)) return NULL;
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return NULL;
    if (n < 1 || n > DP_MAX_GROUP)
        return PyErr_Format(PyExc_ValueError, "n must be in [1, %d], got %d", DP_MAX_GROUP, n),
               NULL;
    /* the barrier and, where the array has room for them, the n arrival counters after it;
     * nothing past that (the array may be part of a larger buffer) */
    size_t bytes = (size_t)PyArray_NBYTES((PyArrayObject *)co), block = dp_group_control_bytes(n);
    memset(b, 0, bytes < block ? bytes : block);
    dp_barrier_init(b, n);
    Py_RETURN_NONE;
}

static PyObject *py_group_control_bytes(PyObject *module, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > DP_MAX_GROUP)
        return PyErr_Format(PyExc_ValueError, "n must be in [1, %d], got %ld", DP_MAX_GROUP, n),
               NULL;
    return PyLong_FromSize_t(dp_group_control_bytes((int)n));
}

/* An abort code argument: an int in [0, 2**32 - 1] (0 means 1: an abort always has a code). */
static int abort_code(PyObject *obj, uint32_t *code)
{
    *code = 1;
    if (!obj) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || v > (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "code must be an int in [0, %lu], got %S",
                     (unsigned long)UINT32_MAX, obj);
        return -1;
    }
    *code = v ? (uint32_t)v : 1u;
    return 0;
}

static PyObject *py_abort_control(PyObject *module, PyObject *args)
{
    PyObject *co, *codeo = NULL;
    uint32_t code;
    if (!PyArg_ParseTuple(args, "O|O:abort_group_control", &co, &codeo) || abort_code(codeo, &code))
        return NULL;
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return NULL;
    if (b->magic != DP_BARRIER_MAGIC)
        return PyErr_Format(PyExc_ValueError, "control is not initialized"), NULL;
    dp_barrier_abort(b, code);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ ShmGroup */

static int ShmGroup_init(ShmGroupObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"control",    "buffers", "rank",      "out",   "spin",
                             "yield_time", "timeout", "algorithm", "world", NULL};
    PyObject *co, *bo, *seq = NULL, *oo = Py_None, *wo = Py_None;
    int rank, rc = -1, algorithm = -1;
    double spin = 200e-6, yield_time = 2e-3, timeout = 0.0;
    const char *alg_name = "native";
    if (self->g.barrier) {
        PyErr_SetString(PyExc_RuntimeError, "ShmGroup is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOi|$OdddsO:ShmGroup", kwlist, &co, &bo, &rank,
                                     &oo, &spin, &yield_time, &timeout, &alg_name, &wo))
        return -1;
    for (int a = 0; a < DP_ALLREDUCE_COUNT; a++)
        if (strcmp(alg_name, dp_allreduce_name(a)) == 0) algorithm = a;
    if (algorithm < 0) {
        PyErr_Format(PyExc_ValueError, "algorithm is '%s', expected 'native', 'ring' or 'tree'",
                     alg_name);
        return -1;
    }
    dp_barrier *b = control_barrier(co, "control");
    if (!b) return -1;
    if (b->magic != DP_BARRIER_MAGIC) {
        PyErr_SetString(
            PyExc_ValueError,
            "control is not initialized: call init_group_control(control, n) once first");
        return -1;
    }
    dp_barrier *world = NULL;
    if (wo != Py_None) {
        if (!(world = control_barrier(wo, "world"))) return -1;
        if (world->magic != DP_BARRIER_MAGIC || world->n != b->n) {
            PyErr_Format(PyExc_ValueError,
                         "world is not an initialized control block of a group of %u "
                         "workers",
                         b->n);
            return -1;
        }
    }
    if (!(seq = PySequence_Fast(bo, "buffers must be a sequence of arrays"))) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (b->n < 1 || b->n > DP_MAX_GROUP) {
        PyErr_Format(PyExc_ValueError,
                     "control holds a group of %u workers, expected 1 to %d: "
                     "it is not a control block made by init_group_control",
                     b->n, DP_MAX_GROUP);
        goto fail;
    }
    if (oo == Py_None && n != (Py_ssize_t)b->n) {
        PyErr_Format(PyExc_ValueError, "buffers has %zd arrays, but the group has %u workers", n,
                     b->n);
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
    if (!(isfinite(spin) && spin >= 0 && isfinite(yield_time) && yield_time >= 0 &&
          isfinite(timeout) && timeout >= 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "spin, yield_time and timeout must be finite numbers >= 0");
        goto fail;
    }
    PyArrayObject *first = NULL;
    PyObject *b0 = PySequence_Fast_GET_ITEM(seq, 0);
    /* uint16 buffers hold bfloat16 values: summed in float32 into a uint16 out, rounded to
     * bfloat16 (native only) */
    int bf16 = PyArray_Check(b0) && PyArray_TYPE((PyArrayObject *)b0) == NPY_UINT16;
    if (bf16 && (oo == Py_None || algorithm != DP_ALLREDUCE_NATIVE)) {
        PyErr_Format(PyExc_ValueError,
                     "bfloat16 buffers (uint16) are summed into an out array "
                     "with the native algorithm; got %s and algorithm '%s'",
                     oo == Py_None ? "no out" : "an out", alg_name);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char name[48];
        snprintf(name, sizeof name, "buffers[%zd]", i);
        PyArrayObject *a = check_array(PySequence_Fast_GET_ITEM(seq, i), name,
                                       bf16 ? NPY_UINT16 : NPY_NOTYPE, 1, 1);
        if (!a) goto fail;
        if (!first)
            first = a;
        else if (check_same_dtype(a, name, first, "buffers[0]") ||
                 check_shape(a, name, 1, PyArray_DIMS(first)))
            goto fail;
        for (Py_ssize_t j = 0; j < i; j++)
            if (check_no_overlap(a, name, (PyArrayObject *)PySequence_Fast_GET_ITEM(seq, j),
                                 "another buffer"))
                goto fail;
        if (check_no_overlap(a, name, (PyArrayObject *)co, "control")) /* the barrier's memory */
            goto fail;
        self->ptrs[i] = PyArray_DATA(a);
    }
    if (oo != Py_None) {
        PyArrayObject *o = check_array(oo, "out", PyArray_TYPE(first), 1, 1);
        if (!o || check_shape(o, "out", 1, PyArray_DIMS(first))) goto fail;
        for (Py_ssize_t j = 0; j < n; j++)
            if (check_no_overlap(o, "out", (PyArrayObject *)PySequence_Fast_GET_ITEM(seq, j),
                                 "a buffer"))
                goto fail;
        if (check_no_overlap(o, "out", (PyArrayObject *)co, "control")) goto fail;
        Py_INCREF(oo);
        self->out_obj = oo;
        self->g.out = PyArray_DATA(o);
    }
    if (algorithm != DP_ALLREDUCE_NATIVE && (oo != Py_None || n != (Py_ssize_t)b->n)) {
        PyErr_Format(PyExc_ValueError,
                     "algorithm '%s' needs one buffer per worker (%u, got %zd) "
                     "and no out array",
                     alg_name, b->n, n);
        goto fail;
    }
    if (algorithm == DP_ALLREDUCE_TREE && PyArray_SIZE(first) > 0) {
        self->g.scratch = PyMem_RawMalloc((size_t)PyArray_SIZE(first) * PyArray_ITEMSIZE(first));
        if (!self->g.scratch) {
            PyErr_NoMemory();
            goto fail;
        }
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
    self->btype = PyArray_TYPE(first);
    self->length = PyArray_SIZE(first);
    self->g.policy.spin_s = spin;
    self->g.policy.yield_s = yield_time;
    self->g.policy.timeout_s = timeout;
    self->g.policy.arrivals = self->g.arrivals; /* every barrier of a collective counts */
    self->g.policy.rank = rank;
    if (world) {
        Py_INCREF(wo);
        self->world_obj = wo;
        self->g.policy.world = world;
    }
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
    Py_XDECREF(self->world_obj);
    PyMem_RawFree(self->g.scratch);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type); /* a heap type: each instance holds a reference to it */
}

/* Raises TimeoutError(message) with `missing`: a tuple of every rank that did not arrive
 * (the message names 16 at most), so that an elastic run knows whom to drop. k: how many. */
static PyObject *raise_timeout(ShmGroupObject *self, PyObject *message, int k)
{
    if (!message) return NULL;
    PyObject *exc = PyObject_CallOneArg(PyExc_TimeoutError, message);
    Py_DECREF(message);
    int *all = k > 0 ? PyMem_RawMalloc(sizeof(int) * (size_t)k) : NULL;
    if (!exc || (k > 0 && !all)) {
        Py_XDECREF(exc);
        PyMem_RawFree(all);
        return exc ? PyErr_NoMemory() : NULL;
    }
    if (k > 0) k = dp_group_missing(self->g.arrivals, self->g.n, self->g.rank, all, k);
    PyObject *missing = PyTuple_New(k > 0 ? k : 0);
    for (int i = 0; missing && i < k; i++) {
        PyObject *r = PyLong_FromLong(all[i]);
        if (r)
            PyTuple_SET_ITEM(missing, i, r);
        else
            Py_CLEAR(missing);
    }
    PyMem_RawFree(all);
    if (missing && PyObject_SetAttrString(exc, "missing", missing) == 0)
        PyErr_SetObject(PyExc_TimeoutError, exc);
    Py_XDECREF(missing);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *group_error(ShmGroupObject *self, int rc, uint32_t code, const char *what)
{
    if (rc == DP_EABORT) {
        PyObject *err = Py_BuildValue("(sI)", "group aborted", code);
        if (err) PyErr_SetObject(type_state(Py_TYPE(self))->group_aborted, err);
        Py_XDECREF(err);
        return NULL;
    }
    if (rc == DP_ETIMEOUT) {
        char t[64], who[256] = "";
        int missing[16], k = self->g.arrivals ? dp_group_missing(self->g.arrivals, self->g.n,
                                                                 self->g.rank, missing, 16)
                                              : 0;
        if (k > 0) {
            size_t used = (size_t)snprintf(who, sizeof who, ": rank%s ", k > 1 ? "s" : "");
            for (int i = 0; i < k && i < 16 && used < sizeof who; i++)
                used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", i ? ", " : "",
                                         missing[i]);
            if (used < sizeof who)
                snprintf(who + used, sizeof who - used, "%s did not arrive", k > 16 ? ", ..." : "");
        } else if (self->g.n == 1 || self->g.arrivals) {
            /* nobody is missing, yet the barrier did not open: its words were written over */
            snprintf(who, sizeof who,
                     ", yet no rank is missing: the control block was written "
                     "to from outside the group");
        }
        return raise_timeout(
            self,
            PyUnicode_FromFormat("%s on rank %d timed out after %s s waiting for the other %d "
                                 "workers%s",
                                 what, self->g.rank,
                                 double_repr(t, sizeof t, self->g.policy.timeout_s), self->g.n - 1,
                                 who),
            k);
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
        return PyErr_Format(PyExc_ValueError,
                            "ShmGroup.control was changed after the ShmGroup "
                            "was built (moved, re-typed, shrunk or made read-only)"),
               -1;
    PyArrayObject *w = (PyArrayObject *)self->world_obj;
    if (w && (PyArray_DATA(w) != (void *)self->g.policy.world || PyArray_TYPE(w) != NPY_UINT8 ||
              PyArray_NBYTES(w) < (npy_intp)sizeof(dp_barrier) || !PyArray_ISWRITEABLE(w)))
        return PyErr_Format(PyExc_ValueError,
                            "ShmGroup world was changed after the ShmGroup "
                            "was built (moved, re-typed, shrunk or made read-only)"),
               -1;
    return 0;
}

static int group_ready(ShmGroupObject *self)
{
    if (group_control_ready(self)) return -1;
    /* an aborted group says so first: the run is over, whatever else changed since */
    uint32_t code = dp_barrier_abort_code(self->g.barrier);
    if (!code && self->g.policy.world) code = dp_barrier_abort_code(self->g.policy.world);
    if (code) return group_error(self, DP_EABORT, code, "allreduce"), -1;
    int t = self->btype;
    for (int i = 0; i < self->g.k; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(self->buffers, i);
        if (PyArray_DATA(a) != self->ptrs[i] || PyArray_TYPE(a) != t || PyArray_NDIM(a) != 1 ||
            PyArray_DIM(a, 0) != self->length || !PyArray_IS_C_CONTIGUOUS(a) ||
            !PyArray_ISWRITEABLE(a))
            return PyErr_Format(
                       PyExc_ValueError,
                       "ShmGroup buffers[%d] was changed after the ShmGroup "
                       "was built: it must stay a writeable %s array of shape (%zd,) at its "
                       "memory",
                       i, typenum_name(t), (Py_ssize_t)self->length),
                   -1;
    }
    if (self->out_obj) {
        PyArrayObject *o = (PyArrayObject *)self->out_obj;
        if (PyArray_DATA(o) != self->g.out || PyArray_TYPE(o) != t || PyArray_NDIM(o) != 1 ||
            PyArray_DIM(o, 0) != self->length || !PyArray_IS_C_CONTIGUOUS(o) ||
            !PyArray_ISWRITEABLE(o))
            return PyErr_Format(
                       PyExc_ValueError,
                       "ShmGroup out was changed after the ShmGroup was "
                       "built: it must stay a writeable %s array of shape (%zd,) at its memory",
                       typenum_name(t), (Py_ssize_t)self->length),
                   -1;
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

static PyObject *ShmGroup_allreduce(ShmGroupObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    static const char *const kwlist[] = {"scale", "start", "stop", "publish", NULL};
    double scale = 1.0;
    PyObject *starto = NULL, *stopo = NULL;
    int publish = 1;
    if (parse_args(args, nargs, kwnames, "|dOOp:allreduce", kwlist, &scale, &starto, &stopo,
                   &publish))
        return NULL;
    ptrdiff_t start, stop;
    if (group_ready(self) || check_finite(scale, "scale") ||
        get_range(starto, stopo, self->length, &start, &stop))
        return NULL;
    if (!publish &&
        (!self->g.out || self->btype == NPY_UINT16 || self->g.algorithm != DP_ALLREDUCE_NATIVE)) {
        PyErr_SetString(PyExc_ValueError,
                        "publish=False needs the native algorithm, an out array and float32 or "
                        "float64 buffers (a group of sum_into_)");
        return NULL;
    }
    uint32_t code = 0;
    double waited = 0;
    int rc, flags = publish ? DP_ALLREDUCE_PUBLISH : 0;
    if (self->btype == NPY_UINT16)
        WITHOUT_GIL(rc = dp_allreduce_bf16(&self->g, start, stop, (float)scale, &waited, &code));
    else if (self->btype == NPY_FLOAT32)
        WITHOUT_GIL(
            rc = dp_allreduce_ex_f32(&self->g, start, stop, (float)scale, flags, &waited, &code));
    else
        WITHOUT_GIL(rc = dp_allreduce_ex_f64(&self->g, start, stop, scale, flags, &waited, &code));
    if (rc) return group_error(self, rc, code, "allreduce");
    /* the wait at the entry barrier: this worker waiting for the slowest one (arrival skew),
     * not transfer */
    return PyFloat_FromDouble(waited);
}

/* The signature check of agree and checked_allreduce: `world` (a ShmGroup on the barrier every
 * worker meets at) writes sig into this worker's row of table[parity] (int64, (2, n, 8)), waits
 * at its barrier, and compares every worker's row with its own. Every worker compares the same
 * rows, so all of them see a mismatch or none does, before any of them touches an array. Two
 * parities: a worker writes table[p] again only two calls later, after every worker has passed
 * the barrier between, i.e. has read table[p]. Parsed with the GIL (the arrays checked); run
 * without it. */
enum { SIG_FIELDS = 8 };
typedef struct {
    ShmGroupObject *world;
    PyArrayObject *table, *sig_array; /* borrowed: the call's arguments */
    int64_t *rows;                    /* table[parity] */
    int64_t sig[SIG_FIELDS];
} sig_check;

static int parse_check(ShmGroupObject *self, PyObject *const *args, sig_check *c)
{
    if (!PyObject_TypeCheck(args[0], Py_TYPE(self)))
        return PyErr_Format(PyExc_TypeError, "world must be a ShmGroup, got %s",
                            Py_TYPE(args[0])->tp_name),
               -1;
    c->world = (ShmGroupObject *)args[0];
    if (group_control_ready(c->world)) return -1;
    PyArrayObject *t = check_array(args[1], "table", NPY_INT64, 1, 1);
    PyArrayObject *sig = t ? check_array(args[3], "signature", NPY_INT64, 1, 0) : NULL;
    if (!sig) return -1;
    int n = c->world->g.n;
    if (PyArray_SIZE(t) < (npy_intp)2 * n * SIG_FIELDS || PyArray_SIZE(sig) != SIG_FIELDS ||
        !PyArray_IS_C_CONTIGUOUS(t) || !PyArray_IS_C_CONTIGUOUS(sig))
        return PyErr_Format(PyExc_ValueError,
                            "table must hold >= %d contiguous int64 values (has %zd) and "
                            "signature %d (has %zd)",
                            2 * n * SIG_FIELDS, (Py_ssize_t)PyArray_SIZE(t), SIG_FIELDS,
                            (Py_ssize_t)PyArray_SIZE(sig)),
               -1;
    long parity = PyLong_AsLong(args[2]);
    if (parity == -1 && PyErr_Occurred()) return -1;
    c->table = t;
    c->sig_array = sig;
    c->rows = (int64_t *)PyArray_DATA(t) + (size_t)(parity & 1) * n * SIG_FIELDS;
    return 0;
}

/* The last check, after an abort has had its say: the signature copied, unless it lies
 * inside the table, where the other workers' rows would change it under this one. */
static int take_signature(sig_check *c)
{
    const char *t0 = PyArray_DATA(c->table), *s0 = PyArray_DATA(c->sig_array);
    if (s0 < t0 + PyArray_NBYTES(c->table) && t0 < s0 + PyArray_NBYTES(c->sig_array))
        return PyErr_Format(PyExc_ValueError,
                            "signature lies inside table, which the workers write to"),
               -1;
    memcpy(c->sig, s0, sizeof c->sig);
    return 0;
}

/* 0 when every row matched, 1 when one did not, or a barrier's error code. */
static int run_check(sig_check *c, double *waited, uint32_t *code)
{
    dp_group *w = &c->world->g;
    memcpy(c->rows + (size_t)w->rank * SIG_FIELDS, c->sig, sizeof c->sig);
    int rc = dp_group_barrier(w, waited, code);
    if (rc) return rc;
    for (int r = 0; r < w->n; r++)
        if (memcmp(c->rows + (size_t)r * SIG_FIELDS, c->sig, sizeof c->sig) != 0) return 1;
    return 0;
}

/* agree(table, parity, signature) -> seconds waited, or None when the workers did not all
 * pass the same signature (8 int64: a collective's arguments, dptrain.comm.base.signature),
 * on this group's barrier (see sig_check). */
static PyObject *ShmGroup_agree(ShmGroupObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError,
                            "agree() takes 3 arguments (table, parity, signature), got %zd", nargs),
               NULL;
    PyObject *with_self[4] = {(PyObject *)self, args[0], args[1], args[2]};
    sig_check c;
    if (parse_check(self, with_self, &c)) return NULL;
    uint32_t aborted = dp_barrier_abort_code(self->g.barrier);
    if (!aborted && self->g.policy.world) aborted = dp_barrier_abort_code(self->g.policy.world);
    if (aborted) return group_error(self, DP_EABORT, aborted, "collective");
    if (take_signature(&c)) return NULL;
    uint32_t code = 0;
    double waited = 0;
    int rc;
    WITHOUT_GIL(rc = run_check(&c, &waited, &code));
    if (rc == 1) Py_RETURN_NONE;
    if (rc) return group_error(self, rc, code, "collective");
    return PyFloat_FromDouble(waited);
}

/* run_check, then (every row matched) the group's all-reduce entered by it; *in_check: the
 * code is the check's (its barrier is the world's, whose arrivals name a late worker). */
static int checked_sum(ShmGroupObject *self, sig_check *c, ptrdiff_t start, ptrdiff_t stop,
                       double scale, int flags, double *waited, uint32_t *code, int *in_check)
{
    double unused;
    int rc = run_check(c, waited, code);
    *in_check = 1;
    if (rc) return rc;
    *in_check = 0;
    return self->btype == NPY_FLOAT32
               ? dp_allreduce_ex_f32(&self->g, start, stop, (float)scale, flags, &unused, code)
               : dp_allreduce_ex_f64(&self->g, start, stop, scale, flags, &unused, code);
}

/* checked_allreduce(world, table, parity, signature, scale, start, stop, publish) -> seconds
 * waited, or None: world.agree's check, then allreduce(scale, start, stop, publish,
 * its entry barrier left out: the check's was it) in the same call (float buffers, every one complete before the call): one
 * release of the GIL, which thread workers hand to each other at every release. */
static PyObject *ShmGroup_checked_allreduce(ShmGroupObject *self, PyObject *const *args,
                                            Py_ssize_t nargs)
{
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError,
                            "checked_allreduce() takes 8 arguments (world, table, parity, "
                            "signature, scale, start, stop, publish), got %zd",
                            nargs),
               NULL;
    sig_check c;
    ptrdiff_t start, stop;
    if (parse_check(self, args, &c) || group_ready(self)) return NULL;
    double scale = PyFloat_AsDouble(args[4]);
    int publish = PyObject_IsTrue(args[7]);
    if ((scale == -1.0 && PyErr_Occurred()) || publish < 0 || check_finite(scale, "scale") ||
        get_range(args[5], args[6], self->length, &start, &stop) || take_signature(&c))
        return NULL;
    if (self->btype == NPY_UINT16 ||
        (!publish && (!self->g.out || self->g.algorithm != DP_ALLREDUCE_NATIVE))) {
        PyErr_SetString(PyExc_ValueError,
                        "checked_allreduce needs float32 or float64 buffers (publish=False: "
                        "the native algorithm and an out array)");
        return NULL;
    }
    int flags = DP_ALLREDUCE_ENTERED | (publish ? DP_ALLREDUCE_PUBLISH : 0);
    uint32_t code = 0;
    double waited = 0;
    int rc, in_check = 1;
    WITHOUT_GIL(rc = checked_sum(self, &c, start, stop, scale, flags, &waited, &code, &in_check));
    if (rc == 1) Py_RETURN_NONE;
    if (rc) return group_error(in_check ? c.world : self, rc, code, "allreduce");
    return PyFloat_FromDouble(waited);
}

static PyObject *ShmGroup_abort(ShmGroupObject *self, PyObject *args)
{
    PyObject *codeo = NULL;
    uint32_t code;
    if (!PyArg_ParseTuple(args, "|O:abort", &codeo) || abort_code(codeo, &code)) return NULL;
    if (group_control_ready(self)) return NULL; /* aborting needs the barrier alone */
    dp_barrier_abort(self->g.barrier, code);
    if (self->g.policy.world) dp_barrier_abort(self->g.policy.world, code);
    Py_RETURN_NONE;
}

static PyObject *ShmGroup_get_aborted(ShmGroupObject *self, void *c)
{
    if (!self->g.barrier) return PyLong_FromLong(0);
    if (group_control_ready(self)) return NULL;
    uint32_t code = dp_barrier_abort_code(self->g.barrier);
    if (!code && self->g.policy.world) code = dp_barrier_abort_code(self->g.policy.world);
    return PyLong_FromUnsignedLong(code);
}
static PyObject *ShmGroup_get_rank(ShmGroupObject *self, void *c)
{ return PyLong_FromLong(self->g.rank); }
static PyObject *ShmGroup_get_size(ShmGroupObject *self, void *c)
{ return PyLong_FromLong(self->g.n); }

static PyMethodDef ShmGroup_methods[] = {
    {"barrier", (PyCFunction)ShmGroup_barrier, METH_NOARGS,
     "barrier() -> seconds waited: wait until every worker arrives"},
    {"allreduce", FASTFN(ShmGroup_allreduce), FASTKW,
     "allreduce(scale=1.0, start=0, stop=None, publish=True) -> seconds waited at the entry "
     "barrier: every "
     "buffer[start:stop] (or only out[start:stop] when the group has an out array) = scale * the "
     "sum "
     "of all buffers[start:stop]; native: summed in buffer order, this worker reduces its slice; "
     "ring/tree: the point-to-point schedules of the group's algorithm; uint16 buffers (bfloat16 "
     "values) are summed in float32 into the uint16 out, rounded to bfloat16; publish=False "
     "(native, with out, float): return once this worker's slice of out is summed, without the "
     "exit barrier"},
    {"agree", FASTFN(ShmGroup_agree), METH_FASTCALL,
     "agree(table, parity, signature) -> seconds waited, or None: write signature (8 int64) "
     "into this worker's row of table[parity] (int64, (2, n, 8)), wait at the barrier, then "
     "None unless every worker's row equals this one's (a collective's arguments, checked "
     "before it runs)"},
    {"checked_allreduce", FASTFN(ShmGroup_checked_allreduce), METH_FASTCALL,
     "checked_allreduce(world, table, parity, signature, scale, start, stop, publish) -> "
     "seconds waited, or None: world.agree(table, parity, signature), then, if every worker "
     "agreed, allreduce(scale, start, stop, publish) without its entry barrier, in one call"},
    {"abort", (PyCFunction)ShmGroup_abort, METH_VARARGS,
     "abort(code=1): wake every waiter with an error"},
    {NULL},
};

static PyGetSetDef ShmGroup_getset[] = {
    {"aborted", (getter)ShmGroup_get_aborted, NULL, "0, or the code the group was aborted with",
     NULL},
    {"rank", (getter)ShmGroup_get_rank, NULL, "this worker's rank", NULL},
    {"size", (getter)ShmGroup_get_size, NULL, "workers in the group", NULL},
    {NULL},
};

static PyType_Slot ShmGroup_slots[] = {
    {Py_tp_doc,
     (void *)"ShmGroup(control, buffers, rank, *, out=None, spin=2e-4, yield_time=2e-3, "
             "timeout=0, algorithm='native', world=None): one worker's handle on a group "
             "of workers that share memory (threads or processes); world: the control "
             "block of the whole set of workers, whose abort also stops this group."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, ShmGroup_init},
    {Py_tp_dealloc, ShmGroup_dealloc},
    {Py_tp_methods, ShmGroup_methods},
    {Py_tp_getset, ShmGroup_getset},
    {0, NULL},
};

PyType_Spec mod_shmgroup_spec = {
    .name = "dptrain._core.ShmGroup",
    .basicsize = sizeof(ShmGroupObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ShmGroup_slots,
};

/* ------------------------------------------------------------------ the functions */

PyMethodDef mod_group_functions[] = {
    {"group_control_bytes", py_group_control_bytes, METH_O,
     "group_control_bytes(n) -> bytes of a ShmGroup control block for n workers that also tracks "
     "who arrived (a timeout then names the workers that did not)"},
    {"init_group_control", py_init_control, METH_VARARGS,
     "init_group_control(control, n): set up a ShmGroup's barrier memory for n workers"},
    {"abort_group_control", py_abort_control, METH_VARARGS,
     "abort_group_control(control, code=1): abort the group that waits on this control block (e.g. "
     "from the launcher when a worker died)"},
    {NULL},
};
