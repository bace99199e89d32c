/* mod_build.c - the module-level functions of dptrain._core that describe or choose the
 * build and the CPU the kernels run on: build_info, cpu_features, fma_peak (dp_cpu.h), isa and
 * set_isa (the vector kernels' and the GEMM's ISA, dp_cpu.h), set_bf16_dot and set_bf16_amx
 * (the bfloat16 GEMM's paths, dp_gemm.h), and DPTRAIN_ISA read at import (mod_isa_from_env).
 * Each follows the recipe of mod_common.h; the contract is in docs/core_api.md.
 * Leaves out on purpose: the kernels' bindings (mod_kernels.c).
 */
#include "mod_common.h"

#include <stdlib.h>
#include <string.h>

#include "dp_cpu.h"
#include "dp_gemm.h"

/* ------------------------------------------------------------------ CPU features and FMA peak */
static PyObject *py_cpu_features(PyObject *module, PyObject *unused)
{
    dp_cpu_features f;
    dp_cpu_detect(&f);
#define FLAG(x) (f.x ? Py_True : Py_False)
    return Py_BuildValue("{s:s,s:s,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:s}", "vendor",
                         f.vendor, "brand", f.brand, "avx", FLAG(avx), "fma", FLAG(fma), "avx2",
                         FLAG(avx2), "avx512f", FLAG(avx512f), "avx512bw", FLAG(avx512bw),
                         "avx512vl", FLAG(avx512vl), "avx512dq", FLAG(avx512dq), "avx512_vnni",
                         FLAG(avx512_vnni), "avx512_bf16", FLAG(avx512_bf16), "amx_tile",
                         FLAG(amx_tile), "amx_bf16", FLAG(amx_bf16), "widest_fma",
                         dp_isa_name(dp_cpu_widest_isa(&f)));
#undef FLAG
}

/* ValueError: the CPU (or this build) lacks `isa`; names what it needs and what there is.
 * `what` names the argument, and prefixes the message unless it is plain "isa". */
static PyObject *isa_unavailable(const char *what, int isa, const dp_cpu_features *f)
{
    int named = strcmp(what, "isa") != 0;
    char have[64] = "";
    for (int i = 0; i < DP_ISA_COUNT; i++)
        if (dp_cpu_has_isa(f, i))
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", *have ? ", " : "",
                     dp_isa_name(i));
    const char *needs =
        isa == DP_ISA_AVX512
            ? "avx512f, avx512bw, avx512vl and avx512dq with the OS saving the ZMM state"
            : "avx2 and fma with the OS saving the YMM state";
    return PyErr_Format(PyExc_ValueError,
                        "%s%sisa '%s' is not available on this CPU (%s, %s): it needs %s "
                        "(available here: %s)",
                        named ? what : "", named ? ": " : "", dp_isa_name(isa),
                        *f->vendor ? f->vendor : "unknown vendor",
                        *f->brand ? f->brand : "unknown model", needs, have);
}

/* The DP_ISA_* that `name` ("widest" or an ISA name) asks for; -1 with ValueError (`what`
 * names the argument) for an unknown name or an ISA the CPU lacks. */
static int isa_from_arg(const char *name, const char *what)
{
    dp_cpu_features f;
    dp_cpu_detect(&f);
    int isa = strcmp(name, "widest") == 0 ? dp_cpu_widest_isa(&f) : dp_isa_from_name(name);
    if (isa < 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be 'widest', 'avx512', 'avx2' or 'generic', got '%s'", what, name);
        return -1;
    }
    if (!dp_cpu_has_isa(&f, isa)) {
        isa_unavailable(what, isa, &f);
        return -1;
    }
    return isa;
}

static PyObject *py_isa(PyObject *module, PyObject *unused)
{ return PyUnicode_FromString(dp_isa_name(dp_isa_active())); }

static PyObject *py_set_isa(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"isa", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s:set_isa", kwlist, &name)) return NULL;
    int isa = isa_from_arg(name, "isa");
    if (isa < 0) return NULL;
    const char *previous = dp_isa_name(dp_isa_active());
    if (dp_isa_select(isa) != DP_OK) return raise_code(DP_ENOTSUP, "set_isa");
    return PyUnicode_FromString(previous);
}

/* A bfloat16 path's setting as Python: None (auto), True, False */
static PyObject *bf16_path_setting_obj(int mode)
{
    if (mode == DP_BF16_DOT_AUTO) Py_RETURN_NONE;
    return PyBool_FromLong(mode);
}

/* set_bf16_dot / set_bf16_amx's argument: True, False or None -> 1, 0, DP_BF16_DOT_AUTO;
 * -2 with a TypeError set */
static int bf16_path_mode(const char *fname, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"on", NULL};
    char format[48];
    PyObject *on_obj;
    snprintf(format, sizeof format, "O:%s", fname);
    if (!PyArg_ParseTupleAndKeywords(args, kwds, format, kwlist, &on_obj)) return -2;
    if (on_obj == Py_None) return DP_BF16_DOT_AUTO;
    if (!PyBool_Check(on_obj)) {
        PyErr_Format(PyExc_TypeError, "%s: on must be True, False or None (auto), got %s", fname,
                     Py_TYPE(on_obj)->tp_name);
        return -2;
    }
    return on_obj == Py_True;
}

