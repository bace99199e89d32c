/* module.c - the module dptrain._core: its state, its multi-phase initialization, and the
 * assembly of the pieces the mod_*.c files define (see mod_common.h for the file map).
 *
 * Built as CPython's Modules/xxlimited.c builds a module: no static type object and no
 * file-scope exception. The exec slot creates the heap types (PyType_FromModuleAndSpec, so a
 * method reaches the module state through its type) and the exception, keeps them in the
 * module state, and adds them and the functions to the module; traverse/clear/free let the
 * garbage collector see and break the module <-> type references.
 */
#define MOD_IMPORTS_NUMPY /* this file defines the NumPy C-API table the others use */
#include "mod_common.h"

static int core_exec(PyObject *m)
{
    core_state *st = module_state(m);
    import_array1(-1);
    if (mod_isa_from_env() < 0) return -1;
    st->group_aborted = PyErr_NewExceptionWithDoc(
        "dptrain._core.GroupAborted",
        "A worker of a shared-memory group aborted it; args are (message, code).",
        PyExc_RuntimeError, NULL);
    if (!st->group_aborted || PyModule_AddObjectRef(m, "GroupAborted", st->group_aborted) < 0)
        return -1;
    struct {
        PyTypeObject **slot;
        PyType_Spec *spec;
    } types[] = {
        {&st->context_type, &mod_context_spec},
        {&st->model_type, &mod_model_spec},
        {&st->shmgroup_type, &mod_shmgroup_spec},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, types[i].spec, NULL);
        if (!*types[i].slot || PyModule_AddType(m, *types[i].slot) < 0) return -1;
    }
    PyMethodDef *functions[] = {mod_kernels_functions, mod_build_functions, mod_model_functions,
                                mod_group_functions, mod_guard_functions};
    for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++)
        if (PyModule_AddFunctions(m, functions[i]) < 0) return -1;
    return 0;
}

static int core_traverse(PyObject *m, visitproc visit, void *arg)
{
    core_state *st = module_state(m);
    Py_VISIT(st->context_type);
    Py_VISIT(st->model_type);
    Py_VISIT(st->shmgroup_type);
    Py_VISIT(st->group_aborted);
    return 0;
}

static int core_clear(PyObject *m)
{
    core_state *st = module_state(m);
    Py_CLEAR(st->context_type);
    Py_CLEAR(st->model_type);
    Py_CLEAR(st->shmgroup_type);
    Py_CLEAR(st->group_aborted);
    return 0;
}

static void core_free(void *m) { core_clear((PyObject *)m); }

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dptrain._core",
    .m_doc = "The C core of dptrain: GEMM, layer, convolution, loss, optimizer and buffer kernels "
             "(see docs/core_api.md).",
    .m_size = sizeof(core_state),
    .m_methods = NULL, /* added by core_exec from the mod_*.c pieces */
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&core_module); }
