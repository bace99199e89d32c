"""One parallel region per call (csrc/dp_model_tmpl.h, dp_threads_region): a model on T
threads runs each loss_grad, forward_loss, backward step and evaluate chunk as one region
whose parts meet at barriers, instead of a fork/join per kernel.

- dense models keep the bits of one thread on any T (their GEMMs cut the blocks that dp_gemm
  cuts, the row-wise work and the bias gradient's columns add in the same order), through
  every entry point, for batches smaller than T and for more threads than this machine has;
- conv models repeat their own bits at a given T (their images split over the threads as
  before, the partials added in thread order);
- a part that fails (a bad label, found by the loss on part 0) ends the region for every part
  at the same barrier: the call raises, nothing hangs, and the next call is right.
"""

from __future__ import annotations

import numpy as np
import pytest

import dptrain
from dptrain import _core, nn

DTYPES = ["float32", "float64"]


def _dense_models(dtype, threads):
    return {
        "mlp": dptrain.MLP([784, 256, 128, 10], seed=0, dtype=dtype, threads=threads),
        "acts": nn.Sequential(
            [nn.Dense(64), nn.Tanh(), nn.Dense(32), nn.GELU(), nn.Dense(10)],
            input_shape=(784,),
            dtype=dtype,
            threads=threads,
        ),
        # a one-column output: its GEMMs take the matrix-vector path, whole on part 0
        "mse": nn.Sequential(
            [nn.Dense(16), nn.Sigmoid(), nn.Dense(1)],
            input_shape=(784,),
            loss="mse",
            dtype=dtype,
            threads=threads,
        ),
    }


def _everything(model, x, y):
    """Every entry point's results: loss_grad, the layer-by-layer sweep, evaluate, logits."""
    model.zero_grad()
    fused = model.loss_grad(x, y)
    fused_grads = model.grads.copy()
    model.zero_grad()
    swept = model.forward_loss(x, y)
    for layer in reversed(range(len(model.layer_slices()))):
        model.backward_layer(layer)
    return fused, fused_grads, swept, model.grads.copy(), model.evaluate(x, y), model.logits(x)


def _same_bits(a, b, what):
    for i, (u, v) in enumerate(zip(a, b)):
        if isinstance(u, np.ndarray):
            assert u.dtype == v.dtype and np.array_equal(u.view(np.uint8), v.view(np.uint8)), (
                f"{what}: result {i} differs"
            )
        else:
            assert u == v, f"{what}: result {i}: {u} != {v}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3, 515, 2048])
def test_dense_models_keep_the_bits_of_one_thread_on_any_threads(dtype, batch):
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 784)).astype(dtype)
    labels = rng.integers(0, 10, batch)
    targets = rng.standard_normal((batch, 1)).astype(dtype)
    one = _dense_models(dtype, 1)
    for threads in (2, 3, 8, 16):  # 8, 16: more threads than the CI machine's cores
        for name, model in _dense_models(dtype, threads).items():
            y = targets if name == "mse" else labels
            want = _everything(one[name], x, y)
            got = _everything(model, x, y)
            _same_bits(got, want, f"{name} threads={threads} batch={batch} {dtype}")
            # the sweep is the fused call in steps: the same gradient
            _same_bits(got[1:2], got[3:4], f"{name} threads={threads} sweep vs loss_grad")


@pytest.mark.parametrize("threads", [2, 3])
def test_conv_models_repeat_their_bits_and_their_sweep_is_loss_grad(threads):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((37, 3 * 32 * 32)).astype(np.float32)
    y = rng.integers(0, 10, 37)
    models = [
        dptrain.CNN((3, 32, 32), seed=0, threads=threads),
        nn.Sequential(
            [nn.Conv2d(8, 3, padding=1), nn.MaxPool2(), nn.ReLU(), nn.Conv2d(4, 3), nn.Tanh()]
            + [nn.Flatten(), nn.Dense(10)],
            input_shape=(3, 32, 32),
            threads=threads,
        ),
    ]
    for model in models:
        first, again = _everything(model, x, y), _everything(model, x, y)
        _same_bits(again, first, f"{type(model).__name__} threads={threads} twice")
        _same_bits(first[1:2], first[3:4], f"{type(model).__name__} sweep vs loss_grad")
        assert first[0] == first[2]  # evaluate: the mean loss
        assert first[4][0] == pytest.approx(first[0][0] / len(y), rel=1e-5)


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_a_failing_part_ends_the_region_for_all_and_the_next_call_is_right(threads):
    # the core model: the label check is the C loss's (part 0), inside the region
    layers, shape = [("dense", 8), "relu", ("dense", 3)], (20,)
    model = dptrain.MLP([20, 8, 3], seed=0, threads=threads)
    params = model.params.copy()
    net = _core.Model(layers, shape, "softmax_xent", params, np.zeros_like(params), threads=threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 20)).astype(np.float32)
    bad = np.arange(10, dtype=np.int64) % 3
    bad[7] = 5
    for _ in range(50):  # a race between the failing part and the others would hang here
        with pytest.raises(ValueError, match=r"labels\[7\] = 5"):
            net.loss_grad(x, bad)
        with pytest.raises(ValueError, match=r"labels\[7\] = 5"):
            net.forward_loss(x, bad)
    good = bad.copy()
    good[7] = 1
    grads = np.zeros_like(params)
    got = net.loss_grad(x, good, 1.0, grads)
    ref = _core.Model(layers, shape, "softmax_xent", params, np.zeros_like(params), threads=1)
    want_grads = np.zeros_like(params)
    assert got == ref.loss_grad(x, good, 1.0, want_grads)
    assert np.array_equal(grads, want_grads)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_each_call_is_one_fork_join(threads):
    """loss_grad, forward_loss, each backward step and each evaluate chunk: one job of the
    team each (before: one per GEMM worth splitting, conv and pool stage; 5 for the MLP's
    loss_grad at batch 64)."""
    jobs = 1 if threads > 1 else 0
    rng = np.random.default_rng(1)
    for model, width in [
        (dptrain.MLP([784, 256, 128, 10], threads=threads), 784),
        (dptrain.CNN((3, 32, 32), threads=threads), 3 * 32 * 32),
    ]:
        net = model._net
        x = rng.standard_normal((64, width)).astype(np.float32)
        y = rng.integers(0, 10, 64)
        calls = [lambda: model.loss_grad(x, y), lambda: model.forward_loss(x, y)]
        calls += [lambda k=k: model.backward_layer(k) for k in reversed(range(net.n_param_layers))]
        calls += [lambda: model.evaluate(x, y)]
        for call in calls:
            before = net.team_jobs
            call()
            assert net.team_jobs - before == jobs, (type(model).__name__, threads)
