"""bfloat16 mixed precision (dtype="bfloat16"): float32 buffers, every GEMM's inputs rounded
to bfloat16 (round to nearest even) and accumulated in float32.

The kernels are held to a NumPy reference that rounds the same operands; the models to a
NumPy forward/backward that does; the training engine to its promises (same weights for any
world size in deterministic mode, checkpoints, the CLI, scikit-learn estimators). The
accuracy against float32 on MNIST is measured by bench/bench_bf16.py, not here."""

import json
import pickle
import re

import numpy as np
import pytest
from _runs import SMALL

import dptrain
from dptrain import _core, cli
from dptrain import reference as ref


def bits(a) -> np.ndarray:
    """float32 -> the bits (uint16) of its nearest bfloat16, ties to even (the NumPy twin:
    reference.to_bf16)."""
    out = np.empty(np.shape(a), np.uint16)
    ref.to_bf16(np.asarray(a, np.float32), out)
    return out


def widen(b) -> np.ndarray:
    out = np.empty(np.shape(b), np.float32)
    ref.from_bf16(np.asarray(b, np.uint16), out)
    return out


def round_bf16(a) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), as float32; NaN stays NaN, overflow is inf."""
    return widen(bits(a))


def rmm(a, b) -> np.ndarray:
    """a @ b with bfloat16 inputs, summed in float64 (the reference of a float32 GEMM)."""
    return round_bf16(a).astype(np.float64) @ round_bf16(b).astype(np.float64)


# ---- kernels ---------------------------------------------------------------------------


def test_context_takes_bfloat16_and_names_a_bad_value():
    assert _core.Context(2, gemm_inputs="bfloat16").gemm_inputs == "bfloat16"
    assert _core.Context().gemm_inputs is None
    assert _core.Context(gemm_inputs=None).gemm_inputs is None
    with pytest.raises(ValueError, match="gemm_inputs is 'float16'"):
        _core.Context(gemm_inputs="float16")
    with pytest.raises(TypeError, match="gemm_inputs must be a str or None, got int"):
        _core.Context(gemm_inputs=16)


def test_a_bfloat16_context_refuses_float64_arrays():
    ctx = _core.Context(gemm_inputs="bfloat16")
    a = np.ones((3, 4))
    with pytest.raises(ValueError, match="only float32 arrays take; a is float64"):
        _core.gemm(a, a.T.copy(), np.zeros((3, 3)), ctx=ctx)
    x, w, b, y = np.ones((2, 4)), np.ones((3, 4)), np.ones(3), np.zeros((2, 3))
    with pytest.raises(ValueError, match="x is float64"):
        _core.dense_forward(x, w, b, y, ctx=ctx)


@pytest.mark.parametrize(
    "trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)]
)
@pytest.mark.parametrize(
    "shape", [(128, 256, 784), (7, 10, 27), (1, 1, 1), (37, 3, 500), (13, 130, 9)]
)
def test_gemm_rounds_both_inputs_to_bfloat16(isa, shape, trans_a, trans_b):
    M, N, K = shape
    rng = np.random.default_rng(M * N + K)
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    opa, opb = (a.T if trans_a else a), (b.T if trans_b else b)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    want = 0.5 * rmm(opa, opb) - 2.0 * c0
    full = 0.5 * (opa.astype(np.float64) @ opb.astype(np.float64)) - 2.0 * c0
    mag = 0.5 * (np.abs(round_bf16(opa)).astype(np.float64) @ np.abs(round_bf16(opb))) + 2 * abs(c0)
    for threads in (1, 3):
        c = c0.copy()
        _core.gemm(
            a,
            b,
            c,
            trans_a=trans_a,
            trans_b=trans_b,
            alpha=0.5,
            beta=-2.0,
            ctx=_core.Context(threads, gemm_inputs="bfloat16"),
        )
        assert np.all(np.abs(c - want) <= (K + 16) * np.finfo(np.float32).eps * mag + 1e-30), (
            f"threads={threads}: max |c - ref| {np.abs(c - want).max()}"
        )
    if K >= 27:  # the rounding is visible: bfloat16's 8 bits, not float32's 24
        assert np.abs(c - full).max() > 1e3 * np.finfo(np.float32).eps * np.abs(full).max()


@pytest.mark.parametrize("k", [1, 32])
def test_gemm_rounding_is_round_to_nearest_even_on_every_bit_pattern(isa, k):
    """x times 1, with K = 1 (the dot or the rounding path) and K = 32 (x in column 0, zeros
    beside it: the AMX path where this process has it)."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    # the boundaries: ties (low half 0x8000) with even and odd kept bits, and their neighbours
    ties = rng.integers(0, 2**16, 512, dtype=np.uint64).astype(np.uint32) << 16
    bits = np.concatenate(
        [
            bits,
            ties | 0x8000,
            ties | 0x7FFF,
            ties | 0x8001,
            np.array(
                [
                    0x7F7FFFFF,
                    0x7F800000,
                    0xFF800000,
                    0x7F800001,
                    0x7FC00000,
                    0x00008000,
                    0x00018000,
                    0x007FFFFF,
                ],
                np.uint32,
            ),
        ]
    )
    x = bits.view(np.float32).reshape(-1, 1)
    a = np.zeros((len(x), k), np.float32)
    a[:, :1] = x
    one = np.zeros((k, 1), np.float32)
    one[0] = 1
    c = np.empty((len(x), 1), np.float32)
    _core.gemm(a, one, c, ctx=_core.Context(gemm_inputs="bfloat16"))
    want = round_bf16(x)
    path = _core.build_info()["bfloat16_gemm"]
    if path.startswith("AMX") and k < 32:  # below one 32-k chunk: the path AMX falls back on
        previous = _core.set_bf16_amx(False)
        path = _core.build_info()["bfloat16_gemm"]
        _core.set_bf16_amx(previous)
    if path.startswith(("vdpbf16ps", "AMX")):
        # vdpbf16ps and AMX's tdpbf16ps read a denormal input as 0 (Intel SDM: DAZ), the
        # rounding path not; the AMX path's packing (vcvtne2ps2bf16) also reads a denormal
        # float as 0 before rounding it (0x007fffff would round up to the smallest normal)
        tiny = (want != 0) & (np.abs(want) < np.finfo(np.float32).tiny)
        if path.startswith("AMX"):
            tiny |= (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
        assert tiny.any()
        assert np.all(c[tiny] == 0)
        want[tiny] = 0
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(c), nan)
    assert np.array_equal(c[~nan], want[~nan])  # -0 * 1 + 0 is +0 on both sides (==)


