/* mod_context.c - dptrain._core.Context: the threads (dp_threads) and GEMM packing buffers of
 * a dp_ctx, plus the convolutions' im2col buffer, kept between calls. A module-level kernel
 * given ctx=... splits its work over the context's threads and reuses its scratch instead of
 * allocating its own (get_ctx in mod_common.c checks the argument; the object's struct is in
 * mod_common.h because every kernel binding reads it). get_team: the thread team of a ctx=...
 * argument that may also be a Model (the SGD step's and zero_'s).
 * Leaves out on purpose: pickling (a context is scratch; it is not picklable).
 */
#include "mod_common.h"

int get_team(PyObject *module, PyObject *obj, dp_threads **team, PyThread_type_lock *lock)
{
    core_state *st = module_state(module);
    *team = NULL;
    *lock = NULL;
    if (!obj || obj == Py_None) return 0;
    int ready;
    if (PyObject_TypeCheck(obj, st->context_type)) {
        ready = ((ContextObject *)obj)->ready;
        if (ready) *team = ((ContextObject *)obj)->ctx.team, *lock = ((ContextObject *)obj)->lock;
    } else if (PyObject_TypeCheck(obj, st->model_type)) {
        ready = model_team(obj, team, lock);
    } else {
        PyErr_Format(PyExc_TypeError, "ctx must be a dptrain._core.Context, Model or None, got %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!ready) {
        PyErr_Format(PyExc_RuntimeError, "ctx: this %s is not initialized", Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static int Context_init(ContextObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", "gemm_inputs", NULL};
    int threads = 1, bf16;
    PyObject *gi = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i$O:Context", kwlist, &threads, &gi) ||
        parse_gemm_inputs(gi, -1, &bf16))
        return -1;
    if (threads < 1 || threads > DP_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", DP_MAX_THREADS,
                     threads);
        return -1;
    }
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Context is already initialized");
        return -1;
    }
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = dp_ctx_init(&self->ctx, threads);
    if (rc) {
        raise_code(rc, "Context");
        return -1;
    }
    self->ctx.bf16_inputs = bf16;
    self->ready = 1;
    return 0;
}

static void Context_dealloc(ContextObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->ready) dp_ctx_free(&self->ctx);
    dp_scratch_free(&self->col);
    if (self->lock) PyThread_free_lock(self->lock);
    type->tp_free((PyObject *)self);
    Py_DECREF(type); /* a heap type: each instance holds a reference to it */
}

static PyObject *Context_threads(ContextObject *self, void *closure)
{ return PyLong_FromLong(self->ready ? self->ctx.threads : 0); }

static PyObject *Context_gemm_inputs(ContextObject *self, void *closure)
{
    if (self->ready && self->ctx.bf16_inputs) return PyUnicode_FromString("bfloat16");
    Py_RETURN_NONE;
}

static PyGetSetDef Context_getset[] = {
    {"threads", (getter)Context_threads, NULL, "threads the kernels split work over", NULL},
    {"gemm_inputs", (getter)Context_gemm_inputs, NULL,
     "'bfloat16': float32 GEMMs round their inputs to bfloat16 (float accumulation); None: as "
     "given",
     NULL},
    {NULL},
};

static PyType_Slot Context_slots[] = {
    {Py_tp_doc,
     (void *)"Context(threads=1, *, gemm_inputs=None): a thread pool and GEMM packing buffers for "
             "the "
             "kernels. gemm_inputs='bfloat16': the float32 GEMMs run with it (gemm, dense and "
             "conv kernels) round A and B to bfloat16 and accumulate in float32; float64 "
             "arrays are refused with it."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Context_init},
    {Py_tp_dealloc, Context_dealloc},
    {Py_tp_getset, Context_getset},
    {0, NULL},
};

PyType_Spec mod_context_spec = {
    .name = "dptrain._core.Context",
    .basicsize = sizeof(ContextObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Context_slots,
};
