"""The C boundary under the fuzzer (tests/fuzz_core.py): a bounded run in CI.

Every public callable of dptrain._core is called with hostile arguments and random method
sequences, in child processes (the same interpreter and environment: run pytest with an
LD_PRELOAD of libasan and the children are sanitized too); a crash, a hang, a wrong result
or a wrong exception fails the test, and the report names the case to replay:
`python tests/fuzz_core.py --seed S --replay CASE -v`.

DPTRAIN_FUZZ_CALLS / DPTRAIN_FUZZ_SEED / DPTRAIN_FUZZ_JOBS / DPTRAIN_FUZZ_HANG_S resize the
run (a sanitized build is slower: give it a longer hang timeout). Under AddressSanitizer, with
the extension built by `CFLAGS="-fsanitize=address -fno-omit-frame-pointer"
LDFLAGS=-fsanitize=address python setup.py build_ext --inplace`:

    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
        python -m pytest tests/test_fuzz_core.py

(a sanitizer report ends a child with exit status 1: a crash, summarized from its report).
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# also run under ASan (test_asan_extension); in-process, safe beside other tests
pytestmark = [pytest.mark.boundary, pytest.mark.kernels]

CALLS = int(os.environ.get("DPTRAIN_FUZZ_CALLS", "12000"))
SEED = int(os.environ.get("DPTRAIN_FUZZ_SEED", "0"))
JOBS = int(os.environ.get("DPTRAIN_FUZZ_JOBS", "2"))
HANG_S = float(os.environ.get("DPTRAIN_FUZZ_HANG_S", "30"))


def load_fuzzer():
    path = Path(__file__).with_name("fuzz_core.py")
    spec = importlib.util.spec_from_file_location("fuzz_core", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_core", module)
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzzer()


def test_every_public_callable_has_a_fuzzer():
    """A new function, class, method or getter of _core must be added to the fuzzer."""
    assert fuzz.uncovered() == [], (
        f"not fuzzed: {fuzz.uncovered()}: give each a builder in "
        f"SPECS or a step in a scenario, then an entry in COVERAGE"
    )


def test_hostile_calls_neither_crash_nor_give_wrong_results():
    report = fuzz.run_fuzz(CALLS, seed=SEED, jobs=JOBS, hang_s=HANG_S)
    text = fuzz.format_report(report)
    assert report.calls >= CALLS, text
    never = [name for name in fuzz.public_callables() if not report.per_callable[name]["accepted"]]
    assert not never, f"never called with arguments it accepts (or never raised): {never}\n{text}"
    assert (report.crashes, report.hangs, report.wrong) == (0, 0, 0), text
