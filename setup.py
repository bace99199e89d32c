"""Build the C extension dptrain._core.

Only what cannot be static lives here: the NumPy include directory and the compiler flags.
No BLAS or system library is needed; SIMD code paths are chosen at run time (csrc/dp_gemm.c),
so the wheel is portable and no flag is asked of the user.
"""
import sys
from pathlib import Path

import numpy as np
from setuptools import Extension, setup

# The bindings (the only files that include Python.h and NumPy), then the plain-C kernels.
sources = [
    "csrc/module.c",
    "csrc/mod_common.c",
    "csrc/mod_kernels.c",
    "csrc/mod_context.c",
    "csrc/mod_network.c",
    "csrc/mod_group.c",
    "csrc/dp_common.c",
    "csrc/dp_gemm.c",
    "csrc/dp_conv.c",
    "csrc/dp_cpu.c",
    "csrc/dp_dense.c",
    "csrc/dp_act.c",
    "csrc/dp_loss.c",
    "csrc/dp_sgd.c",
    "csrc/dp_buffers.c",
    "csrc/dp_threads.c",
    "csrc/dp_sync.c",
    "csrc/dp_model.c",
    "csrc/dp_vec_avx2.c",
    "csrc/dp_vec_avx512.c",
]

# Headers and templates: listed so that a change to one rebuilds the extension.
depends = sorted(str(p) for p in Path("csrc").glob("*.h"))

extra_compile_args = []
extra_link_args = []
if sys.platform != "win32":
    # gnu11 (not c11): GNU vector extensions and target attributes; fp-contract lets the
    # compiler fuse multiply-adds in the generic kernels.
    extra_compile_args = ["-std=gnu11", "-O3", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
                          "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-psabi",
                          # -Wextra as csrc/tests builds the kernels; a binding's self, closure
                          # or unused argument is CPython's fixed signature (as CPython's own
                          # build, which passes -Wno-unused-parameter too)
                          "-Wextra", "-Wno-unused-parameter",
                          # only PyInit__core leaves the shared object: the helpers the files
                          # share (mod_common.h) and the kernels stay internal
                          "-fvisibility=hidden"]
    extra_link_args = ["-pthread"]

setup(
    ext_modules=[
        Extension(
            "dptrain._core",
            sources=sources,
            depends=depends,
            include_dirs=[np.get_include(), "csrc"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_25_API_VERSION"),
                           ("NPY_TARGET_VERSION", "NPY_1_25_API_VERSION")],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
)
