/* mod_common.c - the boundary helpers every binding uses (see mod_common.h): names and
 * messages, array checks, held arrays, scalar arguments, the ctx argument.
 * Leaves out on purpose: any conversion. A wrong dtype, layout or shape is an error that
 * names the argument, what it is and what was expected; nothing is copied or cast. */
#include "mod_common.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

const char *dtype_name(PyArrayObject *a)
{
    switch (PyArray_TYPE(a)) {
    case NPY_FLOAT32: return "float32";
    case NPY_FLOAT64: return "float64";
    case NPY_INT64: return "int64";
    case NPY_INT32: return "int32";
    case NPY_UINT8: return "uint8";
    case NPY_UINT16: return "uint16";
    case NPY_FLOAT16: return "float16";
    default: return PyArray_DESCR(a)->typeobj->tp_name;
    }
}

const char *typenum_name(int t)
{
    return t == NPY_FLOAT32   ? "float32"
           : t == NPY_FLOAT64 ? "float64"
           : t == NPY_INT64   ? "int64"
           : t == NPY_UINT8   ? "uint8"
           : t == NPY_UINT16  ? "uint16"
                              : "?";
}

/* A shape as Python prints a tuple: (4,), (64, 784), (). */
void shape_str(char *buf, size_t n, int ndim, const npy_intp *dims)
{
    size_t used = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%ld", i ? ", " : "", (long)dims[i]);
    if (used < n) snprintf(buf + used, n - used, ndim == 1 ? ",)" : ")");
}

/* Returns obj as an ndarray of dtype `typenum` (NPY_NOTYPE: float32 or float64) and `ndim`
 * dimensions (-1: any), C-contiguous and aligned, writeable when `output`; NULL + exception. */
PyArrayObject *check_array(PyObject *obj, const char *name, int typenum, int ndim, int output)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int t = PyArray_TYPE(a);
    if (typenum == NPY_NOTYPE ? (t != NPY_FLOAT32 && t != NPY_FLOAT64) : t != typenum) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s, expected %s", name, dtype_name(a),
                     typenum == NPY_NOTYPE ? "float32 or float64" : typenum_name(typenum));
        return NULL;
    }
    if (!PyArray_ISNOTSWAPPED(a)) { /* the kernels read native numbers */
        PyErr_Format(PyExc_TypeError,
                     "%s has the non-native byte order '%c' (dtype %s): convert "
                     "it once with a.astype(a.dtype.newbyteorder('=')), outside the training loop",
                     name, PyArray_DESCR(a)->byteorder, dtype_name(a));
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
                     "np.ascontiguousarray, outside the training loop)",
                     name);
        return NULL;
    }
    if (output && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s is read-only, but it is written to", name);
        return NULL;
    }
    for (int i = 0; i < PyArray_NDIM(a); i++)
        if (PyArray_DIM(a, i) > INT_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "%s has a dimension of %ld, more than the kernels' limit %d", name,
                         (long)PyArray_DIM(a, i), INT_MAX);
            return NULL;
        }
    return a;
}

/* Checks a's shape against `expected` (ndim entries). */
int check_shape(PyArrayObject *a, const char *name, int ndim, const npy_intp *expected)
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

int check_same_dtype(PyArrayObject *a, const char *name, PyArrayObject *ref, const char *ref_name)
{
    if (PyArray_TYPE(a) == PyArray_TYPE(ref)) return 0;
    PyErr_Format(PyExc_TypeError, "%s has dtype %s, expected %s (the dtype of %s)", name,
                 dtype_name(a), dtype_name(ref), ref_name);
    return -1;
}

/* An output must not share memory with an input it is computed from. */
int check_no_overlap(PyArrayObject *out, const char *out_name, PyArrayObject *in,
                     const char *in_name)
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

void hold_array(held_array *h, PyArrayObject *a, int output)
{
    Py_INCREF(a);
    h->arr = a;
    h->data = PyArray_DATA(a);
    h->size = PyArray_SIZE(a);
    h->typenum = PyArray_TYPE(a);
    h->output = output;
}

int check_held(const held_array *h, const char *owner, const char *name)
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
        PyErr_Format(PyExc_ValueError,
                     "%s is read-only, but it is written to (%s.%s was made "
                     "read-only after the %s was built)",
                     name, owner, name, owner);
        return -1;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s.%s was changed after the %s was built: it is now %s of shape %s%s%s, but "
                 "it was built on %s of shape (%zd,) at its memory then; build a new %s for a "
                 "changed array",
                 owner, name, owner, dtype_name(a), now,
                 PyArray_DATA(a) != h->data ? ", at other memory" : "",
                 h->output && !PyArray_ISWRITEABLE(a) ? ", read-only" : "",
                 typenum_name(h->typenum), (Py_ssize_t)h->size, owner);
    return -1;
}