/* The CPU's name for the refusals */
static const char *cpu_name(const dp_cpu_features *f)
{ return f->brand[0] ? f->brand : f->vendor[0] ? f->vendor : "unknown"; }

static PyObject *py_set_bf16_dot(PyObject *module, PyObject *args, PyObject *kwds)
{
    int mode = bf16_path_mode("set_bf16_dot", args, kwds);
    if (mode == -2) return NULL;
    if (mode == 1 && !dp_gemm_bf16_dot_available()) {
        dp_cpu_features f;
        dp_cpu_detect(&f);
        return PyErr_Format(PyExc_ValueError,
                            "set_bf16_dot(True): the bfloat16 dot-product path needs AVX512_BF16 "
                            "(and AVX-512), which this CPU (%s) lacks",
                            cpu_name(&f));
    }
    PyObject *previous = bf16_path_setting_obj(dp_gemm_bf16_dot_setting());
    if (previous) dp_gemm_set_bf16_dot(mode);
    return previous;
}

static PyObject *py_set_bf16_amx(PyObject *module, PyObject *args, PyObject *kwds)
{
    int mode = bf16_path_mode("set_bf16_amx", args, kwds);
    if (mode == -2) return NULL;
    if (mode == 1 && !dp_gemm_bf16_amx_available()) {
        dp_cpu_features f;
        dp_cpu_detect(&f);
        return PyErr_Format(PyExc_ValueError,
                            "set_bf16_amx(True): the AMX path cannot run here (CPU: %s): %s",
                            cpu_name(&f), dp_gemm_bf16_amx_why());
    }
    PyObject *previous = bf16_path_setting_obj(dp_gemm_bf16_amx_setting());
    if (previous) dp_gemm_set_bf16_amx(mode);
    return previous;
}

int mod_isa_from_env(void)
{
    const char *name = getenv("DPTRAIN_ISA");
    if (!name || !*name) return 0;
    int isa = isa_from_arg(name, "environment variable DPTRAIN_ISA");
    if (isa < 0) return -1;
    return dp_isa_select(isa) == DP_OK ? 0 : (raise_code(DP_ENOTSUP, "DPTRAIN_ISA"), -1);
}

static PyObject *py_fma_peak(PyObject *module, PyObject *args, PyObject *kwds)
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
        PyErr_Format(PyExc_ValueError, "dtype must be float32 or float64, got %R",
                     (PyObject *)descr);
        Py_XDECREF(descr);
        return NULL;
    }
    Py_XDECREF(descr);
    if (!(seconds > 0.0 && seconds <= 60.0)) { /* false for NaN */
        char b[64];
        return PyErr_Format(PyExc_ValueError, "seconds must be a finite number in (0, 60], got %s",
                            double_repr(b, sizeof b, seconds));
    }
    dp_cpu_features f;
    dp_cpu_detect(&f);
    int isa = isa_from_arg(isa_name, "isa");
    if (isa < 0) return NULL;
    double gflops = 0.0;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = typenum == NPY_FLOAT32 ? dp_fma_peak_f32(isa, seconds, &gflops)
                                                       : dp_fma_peak_f64(isa, seconds, &gflops);
    Py_END_ALLOW_THREADS if (rc == DP_ENOTSUP) return isa_unavailable("isa", isa, &f);
    if (rc) return raise_code(rc, "fma_peak");
    return PyFloat_FromDouble(gflops);
}

/* ------------------------------------------------------------------ build info */

static PyObject *py_build_info(PyObject *module, PyObject *unused)
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
#ifdef NPY_FEATURE_VERSION_STRING /* NumPy >= 2 headers */
    const char *numpy_api = NPY_FEATURE_VERSION_STRING;
#else /* NumPy 1.x headers: the C API version, in hex */
    char numpy_api[32];
    snprintf(numpy_api, sizeof numpy_api, "C API 0x%x", (unsigned)NPY_FEATURE_VERSION);
