"""The kernels' ISA: detection, DPTRAIN_ISA, _core.set_isa, and the builds agreeing.

The C core has a generic, an AVX2+FMA and an AVX-512 build of the GEMM and of every vector
kernel (csrc/dp_vec.h); one process-wide choice says which runs. The kernel tests run every
build this CPU has (conftest.isa); here: the choice itself, and that the builds agree.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain import _core as core

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

REPO = Path(__file__).resolve().parents[1]
ISAS = ("generic", "avx2", "avx512")
HAVE_ISAS = core.build_info()["isas_available"]


def widest_from_flags():
    f = core.cpu_features()
    if all(f[k] for k in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq")):
        return "avx512"
    if f["avx2"] and f["fma"]:
        return "avx2"
    return "generic"


def run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120
    )


@pytest.mark.parametrize("name", ISAS)
def test_each_isa_runs_where_the_cpu_has_it(name):
    """Where the CPU has the ISA, set_isa makes it the kernels' ISA (build_info says so, and
    the GEMM's micro-tile is that build's); where it lacks it, a skip that names it."""
    if name not in HAVE_ISAS:
        pytest.skip(
            f"isa {name!r} is not on this CPU ({core.cpu_features()['brand']}): its "
            f"build is compiled but cannot run here (the C tests run the AVX-512 GEMM's "
            f"shape and the loss kernels' 64-byte vectors emulated: make -C csrc/tests "
            f"check)"
        )
    previous = core.set_isa(name)
    try:
        info = core.build_info()
        assert core.isa() == name and info["isa"] == name
        mr, nr = info["gemm_blocking_mr_nr_kc_mc_nc"]["float32"][:2]
        assert (mr, nr) == {"generic": (6, 8), "avx2": (6, 16), "avx512": (12, 32)}[name]
        assert info["simd"].startswith(
            {"generic": "generic", "avx2": "avx2", "avx512": "avx512"}[name]
        )
    finally:
        core.set_isa(previous)


def test_default_is_the_widest_the_cpu_has():
    proc = run_python(
        "from dptrain import _core as c; print(c.isa(), c.build_info()['isas_available'])",
        DPTRAIN_ISA="",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == widest_from_flags()
    assert HAVE_ISAS[-1] == widest_from_flags() and HAVE_ISAS[0] == "generic"


def test_set_isa_returns_the_previous_and_refuses_bad_names():
    previous = core.isa()
    try:
        assert core.set_isa("generic") == previous
        assert core.set_isa("widest") == "generic"
        assert core.isa() == widest_from_flags()
        for bad in ("sse", "AVX2", "", "avx512 "):
            with pytest.raises(ValueError, match=re.escape(f"got '{bad}'")):
                core.set_isa(bad)
        assert core.isa() == widest_from_flags()
        with pytest.raises(TypeError):
            core.set_isa(2)
    finally:
        core.set_isa(previous)


@pytest.mark.skipif("avx512" in HAVE_ISAS, reason="this CPU has AVX-512: nothing to refuse")
def test_set_isa_names_what_the_cpu_lacks():
    with pytest.raises(ValueError, match="avx512f, avx512bw, avx512vl and avx512dq") as e:
        core.set_isa("avx512")
    assert "available here: " + ", ".join(HAVE_ISAS) in str(e.value)
    proc = run_python("import dptrain", DPTRAIN_ISA="avx512")
    assert proc.returncode != 0
    assert "DPTRAIN_ISA" in proc.stderr and "not available on this CPU" in proc.stderr


def test_dptrain_isa_forces_a_path_and_a_bad_one_stops_the_import():
    code = (
        "from dptrain import _core as c; import dptrain; "
        "print(c.isa(), dptrain.build_info()['simd'])"
    )
    proc = run_python(code, DPTRAIN_ISA="generic")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["generic", "generic"]
    proc = run_python("import dptrain", DPTRAIN_ISA="avx9")
    assert proc.returncode != 0
    assert (
        "environment variable DPTRAIN_ISA must be 'widest', 'avx512', 'avx2' or 'generic', "
        "got 'avx9'"
    ) in proc.stderr
    proc = run_python("from dptrain import _core as c; print(c.isa())", DPTRAIN_ISA="widest")
    assert proc.stdout.strip() == widest_from_flags()


def test_cli_info_shows_the_isa():
    proc = subprocess.run(
        [sys.executable, "-m", "dptrain", "info"],
        capture_output=True,
        text=True,
        env=dict(os.environ, DPTRAIN_ISA="generic"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s+isa\s+generic$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^\s+isas_available\s+\[\"generic\"", proc.stdout, re.M), proc.stdout


def test_builds_agree():
    """The same inputs through every build this CPU has: sums and copies are bitwise the same
    (each element's terms are added in the same order: vectorization runs across elements),
    the rest within a few ulps (the generic build has no FMA, so a*b+c rounds twice)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    labels = rng.integers(0, 33, 64)
    bufs = [rng.standard_normal(1001).astype(np.float64) for _ in range(3)]
    a, b = rng.standard_normal((70, 90)), rng.standard_normal((90, 50))
    previous = core.isa()
    results = {}
    try:
        for name in HAVE_ISAS:
            core.set_isa(name)
            y = np.empty_like(x)
            core.relu_forward(x, y)
            out = np.empty_like(bufs[0])
            core.sum_buffers(out, bufs, scale=0.5)
            d = np.empty_like(x)
            loss = core.softmax_xent(x, labels, d, grad_scale=1 / 64)
            c = np.zeros((70, 50))
            core.gemm(a, b, c)
            results[name] = (y, out, d, loss, c)
    finally:
        core.set_isa(previous)
    base = results["generic"]
    for name, (y, out, d, loss, c) in results.items():
        np.testing.assert_array_equal(y, base[0], err_msg=f"relu on {name}")
        np.testing.assert_array_equal(out, base[1], err_msg=f"sum_buffers on {name}")
        np.testing.assert_allclose(d, base[2], rtol=1e-5, atol=1e-7, err_msg=f"softmax on {name}")
        assert abs(loss - base[3]) <= 1e-5 * abs(base[3]), name
        np.testing.assert_allclose(c, base[4], rtol=1e-12, atol=1e-12, err_msg=f"gemm on {name}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 9, 9), (2, 32, 32), (4, 5, 5)])
def test_batch_norms_sums_on_every_build(dtype, shape):
    """Batch norm's per-channel sums go through 32 double lanes (value i into lane i % 32),
    held in vectors of each build's width (one pass over a row on AVX-512, two on AVX2, four
    in the generic build's 16 bytes), then a fixed tree. On maps of 81 values (two whole
    blocks of 32 and a tail), 1024 (32 blocks) and 25 (a tail only): the running statistics
    after one step are NumPy's float64 mean and unbiased variance (momentum 0.1), and the
    builds with FMA give the same bits (the generic one has none: within rounding)."""
    from dptrain import nn

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((24, int(np.prod(shape)))) * 3 + 1.5).astype(dtype)
    y = rng.integers(0, 10, 24)
    xs = x.astype(np.float64).reshape(24, shape[0], -1)
    mean = xs.mean(axis=(0, 2))
    var = xs.transpose(1, 0, 2).reshape(shape[0], -1).var(axis=1, ddof=1)
    previous = core.isa()
    results = {}
    try:
        for name in HAVE_ISAS:
            core.set_isa(name)
            m = nn.Sequential(
                [nn.BatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.Dense(10)],
                input_shape=shape,
                dtype=dtype,
                seed=2,
            )
            grads = np.zeros_like(m.grads)
            loss = m.loss_grad(x, y, grads=grads)
            results[name] = (loss, grads, m.state.copy())
    finally:
        core.set_isa(previous)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for name, (loss, grads, state) in results.items():
        C = shape[0]
        np.testing.assert_allclose(state[:C], 0.1 * mean, rtol=tol, err_msg=f"mean on {name}")
        np.testing.assert_allclose(
            state[C:], 0.9 + 0.1 * var, rtol=tol, err_msg=f"variance on {name}"
        )
    fma = [results[n] for n in HAVE_ISAS if n != "generic"]
    for loss, grads, state in fma[1:]:
        assert loss == fma[0][0]
        assert np.array_equal(grads, fma[0][1])
        assert np.array_equal(state, fma[0][2])


@pytest.mark.skipif("avx512" not in HAVE_ISAS, reason="needs a CPU with AVX-512")
@pytest.mark.parametrize(
    "dtype,features", [("float32", 8), ("float32", 15), ("float64", 4), ("float64", 7)]
)
def test_logistic_rows_narrower_than_a_zmm_take_the_avx2_build(dtype, features):
    """A row of fewer features than a 64-byte vector holds, but at least half of them: the
    AVX-512 build hands the fused logistic kernel to the AVX2 build (its own code would go one
    value at a time), so the two give the same bits."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, features)).astype(dtype)
    y = (rng.random(300) > 0.5).astype(np.int64)
    previous = core.isa()
    grads = {}
    try:
        for name in ("avx2", "avx512"):
            core.set_isa(name)
            model = dptrain.LogisticRegression(features, seed=1, dtype=dtype, threads=1)
            loss, correct = model.loss_grad(x, y)
            grads[name] = (loss, correct, model.grads.copy())
    finally:
        core.set_isa(previous)
    (l2, c2, g2), (l5, c5, g5) = grads["avx2"], grads["avx512"]
    assert (l5, c5) == (l2, c2)
    np.testing.assert_array_equal(g5, g2)


def test_the_avx512_pragma_is_the_gemm_target():
    """dp_vec_avx512.c's #pragma GCC target spells DP_TARGET_AVX512 out (a pragma takes no
    macro): the vector kernels and the GEMM must be built for the same ISA that
    dp_cpu_has_isa checks."""
    macro = re.search(
        r'#define DP_TARGET_AVX512 "([^"]+)"', (REPO / "csrc/dp_common.h").read_text()
    )
    pragma = re.search(
        r'#pragma GCC target\("([^"]+)"\)', (REPO / "csrc/dp_vec_avx512.c").read_text()
    )
    assert macro and pragma and macro.group(1) == pragma.group(1)
    assert set(macro.group(1).split(",")) >= {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