# ---- models ----------------------------------------------------------------------------


def mlp_grads_bf16(model, x, y):
    """The MLP's mean-loss gradient with every matmul's inputs rounded to bfloat16 (NumPy)."""
    layers = model.layers()
    acts = [x]
    for i, (w, b) in enumerate(layers):
        z = (rmm(acts[-1], w.T) + b).astype(np.float32)
        acts.append(np.maximum(z, 0) if i < len(layers) - 1 else z)
    z = acts[-1].astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = p
    d[np.arange(len(y)), y] -= 1
    d = (d / len(y)).astype(np.float32)
    grads = []
    for i in range(len(layers) - 1, -1, -1):
        w, _ = layers[i]
        grads.append((rmm(d.T, acts[i]), d.astype(np.float64).sum(0)))
        if i:
            d = (rmm(d, w).astype(np.float32) * (acts[i] > 0)).astype(np.float32)
    return grads[::-1]


def test_a_bfloat16_model_is_float32_with_bfloat16_gemms():
    m = dptrain.MLP((12, 16, 3), dtype="bfloat16")
    assert m.dtype == np.float32 and m.precision == "bfloat16"
    assert m.params.dtype == m.grads.dtype == m.velocity.dtype == np.float32
    assert m._net.gemm_inputs == "bfloat16"
    assert "dtype=bfloat16" in repr(m) and "bfloat16 mixed precision" in m.summary()
    assert m.config()["dtype"] == "bfloat16"
    f = dptrain.MLP((12, 16, 3))
    assert f.precision == "float32" and f._net.gemm_inputs is None
    np.testing.assert_array_equal(m.params, f.params)  # the same initial weights