#endif
    dp_cpu_features f;
    dp_cpu_detect(&f);
    PyObject *have = PyList_New(0);
    for (int i = 0; have && i < DP_ISA_COUNT; i++) {
        if (!dp_cpu_has_isa(&f, i)) continue;
        PyObject *name = PyUnicode_FromString(dp_isa_name(i));
        if (!name || PyList_Append(have, name) < 0) Py_CLEAR(have);
        Py_XDECREF(name);
    }
    if (!have) return NULL;
    /* the dot path's measured gain (measured at the first ask: about 12 ms, without the GIL) */
    double ratio;
    Py_BEGIN_ALLOW_THREADS ratio = dp_gemm_bf16_dot_ratio();
    Py_END_ALLOW_THREADS int amx_available = dp_gemm_bf16_amx_available(), amx = dp_gemm_bf16_amx();
    PyObject *dot_ratio = ratio >= 0 ? PyFloat_FromDouble(ratio) : (Py_INCREF(Py_None), Py_None);
    if (!dot_ratio) {
        Py_DECREF(have);
        return NULL;
    }
    return Py_BuildValue(
        "{s:s,s:N,s:s,s:s,s:(ss),s:s,s:N,s:O,s:z,s:s,s:O,s:i,s:{s:(iiiii),s:(iiiii)},s:s}", "isa",
        dp_isa_name(dp_isa_active()), "isas_available", have, "simd", dp_gemm_isa(), "compiler",
        compiler, "dtypes", "float32", "float64",
        /* dp_ctx.bf16_inputs: how a bfloat16 (mixed precision) GEMM is computed here */
        "bfloat16_gemm",
        amx                  ? dp_gemm_bf16_amx_name()
        : dp_gemm_bf16_dot() ? dp_gemm_bf16_dot_name()
                             : "inputs rounded to bfloat16 while packed, float32 micro-kernel",
        "bfloat16_dot_vs_fma", dot_ratio,
        /* the AMX path: whether this process can run it, and why not */
        "bfloat16_amx", amx_available ? Py_True : Py_False, "bfloat16_amx_why",
        dp_gemm_bf16_amx_why(), "threads", threads, "openmp", Py_False, "max_threads",
        DP_MAX_THREADS, "gemm_blocking_mr_nr_kc_mc_nc", "float32", mr32, nr32, kc32, mc32, nc32,
        "float64", mr64, nr64, kc64, mc64, nc64, "numpy_build_api", numpy_api);
}

/* ------------------------------------------------------------------ the functions */

#define KW (METH_VARARGS | METH_KEYWORDS)
#define FN(f) ((PyCFunction)(void (*)(void))(f))

PyMethodDef mod_build_functions[] = {
    {"cpu_features", py_cpu_features, METH_NOARGS,
     "cpu_features() -> dict: vendor, brand, the x86 vector flags the CPU has and the OS enables "
     "(avx, fma, avx2, avx512f/bw/vl/dq, avx512_vnni, avx512_bf16, amx_tile, amx_bf16), "
     "widest_fma"},
    {"isa", py_isa, METH_NOARGS,
     "isa() -> str: the ISA the kernels run now ('generic', 'avx2' or 'avx512'): the widest this "
     "CPU has, unless DPTRAIN_ISA or set_isa chose another"},
    {"set_bf16_amx", FN(py_set_bf16_amx), KW,
     "set_bf16_amx(on) -> previous: whether GEMMs with bfloat16 inputs run on Intel AMX's tiles "
     "(tdpbf16ps) where this process can (AMX-BF16, Linux lending the tile state, the avx512 ISA "
     "active): True or None (the default) wherever it can, False never (then set_bf16_dot's path). "
     "AMX sums keep more precision inside an instruction than float32's one-by-one rounding: its "
     "results are within float32's bound of the rounding path's, not its bits, and reproducible "
     "for the same shapes; it reads denormal inputs as 0. Returns the previous setting. ValueError "
     "for True where it cannot run, saying why (build_info()['bfloat16_amx_why']). For tests and "
     "benchmarks: not while kernels run in other threads"},
    {"set_bf16_dot", FN(py_set_bf16_dot), KW,
     "set_bf16_dot(on) -> previous: which path GEMMs with bfloat16 inputs take where the CPU has "
     "AVX512_BF16 and the avx512 ISA is active: True the vdpbf16ps micro-kernel, False the "
     "rounding path (inputs rounded while packed, float32 micro-kernel; the same numbers except "
     "denormals, which vdpbf16ps reads as 0), None (the default) vdpbf16ps where it was measured "
     "to do >= 1.2x the float32 FMA's flop here (build_info()['bfloat16_dot_vs_fma']; "
     "build_info()['bfloat16_gemm'] says which path runs). Returns the previous setting. "
     "ValueError for True where the CPU lacks AVX512_BF16. For tests and benchmarks: not while "
     "kernels run in other threads"},
    {"set_isa", FN(py_set_isa), KW,
     "set_isa(isa) -> str: makes isa ('widest', 'avx512', 'avx2' or 'generic') the kernels' ISA "
     "from the next call on and returns the previous one; ValueError where the CPU lacks it. For "
     "start-up, tests and benchmarks: not while kernels run in other threads"},
    {"fma_peak", FN(py_fma_peak), KW,
     "fma_peak(isa='widest', dtype='float32', seconds=0.2) -> GFLOP/s of one thread's FMA loop "
     "('widest', 'avx512', 'avx2', 'generic'); ValueError where the CPU lacks the isa"},
    {"build_info", py_build_info, METH_NOARGS,
     "build_info() -> dict describing this build: isa (the kernels' ISA now), isas_available (this "
     "CPU's), simd (the GEMM's build), compiler, dtypes, threads, the GEMM's blocking, the NumPy "
     "API built against"},
    {NULL},
};
