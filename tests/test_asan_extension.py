"""The Python-level boundary tests run again against the extension built with
AddressSanitizer and UndefinedBehaviorSanitizer (libasan preloaded into this interpreter,
leak detection off: CPython itself is not instrumented), so that a use after free or a heap
overflow at the C boundary fails a test instead of passing by luck."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the boundary's tests: every entry point with bad, aliased and changed arguments (in each
# family's test file: the table-driven checks of _core_helpers.family_tests and the family's
# own, selected by BOUNDARY_CHECKS), the binding layer's (test_boundary.py), and the
# memory-safety regressions (the fuzzer's CI batch joins them where it is present)
BOUNDARY_TESTS = ["tests/test_memory_safety.py", "tests/test_boundary.py",
                  "tests/test_fuzz_core.py", "tests/test_gemm.py", "tests/test_dense.py",
                  "tests/test_act.py", "tests/test_loss.py", "tests/test_sgd.py",
                  "tests/test_buffers.py", "tests/test_context.py", "tests/test_model_core.py",
                  "tests/test_conv.py"]
BOUNDARY_CHECKS = [
    # whole files
    "test_memory_safety", "test_boundary", "test_fuzz_core",
    # _core_helpers.family_tests
    "test_valid_call_table_works", "test_non_float_dtype_rejected",
    "test_mixed_float32_float64_rejected", "test_wrong_ndim_rejected",
    "test_wrong_shape_message_names_argument_and_both_shapes", "test_wrong_1d_shape_message",
    "test_strided_rejected", "test_transposed_rejected", "test_read_only_output_rejected",
    "test_output_aliasing_an_input_rejected", "test_non_finite_scalar_rejected",
    "test_arguments_by_name_or_position_agree", "test_list_instead_of_ndarray_rejected",
    "test_none_instead_of_ndarray_rejected", "test_inputs_not_modified",
    "test_no_reference_leaks_on_success", "test_no_reference_leaks_on_error",
    "test_error_messages_do_not_leak_objects", "test_kernel_releases_the_gil",
    # the families' own
    "test_labels_must_be_int64", "test_argmax_out_must_be_int64",
    "test_gemm_transposed_shape_message", "test_column_slice_and_transpose_rejected",
    "test_slices_that_stay_contiguous_are_accepted", "test_read_only_inputs_are_accepted",
    "test_allowed_in_place_calls", "test_softmax_xent_dlogits_is_logits_is_refused_or_correct",
    "test_sigmoid_bce_dlogits_is_logits_is_refused_or_correct",
    "test_labels_out_of_range_named_by_index_and_value", "test_count_correct_labels_out_of_range",
    "test_sgd_step_scalar_rules", "test_ranges_outside_the_buffer_rejected",
    "test_bad_scalar_types_rejected", "test_context_arguments_rejected",
    "test_model_rejects_bad_construction", "test_model_rejects_bad_batches",
    "test_model_labels_out_of_range_named_and_grads_untouched",
    "test_model_does_not_modify_inputs", "test_model_init_twice_rejected",
    "test_model_no_reference_leaks", "test_model_failed_init_holds_nothing",
    "test_context_objects_are_freed", "test_two_threads_own_arrays_match_sequential",
    "test_two_threads_sharing_one_model", "test_two_threads_sharing_one_context",
    "test_fresh_thread_pool_used_at_once_does_not_deadlock",
]


def _runtime(name: str) -> str | None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and Path(path).is_file() else None


pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(not (ROOT / "setup.py").is_file() or not (ROOT / "csrc").is_dir(),
                       reason=f"no C sources at {ROOT} (installed package only)"),
    pytest.mark.skipif(sys.platform != "linux" or _runtime("libasan.so") is None,
                       reason="needs Linux and a C compiler with libasan"),
]


def _asan_build_and_run(workdir, run) -> dict:
    """The background job (conftest): a copy of the dptrain package whose _core is built with
    ASan + UBSan, then the boundary's tests run against it (libasan preloaded). Returns each
    step's CompletedProcess ('build', 'probe', 'tests') and the package's directory."""
    lib = workdir / "asan-lib"
    flags = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    env = dict(os.environ, CFLAGS=flags, LDFLAGS="-fsanitize=address,undefined")
    steps = {"lib": lib}
    steps["build"] = run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", lib,
                          "--build-temp", workdir / "asan-tmp"], cwd=ROOT, env=env, timeout=900)
    if steps["build"].returncode != 0:
        return steps
    for source in (ROOT / "dptrain").rglob("*.py"):      # the package's modules, subpackages too
        target = lib / "dptrain" / source.relative_to(ROOT / "dptrain")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    preload = ":".join(p for p in (_runtime("libasan.so"), _runtime("libubsan.so")) if p)
    env = dict(os.environ, PYTHONPATH=str(lib), LD_PRELOAD=preload,
               ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    steps["probe"] = run([sys.executable, "-c", "import dptrain; print(dptrain._core.__file__)"],
                         cwd=lib, env=env, timeout=120)
    tests = [str(ROOT / t) for t in BOUNDARY_TESTS if (ROOT / t).is_file()]
    # --capture=sys: a sanitizer writes its report to fd 2 and exits; captured at the fd level
    # the report would be lost with the process
    steps["tests"] = run([sys.executable, "-m", "pytest", "-q", "--capture=sys", "-p",
                          "no:cacheprovider", "--rootdir", ROOT, "-c", ROOT / "pyproject.toml",
                          "-k", " or ".join(BOUNDARY_CHECKS), *tests], cwd=lib, env=env,
                         timeout=1800)
    return steps


@pytest.mark.background.with_args(_asan_build_and_run)
def test_the_boundary_tests_pass_under_asan(background):
    build = background["build"]
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    probe = background["probe"]
    assert probe.returncode == 0, probe.stderr
    # the ASan build
    assert probe.stdout.strip().startswith(str(background["lib"])), probe.stdout
    r = background["tests"]
    out = r.stdout + r.stderr
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-8000:]
    assert r.returncode == 0, out[-8000:]