/* repr() of a double into buf (no Python object is created, so nothing can leak). */
const char *double_repr(char *buf, size_t n, double v)
{
    char *s = PyOS_double_to_string(v, 'r', 0, 0, NULL);
    snprintf(buf, n, "%s", s ? s : "?");
    PyMem_Free(s);
    return buf;
}

/* The exception set now, its message prefixed with "fname() argument 'name': " */
static void arg_error_context(const char *fname, const char *name)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *msg = value ? PyObject_Str(value) : NULL;
    if (msg) {
        PyErr_Format(type, "%s() argument '%s': %U", fname, name, msg);
        Py_DECREF(msg);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    } else {
        PyErr_Restore(type, value, tb);
    }
}

/* 1 where the keyword `key` (a str) is `name`. An ASCII key (every valid one) is compared
 * byte for byte in place: PyUnicode_CompareWithASCIIString, which it replaces, was a sizable
 * part of a small call's cost, once per keyword. */
static int keyword_is(PyObject *key, const char *name)
{
    if (!PyUnicode_IS_ASCII(key)) return PyUnicode_CompareWithASCIIString(key, name) == 0;
    const char *s = (const char *)PyUnicode_DATA(key);
    Py_ssize_t len = PyUnicode_GET_LENGTH(key), i = 0;
    while (i < len && name[i] && s[i] == name[i]) i++; /* (a key may hold a NUL) */
    return i == len && name[len] == '\0';
}

int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *format,
               const char *const *kwlist, ...)
{
    enum { MAX_PARAMS = 16 };
    PyObject *val[MAX_PARAMS] = {NULL};
    char code[MAX_PARAMS];
    int n = 0, required = -1, positional = -1;
    const char *fname = strchr(format, ':');
    fname = fname ? fname + 1 : "function";
    for (const char *f = format; *f && *f != ':'; f++) {
        if (*f == '|') {
            required = n;
        } else if (*f == '$') {
            positional = n;
        } else if (n == MAX_PARAMS) {
            PyErr_Format(PyExc_SystemError, "%s(): parse_args takes at most %d parameters", fname,
                         MAX_PARAMS);
            return -1;
        } else {
            code[n++] = *f;
        }
    }
    if (required < 0) required = n;
    if (positional < 0) positional = n;
    if (nargs > positional) {
        PyErr_Format(PyExc_TypeError, "%s() takes %s %d positional argument%s (%zd given)", fname,
                     required < positional ? "at most" : "exactly", positional,
                     positional == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) val[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < n && !keyword_is(key, kwlist[j])) j++;
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %s()", key,
                         fname);
            return -1;
        }
        if (val[j]) {
            PyErr_Format(PyExc_TypeError,
                         "argument for %s() given by name ('%s') and position (%d)", fname,
                         kwlist[j], j + 1);
            return -1;
        }
        val[j] = args[nargs + k];
    }
    for (int j = 0; j < required; j++)
        if (!val[j]) {
            if (j < positional)
                PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname,
                             kwlist[j], j + 1);
            else
                PyErr_Format(PyExc_TypeError, "%s() missing required keyword-only argument '%s'",
                             fname, kwlist[j]);
            return -1;
        }
    va_list ap;
    va_start(ap, kwlist);
    int rc = 0;
    for (int j = 0; j < n && !rc; j++) {
        void *out = va_arg(ap, void *);
        PyObject *v = val[j];
        if (!v) continue;
        switch (code[j]) {
        case 'O': *(PyObject **)out = v; break;
        case 'p': {
            int t = PyObject_IsTrue(v);
            if (t < 0)
                rc = -1;
            else
                *(int *)out = t;
            break;
        }
        case 'd': {
            double d = PyFloat_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred())
                rc = -1;
            else
                *(double *)out = d;
            break;
        }
        case 'i': {
            long l = PyLong_AsLong(v);
            if (l == -1 && PyErr_Occurred())
                rc = -1;
            else if (l > INT_MAX || l < INT_MIN) {
                PyErr_SetString(PyExc_OverflowError, l > INT_MAX
                                                         ? "signed integer is greater than maximum"
                                                         : "signed integer is less than minimum");
                rc = -1;
            } else {
                *(int *)out = (int)l;
            }
            break;
        }
        default:
            PyErr_Format(PyExc_SystemError, "%s(): parse_args has no format code '%c'", fname,
                         code[j]);
            rc = -1;
        }
        if (rc) arg_error_context(fname, kwlist[j]);
    }
    va_end(ap);
    return rc;
}

