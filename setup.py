"""Build the C extension dptrain._core.

Only what cannot be static lives here: the NumPy include directory and the compiler flags.
No BLAS or system library is needed; SIMD code paths are chosen at run time (csrc/dp_gemm.c),
so the wheel is portable and no flag is asked of the user.
"""
import sys
from pathlib import Path

import numpy as np
from setuptools import Extension, setup

sources = [
    "csrc/module.c",
    "csrc/dp_gemm.c",
    "csrc/dp_conv.c",
    "csrc/dp_cpu.c",
    "csrc/dp_cnn.c",
    "csrc/dp_kernels.c",
    "csrc/dp_net.c",
    "csrc/dp_pool.c",
    "csrc/dp_sync.c",
    "csrc/dp_act.c", "csrc/dp_model.c",
]

# Headers and templates: listed so that a change to one rebuilds the extension.
depends = sorted(str(p) for p in Path("csrc").glob("*.h"))

extra_compile_args = []
extra_link_args = []
if sys.platform != "win32":
    # gnu11 (not c11): GNU vector extensions and target attributes; fp-contract lets the
    # compiler fuse multiply-adds in the generic kernels.
    extra_compile_args = ["-std=gnu11", "-O3", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
                          "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-psabi"]
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