def test_bfloat16_needs_float32_buffers_and_names_the_problem():
    with pytest.raises(TypeError, match="dtype is float16, expected float32, float64 or bfloat16"):
        dptrain.MLP((4, 3), dtype=np.float16)
    with pytest.raises(TypeError, match="dtype is 'bf16', expected"):
        dptrain.MLP((4, 3), dtype="bf16")
    with pytest.raises(ValueError, match="expected float32 and"):
        dptrain.MLP((4, 3), dtype="bfloat16", params=np.zeros(15))
    p, g = np.zeros(15), np.zeros(15)
    with pytest.raises(
        ValueError, match="gemm_inputs='bfloat16' needs float32 params, got float64"
    ):
        _core.Model([("dense", 3)], (4,), "softmax_xent", p, g, gemm_inputs="bfloat16")


def test_mlp_gradient_is_the_bfloat16_reference(isa):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    y = rng.integers(0, 5, 64)
    m = dptrain.MLP((40, 32, 24, 5), dtype="bfloat16", seed=2, threads=2)
    f = dptrain.MLP((40, 32, 24, 5), seed=2)
    m.zero_grad()
    m.loss_grad(x, y)
    f.zero_grad()
    f.loss_grad(x, y)
    for (gw, gb), (w, b), (fw, _) in zip(mlp_grads_bf16(m, x, y), m.grad_layers(), f.grad_layers()):
        np.testing.assert_allclose(w, gw, rtol=1e-4, atol=1e-6 * np.abs(gw).max())
        np.testing.assert_allclose(b, gb, rtol=1e-4, atol=1e-6 * np.abs(gb).max())
        assert not np.array_equal(w, fw)  # not float32's


CPU_BF16 = "avx512" in _core.build_info()["isas_available"] and bool(
    _core.cpu_features()["avx512_bf16"]
)
# the path exists where the CPU has AVX512_BF16 and the compiler its intrinsics: then and only
# then build_info has the measured ratio
HAS_BF16_DOT = _core.build_info()["bfloat16_dot_vs_fma"] is not None


def test_set_bf16_dot_says_which_path_runs():
    previous_amx = _core.set_bf16_amx(False)  # AMX, where it runs, comes first
    previous = _core.set_bf16_dot(False)
    try:
        assert previous is None  # auto, unless a test left it set
        assert _core.build_info()["bfloat16_gemm"].startswith("inputs rounded to bfloat16")
        assert _core.set_bf16_dot(False) is False
        with pytest.raises(TypeError, match="on must be True, False or None"):
            _core.set_bf16_dot(1)
        ratio = _core.build_info()["bfloat16_dot_vs_fma"]
        assert CPU_BF16 or not HAS_BF16_DOT  # no ratio without the CPU
        if not HAS_BF16_DOT:
            assert ratio is None
            with pytest.raises(ValueError, match="needs AVX512_BF16 .* which this CPU .* lacks"):
                _core.set_bf16_dot(True)
            assert _core.set_bf16_dot(None) is False  # the refusals changed nothing
            assert _core.build_info()["bfloat16_gemm"].startswith("inputs rounded")
        else:
            assert ratio > 0
            assert _core.set_bf16_dot(True) is False
            on_avx512 = _core.isa() == "avx512"
            assert _core.build_info()["bfloat16_gemm"].startswith("vdpbf16ps") == on_avx512
            assert _core.set_bf16_dot(None) is True
            # auto: the dot path where vdpbf16ps does >= 1.2x the float32 FMA's flop here
            auto = _core.build_info()["bfloat16_gemm"].startswith("vdpbf16ps")
            assert auto == (on_avx512 and ratio >= 1.2)
    finally:
        _core.set_bf16_dot(previous)
        _core.set_bf16_amx(previous_amx)


HAS_AMX = _core.build_info()["bfloat16_amx"]


def path_case(model):
    """The data and a bfloat16 model of the tests that compare the GEMM paths: (x, y,
    make(threads)), a small MLP or CNN."""
    rng = np.random.default_rng(7)
    if model == "mlp":
        x = rng.standard_normal((100, 50)).astype(np.float32)

        def make(t):
            return dptrain.MLP((50, 40, 33, 7), dtype="bfloat16", seed=4, threads=t)
    else:
        x = rng.standard_normal((6, 2 * 11 * 11)).astype(np.float32)

        def make(t):
            return dptrain.CNN(
                (2, 11, 11), 7, channels=(5, 9), hidden=(13,), dtype="bfloat16", seed=4, threads=t
            )

    return x, rng.integers(0, 7, len(x)), make


