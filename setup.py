"""Build the C extension dptrain._core.

Only what cannot be static lives here: the NumPy include directory and the compiler flags.
No BLAS or system library is needed; SIMD code paths are chosen at run time (csrc/dp_gemm.c),
so the wheel is portable and no flag is asked of the user.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The bindings (the only files that include Python.h and NumPy), then the plain-C kernels.
sources = [
    "csrc/module.c",
    "csrc/mod_common.c",
    "csrc/mod_kernels.c",
    "csrc/mod_build.c",
    "csrc/mod_context.c",
    "csrc/mod_model.c",
    "csrc/mod_group.c",
    "csrc/mod_guard.c",
    "csrc/dp_common.c",
    "csrc/dp_gemm.c",
    "csrc/dp_gemm_gemv.c",
    "csrc/dp_conv.c",
    "csrc/dp_pool.c",
    "csrc/dp_layers.c",
    "csrc/dp_cpu.c",
    "csrc/dp_dense.c",
    "csrc/dp_act.c",
    "csrc/dp_loss.c",
    "csrc/dp_sgd.c",
    "csrc/dp_adam.c",
    "csrc/dp_buffers.c",
    "csrc/dp_allreduce.c",
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


def optimization() -> list:
    """-O3, unless $CFLAGS names a level (-O0 -g to debug, -O1 for a sanitizer build, as
    tests/test_asan_extension's): distutils puts $CFLAGS before these flags, where -O3 would
    override the user's."""
    return [] if re.search(r"(^|\s)-O", os.environ.get("CFLAGS", "")) else ["-O3"]


if sys.platform != "win32":
    # gnu11 (not c11): GNU vector extensions and target attributes; fp-contract lets the
    # compiler fuse multiply-adds in the generic kernels.
    extra_compile_args = [
        "-std=gnu11",
        *optimization(),
        "-ffp-contract=fast",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-pthread",
        "-Wall",
        "-Wno-unknown-pragmas",
        "-Wno-psabi",
        # -Wextra as csrc/tests builds the kernels; a binding's self, closure
        # or unused argument is CPython's fixed signature (as CPython's own
        # build, which passes -Wno-unused-parameter too)
        "-Wextra",
        "-Wno-unused-parameter",
        # only PyInit__core leaves the shared object: the helpers the files
        # share (mod_common.h) and the kernels stay internal
        "-fvisibility=hidden",
    ]
    extra_link_args = ["-pthread"]


def build_jobs() -> int:
    """Compiler processes at once: DPTRAIN_BUILD_JOBS, else one per CPU this process may run
    on (its affinity, not the host's count: a container limited to 2 CPUs of 64), at most 8."""
    value = os.environ.get("DPTRAIN_BUILD_JOBS", "").strip()
    if not value:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, min(8, cpus or 1))
    if not value.isdigit() or int(value) < 1:
        sys.exit(f"setup.py: DPTRAIN_BUILD_JOBS must be a whole number >= 1, got {value!r}")
    return int(value)


class ObjectCache:
    """Object files kept in build/objcache/ by what made them, so that a build of the same
    sources with the same compiler and flags copies them instead of compiling again (pip's
    editable install builds afresh each time it runs: the README's two set-up commands build
    the same extension twice). The key: the compiler and its version, every flag (the NumPy
    include directory, which an isolated build environment names anew each time, by NumPy's
    version instead), the Python it builds for, the source and every csrc/ header (a template
    is included by many sources). DPTRAIN_BUILD_CACHE=0 turns it off."""

    KEEP = 3  # objects kept per source (older ones are removed)

    def __init__(self, compiler):
        self.dir = Path(__file__).resolve().parent / "build" / "objcache"
        self.on = os.environ.get("DPTRAIN_BUILD_CACHE", "1") != "0"
        cc = list(compiler.compiler_so)
        try:
            version = subprocess.run(
                [cc[0], "--version"], capture_output=True, text=True, timeout=30
            ).stdout
        except OSError:
            self.on = False
            return
        headers = b"".join(p.read_bytes() for p in sorted(Path("csrc").glob("*.h")))
        base = hashlib.sha256()
        for part in (repr(cc), version, sys.version, np.__version__):
            base.update(part.encode())
        base.update(headers)
        self.base = base

    def key(self, src: str, args: list) -> str:
        if not self.on:
            return ""
        h = self.base.copy()
        numpy_include = np.get_include()
        h.update(repr([a.replace(numpy_include, "<numpy>") for a in args]).encode())
        h.update(Path(src).read_bytes())
        return h.hexdigest()[:24]

    def _path(self, key: str, src: str) -> Path:
        return self.dir / f"{Path(src).stem}-{key}.o"

    def fetch(self, key: str, src: str, obj: str) -> bool:
        if not key or not self._path(key, src).is_file():
            return False
        os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
        shutil.copyfile(self._path(key, src), obj)
        return True

    def store(self, key: str, src: str, obj: str) -> None:
        if not key:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self._path(key, src).with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(obj, tmp)
            os.replace(tmp, self._path(key, src))
            kept = sorted(self.dir.glob(f"{Path(src).stem}-*.o"), key=os.path.getmtime)
            for old in kept[: -self.KEEP]:
                old.unlink(missing_ok=True)
        except OSError:  # a read-only checkout builds all the same
            pass


class ParallelBuildExt(build_ext):
    """build_ext compiling one extension's C files in parallel (setuptools' own -j runs
    extensions, not files, at once; this package has one of 20 files, 24 s one after another
    on 2 cores, 15 s two at a time). The compiler's compile() as distutils writes it, with its
    per-file step mapped over a thread pool (each runs a compiler process); where a setuptools
    compiles otherwise (MSVC overrides compile() itself, and the base _compile is a no-op), the
    files compile one after another."""

    @staticmethod
    def per_file_compiler(compiler) -> bool:
        """True where compile() is distutils' generic one and _compile, its per-file step, is
        the compiler class's own (Unix compilers), not the base's no-op."""

        def owner(name):
            return next((k for k in type(compiler).__mro__ if name in vars(k)), None)

        generic, step = owner("compile"), owner("_compile")
        return (
            generic is not None
            and step is not None
            and step is not generic
            and issubclass(step, generic)
            and hasattr(compiler, "_setup_compile")
            and hasattr(compiler, "_get_cc_args")
        )

    def build_extension(self, ext):
        compiler, jobs = self.compiler, build_jobs()
        if not self.per_file_compiler(compiler):
            return super().build_extension(ext)
        serial = compiler.compile
        cache = ObjectCache(compiler)

        def compile(
            sources,
            output_dir=None,
            macros=None,
            include_dirs=None,
            debug=False,
            extra_preargs=None,
            extra_postargs=None,
            depends=None,
        ):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs
            )
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj):
                src, src_ext = build[obj]
                key = cache.key(src, cc_args + extra_postargs + pp_opts)
                if not cache.fetch(key, src, obj):
                    compiler._compile(obj, src, src_ext, cc_args, extra_postargs, pp_opts)
                    cache.store(key, src, obj)

            with ThreadPoolExecutor(jobs) as pool:
                list(pool.map(one, [obj for obj in objects if obj in build]))  # re-raises
            return objects

        compiler.compile = compile
        try:
            return super().build_extension(ext)
        finally:
            compiler.compile = serial


setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=[
        Extension(
            "dptrain._core",
            sources=sources,
            depends=depends,
            include_dirs=[np.get_include(), "csrc"],
            define_macros=[
                ("NPY_NO_DEPRECATED_API", "NPY_1_25_API_VERSION"),
                ("NPY_TARGET_VERSION", "NPY_1_25_API_VERSION"),
            ],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
)
