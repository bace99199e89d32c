/* mod_common.h - what every binding of dptrain._core shares: the module state, the boundary
 * helpers (validation of arrays and arguments, error messages), the GIL macros, and the
 * pieces module.c assembles into the module.
 *
 * The extension is two layers. The kernels (dp_*.c) are plain C with no Python in them; the
 * bindings (module.c and mod_*.c, the only files that include Python.h or NumPy) follow one
 * recipe per entry point: parse -> validate (ndarray, dtype, ndim, shape, C-contiguity,
 * alignment, writeable outputs, no output aliasing an input) -> release the GIL -> call the
 * kernel -> turn its return code into an exception. No argument is ever converted or copied:
 * a wrong dtype or layout is an error, so no hidden copy hides in a training loop.
 *
 *   module.c        the module: state, multi-phase init, the types and the exception
 *   mod_common.c    these helpers
 *   mod_kernels.c   the module-level functions that run a kernel (gemm, dense, losses,
 *                   sgd_step, conv2d, ...)
 *   mod_build.c     the build and the CPU (build_info, cpu_features, fma_peak, isa, set_isa,
 *                   set_bf16_dot, set_bf16_amx)
 *   mod_context.c   Context (threads and scratch the kernels can reuse between calls)
 *   mod_model.c     Model (the fused training path of any layer list) and model_plan
 *   mod_group.c     ShmGroup and the group control-block functions (GroupAborted's raiser)
 *
 * Objects that own scratch (Context, Model) carry a lock taken without the GIL, so
 * two Python threads sharing one object serialize instead of corrupting its buffers; threads
 * with their own objects run in parallel. No file-scope state is mutable: the types and the
 * exception live in the module state (as CPython's Modules/xxlimited.c does).
 */
#ifndef MOD_COMMON_H
#define MOD_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

/* One NumPy C-API table for the whole extension: module.c defines it and fills it
 * (import_array in its exec slot, MOD_IMPORTS_NUMPY); the other files use it. */
#define PY_ARRAY_UNIQUE_SYMBOL dptrain_core_ARRAY_API
#ifndef MOD_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "dp_common.h"
#include "dp_gemm.h"

/* ------------------------------------------------------------------ module state */

/* Created in module.c's exec slot, visited and cleared there; one per module object. */
typedef struct {
    PyTypeObject *context_type;  /* dptrain._core.Context */
    PyTypeObject *model_type;    /* dptrain._core.Model */
    PyTypeObject *shmgroup_type; /* dptrain._core.ShmGroup */
    PyObject *group_aborted;     /* dptrain._core.GroupAborted(RuntimeError) */
} core_state;

/* The state of the module (self of a module-level function). */
static inline core_state *module_state(PyObject *module)
{ return (core_state *)PyModule_GetState(module); }

/* The state of the module that defined `type` (Py_TYPE(self) in a method of our types). */
static inline core_state *type_state(PyTypeObject *type)
{ return (core_state *)PyType_GetModuleState(type); }

/* ------------------------------------------------------------------ names and messages */

#define IS_F32(a) (PyArray_TYPE(a) == NPY_FLOAT32)

/* "float32", "int64", ... of an array; of a type number (float32/float64/int64/uint8, else "?") */
const char *dtype_name(PyArrayObject *a);
const char *typenum_name(int t);
/* A shape as Python prints a tuple: (4,), (64, 784), (). */
void shape_str(char *buf, size_t n, int ndim, const npy_intp *dims);
/* repr() of a double into buf (no Python object is created, so nothing can leak). */
const char *double_repr(char *buf, size_t n, double v);
/* The exception of a kernel's DP_E* code: MemoryError, or RuntimeError naming `what`. NULL. */
PyObject *raise_code(int rc, const char *what);
/* The first label outside [0, classes) (binary: outside {0, 1}) as a ValueError. */
void label_error(PyArrayObject *labels, int64_t classes);

/* ------------------------------------------------------------------ array checks */

/* Returns obj as an ndarray of dtype `typenum` (NPY_NOTYPE: float32 or float64) and `ndim`
 * dimensions (-1: any), C-contiguous and aligned, writeable when `output`; NULL + exception. */
PyArrayObject *check_array(PyObject *obj, const char *name, int typenum, int ndim, int output);
/* 0 when a has this shape (ndim entries), else -1 + "x has shape (..), expected (..)". */
int check_shape(PyArrayObject *a, const char *name, int ndim, const npy_intp *expected);
/* 0 when a has ref's dtype, else -1 + a TypeError naming both. */
int check_same_dtype(PyArrayObject *a, const char *name, PyArrayObject *ref, const char *ref_name);
/* An output must not share memory with an input it is computed from (in may be NULL). */
int check_no_overlap(PyArrayObject *out, const char *out_name, PyArrayObject *in,
                     const char *in_name);

/* An array an object holds between calls (a model's params and grads, a group's buffers).
 * NumPy lets Python re-type (`a.dtype = ...`), re-shape or re-size (`a.resize(...,
 * refcheck=False)`), and on NumPy 1.x re-point (`a.data = ...`) an array in place, so what
 * was validated when the object was built is checked again on every call that uses it: the
 * same memory, dtype, element count, C-contiguity and (for outputs) writeability. */
typedef struct {
    PyArrayObject *arr; /* owned reference */
    void *data;
    npy_intp size;
    int typenum;
    int output;
} held_array;