def test_set_bf16_amx_says_which_path_runs():
    info = _core.build_info()
    assert info["bfloat16_amx"] is (info["bfloat16_amx_why"] is None)
    assert not HAS_AMX or (CPU_BF16 and _core.cpu_features()["amx_bf16"])
    previous = _core.set_bf16_amx(None)
    try:
        assert previous is None  # auto, unless a test left it set
        assert _core.build_info()["bfloat16_gemm"].startswith("AMX") == (
            HAS_AMX and _core.isa() == "avx512"
        )
        with pytest.raises(TypeError, match="on must be True, False or None"):
            _core.set_bf16_amx(1)
        assert _core.set_bf16_amx(False) is None
        assert not _core.build_info()["bfloat16_gemm"].startswith("AMX")
        if not HAS_AMX:
            with pytest.raises(
                ValueError,
                match="the AMX path cannot run here .*: " + re.escape(info["bfloat16_amx_why"]),
            ):
                _core.set_bf16_amx(True)
            assert _core.set_bf16_amx(None) is False  # the refusal changed nothing
        else:
            assert _core.set_bf16_amx(True) is False
            assert _core.build_info()["bfloat16_gemm"].startswith("AMX") == (
                _core.isa() == "avx512"
            )
    finally:
        _core.set_bf16_amx(previous)


@pytest.mark.skipif(
    not HAS_AMX,
    reason="this process cannot run AMX here (build_info()"
    "['bfloat16_amx_why']); csrc/tests' test_core_wide runs its emulation",
)
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_the_amx_path_is_within_float32s_bound_and_reproducible(model):
    """dp_gemm_amx_tmpl.h: tdpbf16ps sums otherwise than the rounding path (more precision
    inside an instruction), so its gradients are close to the rounding path's, not equal; a
    second run gives the same bits, and so do 3 threads for the MLP, whose GEMMs split C
    among the threads (the CNN's conv layers also split the batch, and sum the threads'
    weight gradients: float32 differs between thread counts there too)."""
    x, y, make = path_case(model)
    previous_isa = _core.set_isa("avx512")
    runs = {}
    try:
        for amx, threads in ((False, 1), (True, 1), (True, 3), (True, 1)):
            _core.set_bf16_amx(amx)
            assert _core.build_info()["bfloat16_gemm"].startswith("AMX") == amx
            m = make(threads)
            m.zero_grad()
            loss = m.loss_grad(x, y)
            runs.setdefault((amx, threads), []).append((loss, m.grads.copy()))
    finally:
        _core.set_bf16_amx(None)
        _core.set_isa(previous_isa)
    ((l0, g0),) = runs[False, 1]
    (l1, g1), (l1b, g1b) = runs[True, 1]
    ((l3, g3),) = runs[True, 3]
    assert l1 == l1b
    np.testing.assert_array_equal(g1, g1b)
    if model == "mlp":
        assert l1 == l3
        np.testing.assert_array_equal(g1, g3)
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    np.testing.assert_allclose(g1, g0, rtol=1e-3, atol=1e-5 * np.abs(g0).max())


@pytest.mark.skipif(
    not HAS_BF16_DOT,
    reason="this CPU has no AVX512_BF16: the vdpbf16ps "
    "micro-kernel cannot run here (csrc/tests' test_core_wide runs its emulation)",
)
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_the_vdpbf16ps_path_gives_the_rounding_paths_bits(model):
    """dp_gemm_dot_tmpl.h: vdpbf16ps adds the pair's two exact products one after the other,
    each rounded, as the float micro-kernel's FMAs do; only denormals (read as 0) differ, and
    these data have none."""
    x, y, make = path_case(model)
    threads = 2 if model == "mlp" else 1
    previous_isa = _core.set_isa("avx512")
    previous_amx = _core.set_bf16_amx(False)
    grads, losses = {}, {}
    try:
        for dot in (False, True):
            _core.set_bf16_dot(dot)
            m = make(threads)
            m.zero_grad()
            losses[dot] = m.loss_grad(x, y)
            grads[dot] = m.grads.copy()
    finally:
        _core.set_bf16_dot(None)
        _core.set_bf16_amx(previous_amx)
        _core.set_isa(previous_isa)
    assert losses[True] == losses[False]
    np.testing.assert_array_equal(grads[True], grads[False])