int check_finite(double v, const char *name)
{
    if (isfinite(v)) return 0;
    char b[64];
    PyErr_Format(PyExc_ValueError, "%s must be finite, got %s", name, double_repr(b, sizeof b, v));
    return -1;
}

/* The first label outside [0, classes) (binary: outside {0, 1}) as an exception. */
void label_error(PyArrayObject *labels, int64_t classes)
{
    const int64_t *l = PyArray_DATA(labels);
    npy_intp n = PyArray_SIZE(labels);
    for (npy_intp i = 0; i < n; i++)
        if (l[i] < 0 || l[i] >= classes) {
            PyErr_Format(PyExc_ValueError,
                         "labels[%ld] = %lld is out of range: expected 0 <= label < %lld", (long)i,
                         (long long)l[i], (long long)classes);
            return;
        }
    PyErr_SetString(PyExc_ValueError, "labels are out of range");
}

PyObject *raise_code(int rc, const char *what)
{
    if (rc == DP_ENOMEM) return PyErr_NoMemory();
    if (rc == DP_ETHREAD)
        return PyErr_Format(PyExc_RuntimeError, "%s: could not start a thread", what);
    return PyErr_Format(PyExc_RuntimeError, "%s failed with code %d", what, rc);
}

/* grad_scale argument: None -> 1/B. */
int get_grad_scale(PyObject *obj, npy_intp B, double *out)
{
    if (!obj || obj == Py_None) {
        *out = B > 0 ? 1.0 / (double)B : 0.0;
        return 0;
    }
    *out = PyFloat_AsDouble(obj);
    if (*out == -1.0 && PyErr_Occurred()) return -1;
    return check_finite(*out, "grad_scale");
}

/* start/stop arguments: a half-open element range inside [0, n]. */
int get_range(PyObject *starto, PyObject *stopo, npy_intp n, ptrdiff_t *start, ptrdiff_t *stop)
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
        PyErr_Format(PyExc_ValueError, "start=%zd, stop=%zd is not a range inside [0, %zd]", *start,
                     *stop, (Py_ssize_t)n);
        return -1;
    }
    return 0;
}

/* ctx argument: None -> a NULL context (the kernel allocates its own scratch). */
int parse_gemm_inputs(PyObject *obj, int f32, int *bf16)
{
    *bf16 = 0;
    if (!obj || obj == Py_None) return 0;
    Py_ssize_t len = 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &len) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "gemm_inputs must be a str or None, got %s",
                         Py_TYPE(obj)->tp_name);
        return -1;
    }
    if ((size_t)len != strlen(s)) { /* an embedded NUL: not one of the names */
        PyErr_SetString(PyExc_ValueError, "gemm_inputs holds a NUL character");
        return -1;
    }
    if (strcmp(s, "bfloat16") == 0) {
        if (f32 == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "gemm_inputs='bfloat16' needs float32 params, got float64");
            return -1;
        }
        *bf16 = 1;
        return 0;
    }
    if ((strcmp(s, "float32") == 0 && f32 != 0) || (strcmp(s, "float64") == 0 && f32 != 1))
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "gemm_inputs is '%s', expected 'bfloat16' or the params' dtype%s", s,
                 f32 == 1   ? " ('float32')"
                 : f32 == 0 ? " ('float64')"
                            : "");
    return -1;
}

int get_ctx(PyObject *module, PyObject *obj, PyArrayObject *ref, const char *ref_name,
            ContextObject **out)
{
    *out = NULL;
    if (!obj || obj == Py_None) return 0;
    if (!PyObject_TypeCheck(obj, module_state(module)->context_type) ||
        !((ContextObject *)obj)->ready) {
        PyErr_Format(PyExc_TypeError, "ctx must be a dptrain._core.Context or None, got %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (((ContextObject *)obj)->ctx.bf16_inputs && !IS_F32(ref)) {
        PyErr_Format(PyExc_ValueError,
                     "ctx rounds GEMM inputs to bfloat16 (gemm_inputs='bfloat16'), "
                     "which only float32 arrays take; %s is float64",
                     ref_name);
        return -1;
    }
    *out = (ContextObject *)obj;
    return 0;
}