/* Takes a reference to a (already validated) and records what it is now. */
void hold_array(held_array *h, PyArrayObject *a, int output);
/* 0 when the held array is still what it was; else -1 + a ValueError naming owner.name. */
int check_held(const held_array *h, const char *owner, const char *name);

/* ------------------------------------------------------------------ arguments */

/* The arguments of a METH_FASTCALL | METH_KEYWORDS call (args[0 .. nargs), then one value per
 * name in kwnames), parsed as PyArg_ParseTupleAndKeywords parses a tuple and a dict, into the
 * pointers that follow kwlist, one per parameter. format: O (PyObject **, borrowed), p (int *,
 * truth), d (double *), i (int *), '|' (the rest optional: left as they are when not given),
 * '$' (the rest keyword-only), ':name' (for the messages); kwlist names every parameter,
 * NULL-terminated. The same TypeErrors for too many, missing, unknown or repeated arguments.
 * 0, or -1 with the exception set. Why not PyArg_ParseTupleAndKeywords: with METH_KEYWORDS,
 * CPython builds a tuple and a dict for each call, and the parser a str for each name it looks
 * up: half of a small GEMM's call cost. */
int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *format,
               const char *const *kwlist, ...);
/* The flags and the cast of a function parse_args parses for */
#define FASTKW (METH_FASTCALL | METH_KEYWORDS)
#define FASTFN(f) ((PyCFunction)(void (*)(void))(f))

/* 0 when v is finite, else -1 + "name must be finite, got v". */
int check_finite(double v, const char *name);
/* grad_scale argument: None (or NULL) -> 1/B; else a finite float. */
int get_grad_scale(PyObject *obj, npy_intp B, double *out);
/* start/stop arguments: a half-open element range inside [0, n] (None: 0 and n). */
int get_range(PyObject *starto, PyObject *stopo, npy_intp n, ptrdiff_t *start, ptrdiff_t *stop);

/* ------------------------------------------------------------------ Context, the GIL */

/* A Context: threads and GEMM packing buffers the kernels reuse between calls (its type and
 * methods: mod_context.c). */
typedef struct {
    PyObject_HEAD
    dp_ctx ctx;
    dp_scratch col; /* the convolution kernels' im2col buffer */
    PyThread_type_lock lock;
    int ready;
} ContextObject;

/* ctx argument of a module-level function: None (or NULL) -> *out = NULL (the GEMMs then use
 * the calling thread's context, dp_ctx_default); else an initialized Context of this module.
 * A context whose GEMMs take bfloat16 inputs is refused for float64 arrays (ref, named
 * ref_name): it would silently compute in full precision. */
int get_ctx(PyObject *module, PyObject *obj, PyArrayObject *ref, const char *ref_name,
            ContextObject **out);
/* The threads of a kernel that takes no packing buffers (sgd_step, zero_): a Context's, or a
 * Model's (the team that computed its gradient), with the object's lock; None (or NULL): no
 * team, no lock. Anything else is a TypeError naming its type, one of these whose __init__
 * failed a RuntimeError. (mod_context.c) */
int get_team(PyObject *module, PyObject *obj, dp_threads **team, PyThread_type_lock *lock);
/* A Model's team and lock into *team and *lock; 0 (and nothing written) when the Model is
 * not initialized, else 1. (mod_model.c, which knows the object) */
int model_team(PyObject *model, dp_threads **team, PyThread_type_lock *lock);
/* gemm_inputs=... of Context and Model: None or the params' dtype name -> 0; "bfloat16" ->
 * 1 (refused, naming the dtype, unless f32 is 1 or -1: not known yet). */
int parse_gemm_inputs(PyObject *obj, int f32, int *bf16);

/* Runs stmt with the GIL released, holding `lock` (a PyThread lock, or NULL for none). */
#define WITHOUT_GIL_LOCKED(lock, stmt)                                         \
    do {                                                                       \
        PyThread_type_lock lk_ = (lock);                                       \
        Py_BEGIN_ALLOW_THREADS if (lk_) PyThread_acquire_lock(lk_, WAIT_LOCK); \
        stmt;                                                                  \
        if (lk_) PyThread_release_lock(lk_);                                   \
        Py_END_ALLOW_THREADS                                                   \
    } while (0)
#define WITHOUT_GIL(stmt) WITHOUT_GIL_LOCKED(NULL, stmt)
#define CTX_LOCK(cobj) ((cobj) ? (cobj)->lock : NULL)

/* ------------------------------------------------------------------ the pieces of the module */

/* Module-level functions, added by module.c's exec slot (PyModule_AddFunctions). */
extern PyMethodDef mod_kernels_functions[];
extern PyMethodDef mod_build_functions[]; /* mod_build.c: the build and the CPU */
extern PyMethodDef mod_model_functions[]; /* mod_model.c: model_plan */
extern PyMethodDef mod_group_functions[]; /* mod_group.c: the control-block functions */
extern PyMethodDef mod_guard_functions[]; /* mod_guard.c: a truncated mapped file, a deadline */
/* DPTRAIN_ISA, read once at import: selects the kernels' ISA; -1 with ValueError when it names
 * no ISA or one the CPU lacks (the import fails with that message). */
int mod_isa_from_env(void); /* mod_build.c */

/* Type specs, built by module.c's exec slot (PyType_FromModuleAndSpec) into core_state. */
extern PyType_Spec mod_context_spec;  /* mod_context.c */
extern PyType_Spec mod_model_spec;    /* mod_model.c */
extern PyType_Spec mod_shmgroup_spec; /* mod_group.c */

#endif