@pytest.mark.skipif(
    not HAS_AMX,
    reason="this process cannot run AMX here (build_info()"
    "['bfloat16_amx_why']); csrc/tests' test_core_wide runs its emulation",
)
@pytest.mark.parametrize(
    "shape",
    [
        (128, 256, 784, False, True),
        (256, 784, 128, True, False),
        (77, 45, 1000, False, False),
        (5, 300, 33, True, True),
        (300, 10, 64, False, True),
    ],
)
def test_an_amx_gemm_has_the_same_bits_on_any_threads(shape):
    """Each C element's sum runs over the same K slices and tiles whatever the threads (they
    split C by whole 32-row or 32-column blocks); against the rounding path, the float32
    summation bound of the rounded operands."""
    M, N, K, ta, tb = shape
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    previous_isa = _core.set_isa("avx512")
    out = {}
    try:
        for amx, threads in ((False, 1), (True, 1), (True, 2), (True, 3)):
            _core.set_bf16_amx(amx)
            c = c0.copy()
            _core.gemm(
                a,
                b,
                c,
                trans_a=ta,
                trans_b=tb,
                alpha=0.5,
                beta=2.0,
                ctx=_core.Context(threads, gemm_inputs="bfloat16"),
            )
            out[amx, threads] = c
    finally:
        _core.set_bf16_amx(None)
        _core.set_isa(previous_isa)
    for threads in (2, 3):
        np.testing.assert_array_equal(out[True, threads], out[True, 1])
    opa, opb = (a.T if ta else a), (b.T if tb else b)
    bound = (
        (K + 16)
        * np.finfo(np.float32).eps
        * (0.5 * np.abs(opa).astype(np.float64) @ np.abs(opb) + 2 * np.abs(c0))
    )
    assert np.all(np.abs(out[True, 1].astype(np.float64) - out[False, 1]) <= 2 * bound)


def test_logistic_regression_takes_the_bfloat16_gemms():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 20)).astype(np.float32)
    y = rng.integers(0, 2, 300)
    m = dptrain.LogisticRegression(20, dtype="bfloat16", seed=1)
    m.zero_grad()
    m.loss_grad(x, y)
    ((w, b),) = m.layers()
    z = (rmm(x, w.T)[:, 0] + b[0]).astype(np.float32).astype(np.float64)
    d = ((1 / (1 + np.exp(-z)) - y) / len(y)).astype(np.float32)
    ((gw, gb),) = m.grad_layers()
    np.testing.assert_allclose(gw[0], rmm(d[None, :], x)[0], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gb[0], d.astype(np.float64).sum(), rtol=1e-4, atol=1e-7)


def test_cnn_gradient_is_close_to_float32_and_not_float32s(isa):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 1 * 12 * 12)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    grads = {}
    for dt in ("float32", "bfloat16"):
        m = dptrain.CNN((1, 12, 12), 10, channels=(4, 8), hidden=(16,), dtype=dt, seed=3)
        m.zero_grad()
        m.loss_grad(x, y)
        grads[dt] = m.grads.copy()
    f, b = grads["float32"], grads["bfloat16"]
    assert not np.array_equal(f, b)
    # bfloat16 keeps 8 significant bits: the gradient is float32's to a few per cent of its size
    assert np.abs(b - f).max() <= 0.05 * np.abs(f).max()


def test_save_and_load_keep_the_precision(tmp_path):
    m = dptrain.MLP((12, 16, 3), dtype="bfloat16", seed=4)
    m.params[:] += 0.25
    m.save(tmp_path / "m.npz")
    back = dptrain.load_model(tmp_path / "m.npz")
    assert back.precision == "bfloat16" and back._net.gemm_inputs == "bfloat16"
    np.testing.assert_array_equal(back.params, m.params)


# ---- training --------------------------------------------------------------------------


@pytest.mark.parametrize("comm_dtype", ["float32", "bfloat16"])
def test_deterministic_bfloat16_training_is_the_same_bits_for_1_2_and_3_workers(comm_dtype):
    runs = {
        w: dptrain.train(
            **SMALL,
            dtype="bfloat16",
            comm_dtype=comm_dtype,
            deterministic=True,
            workers=w,
            backend="thread",
        )["params"]
        for w in (1, 2, 3)
    }
    assert np.array_equal(runs[1], runs[2]) and np.array_equal(runs[1], runs[3])
    f32 = dptrain.train(**SMALL, deterministic=True)["params"]
    assert runs[1].dtype == np.float32 and not np.array_equal(runs[1], f32)
    # the same training to bfloat16's precision: a few per cent of the weights' size at most
    assert np.abs(runs[1] - f32).max() <= 0.05 * np.abs(f32).max()


def test_a_bfloat16_run_resumes_from_its_checkpoint(tmp_path):
    whole = dptrain.train(**SMALL, dtype="bfloat16")
    path = tmp_path / "run.npz"
    with pytest.raises(RuntimeError, match="injected fault"):
        dptrain.train(
            **SMALL, dtype="bfloat16", checkpoint=path, checkpoint_every=5, fault=(0, 17, "raise")
        )
    resumed = dptrain.train(**SMALL, dtype="bfloat16", resume=path)
    np.testing.assert_array_equal(resumed["params"], whole["params"])
    assert resumed["config"]["dtype"] == "bfloat16"


def test_the_cli_trains_in_bfloat16_and_says_so(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = cli.main(
        [
            "train",
            "--model",
            "mlp",
            "--hidden",
            "16",
            "--dataset",
            "synthetic",
            "--n-samples",
            "600",
            "--n-features",
            "12",
            "--epochs",
            "1",
            "--dtype",
            "bfloat16",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["config"]["dtype"] == "bfloat16"
    assert res["model"]["dtype"] == "bfloat16"


def test_sklearn_estimator_takes_bfloat16_and_pickles():
    from dptrain.sklearn import MLPClassifier

    rng = np.random.default_rng(6)
    X = rng.standard_normal((200, 6))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    est = MLPClassifier(hidden_layer_sizes=(8,), max_iter=3, dtype="bfloat16", random_state=0)
    est.fit(X, y)
    assert est.model_.precision == "bfloat16"
    back = pickle.loads(pickle.dumps(est))
    assert back.model_.precision == "bfloat16"
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_a_data_set_asked_for_in_bfloat16_says_to_use_float32():
    with pytest.raises(ValueError, match="a bfloat16 \\(mixed precision\\) model reads float32"):
        dptrain.data.synthetic_classification(10, 4, 2, dtype="bfloat16")


# ---- the bfloat16 gradient exchange ------------------------------------------------------


def test_to_bf16_and_from_bf16_round_trip_every_pattern(isa):
    rng = np.random.default_rng(8)
    x = np.concatenate(
        [
            rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32),
            np.array([0x7F7FFFFF, 0x7F800000, 0x3F808000, 0x3F818000, 0xFFC12345], np.uint32),
        ]
    ).view(np.float32)
    b = np.empty(x.size, np.uint16)
    _core.to_bf16(x, b)
    want = bits(x)
    nan = np.isnan(x)
    assert np.array_equal(b[~nan], want[~nan])
    assert np.all(np.isnan(widen(b[nan])))
    back = np.empty(x.size, np.float32)
    _core.from_bf16(b, back)
    assert np.array_equal(back.view(np.uint32), b.astype(np.uint32) << 16)


def test_sum_buffers_of_bfloat16_sums_in_float32_then_rounds(isa):
    rng = np.random.default_rng(9)
    ins = [bits(rng.standard_normal(5003).astype(np.float32)) for _ in range(5)]
    acc = widen(ins[0]).copy()
    for b in ins[1:]:
        acc = acc + widen(b)  # float32, in order
    out = np.empty(5003, np.uint16)
    _core.sum_buffers(out, ins, scale=0.5)
    assert np.array_equal(out, bits(acc * np.float32(0.5)))
    with pytest.raises(TypeError, match="inputs\\[1\\] has dtype float32, expected uint16"):
        _core.sum_buffers(out, [ins[0], widen(ins[1])])
    with pytest.raises(TypeError, match="dtype uint16, expected float32"):
        _core.from_bf16(ins[0], np.empty(5003, np.uint16))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_bfloat16_exchange_sends_half_the_bytes_and_trains_the_same_model(backend):
    from dptrain.comm.algorithms import bytes_sent

    runs = {
        cd: dptrain.train(**SMALL, dtype="bfloat16", workers=2, backend=backend, comm_dtype=cd)
        for cd in ("bfloat16", "float32")
    }
    bf, f32 = runs["bfloat16"], runs["float32"]
    assert bf["config"]["comm_dtype"] == "bfloat16"
    m, steps = bf["breakdown"]["param_bytes"], bf["steps"]
    # per step the gradient (native: 2 (p - 1) / p of its bytes); per epoch the stats'
    # all-reduce, once the parameters' broadcast: the gradient's share is half of float32's
    other = SMALL["epochs"] * bytes_sent("native", 2, 16) + m
    assert f32["breakdown"]["bytes_sent"] - other == steps * m
    assert bf["breakdown"]["bytes_sent"] - other == steps * m // 2
    assert not np.array_equal(bf["params"], f32["params"])
    assert np.abs(bf["params"] - f32["params"]).max() <= 0.02 * np.abs(f32["params"]).max()


def test_deterministic_bfloat16_exchange_matches_the_numpy_chunk_sum():
    """One step of deterministic mode by hand: each chunk's float32 gradient rounded to
    bfloat16, summed in chunk order in float32, the sum rounded: the update is SGD on it."""
    from dptrain.config import CHUNKS
    from dptrain.sampler import shard

    rng = np.random.default_rng(10)
    x = rng.standard_normal((200, 12)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    m = dptrain.MLP((12, 16, 3), dtype="bfloat16", seed=0)
    p0 = m.params.copy()
    acc = np.zeros(m.n_params, np.float32)
    for c in range(CHUNKS):
        lo, hi = shard(0, 200, c, CHUNKS)
        m.zero_grad()
        m.loss_grad(x[lo:hi], y[lo:hi], 1.0 / 200)
        acc = acc + round_bf16(m.grads)
    want = p0 - np.float32(0.05) * round_bf16(acc)
    r = dptrain.fit(
        m,
        x,
        y,
        epochs=1,
        batch_size=200,
        lr=0.05,
        momentum=0.0,
        shuffle=False,
        deterministic=True,
        comm_dtype="bfloat16",
        workers=2,
        backend="thread",
        quiet=True,
    )
    assert r["steps"] == 1
    np.testing.assert_allclose(m.params, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(m.params, p0 - np.float32(0.05) * acc, rtol=1e-6, atol=1e-7)


def test_comm_dtype_is_checked_against_the_model_and_the_exchange():
    with pytest.raises(
        ValueError, match="needs float32 gradients: dtype float32 or bfloat16, got float64"
    ):
        dptrain.train(**SMALL, dtype="float64", comm_dtype="bfloat16")
    with pytest.raises(ValueError, match="works with allreduce='native'.*allreduce='ring'"):
        dptrain.train(**SMALL, comm_dtype="bfloat16", allreduce="ring", workers=2, backend="thread")
    with pytest.raises(ValueError, match="overlap=True"):
        dptrain.train(**SMALL, comm_dtype="bfloat16", overlap=True, workers=2, backend="thread")
    with pytest.raises(
        ValueError, match="comm_dtype is 'float64', but the model's gradients are float32"
    ):
        dptrain.train(**SMALL, comm_dtype="float64")
    with pytest.raises(ValueError, match="comm_dtype is 'int8'"):
        dptrain.train(**SMALL, comm_dtype="int8")
    # a bfloat16 model exchanges float32 gradients unless asked (the conversions cost more than
    # the bytes save over shared memory: bench/bench_bf16.py)
    r = dptrain.train(**SMALL, dtype="bfloat16", workers=2, backend="thread")
    assert r["config"]["comm_dtype"] == "float32"
    # a float32 model may ask for the bfloat16 exchange
    r = dptrain.train(**SMALL, comm_dtype="bfloat16", workers=2, backend="thread")
    assert r["config"]["comm_dtype"] == "bfloat16" and r["config"]["dtype"] == "float32"
