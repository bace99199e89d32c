"""Behaviour fixed after review: each test names the finding it guards."""
import os
import sys

import numpy as np
import pytest

from _core_helpers import cnn_spec, mlp_spec
from dptrain import _core, reference
from dptrain.models import MLP, load_model


def test_relu_propagates_nan_like_numpy():
    x = np.array([[np.nan, 1.0, -1.0]])
    y = np.empty_like(x)
    _core.relu_forward(x, y)
    assert np.isnan(y[0, 0]) and y[0, 1] == 1.0 and y[0, 2] == 0.0


def test_nan_weights_give_a_nan_loss_not_a_finite_one():
    m = MLP((4, 3, 2), dtype="float64")
    m.params[0] = np.nan
    loss, _ = m.loss_grad(np.ones((2, 4)), np.array([0, 1]))
    assert np.isnan(loss)


@pytest.mark.parametrize("row", [[1.0, np.nan, 3.0], [np.nan, np.nan, 1.0], [5.0, 5.0, 1.0]])
def test_argmax_follows_numpy_with_nan_and_ties(row):
    x = np.array([row])
    out = np.empty(1, np.int64)
    _core.argmax(x, out)
    assert out[0] == np.argmax(x, axis=1)[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_threaded_model_keeps_working_in_a_forked_child():
    m = MLP((64, 256, 10), threads=2)
    x = np.random.default_rng(0).random((128, 64), dtype=np.float32)
    y = np.zeros(128, np.int64)
    expected = m.loss_grad(x, y)[0]
    pid = os.fork()
    if pid == 0:                          # the child: its pool has no threads; must not hang
        try:
            ok = abs(m.loss_grad(x, y)[0] - expected) < 1e-4
            del m
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in a threaded kernel")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_model_plan_and_huge_sizes_are_checked():
    with pytest.raises(ValueError, match="sizes must be positive ints"):
        _core.model_plan(*mlp_spec([-5, 3]))
    n = 2**31 - 1
    with pytest.raises(ValueError, match=r"expected \(6442450944,\)"):   # 3 * 2**31, not negative
        _core.Model(*mlp_spec((n, 3)), np.zeros(66, np.float32), np.zeros(66, np.float32))


def test_sgd_rejects_negative_weight_decay():
    p = np.zeros(3)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        _core.sgd_step(p, np.zeros(3), None, lr=0.1, weight_decay=-1.0)


def test_load_model_rejects_damaged_files_with_their_name(tmp_path):
    m = MLP((4, 3, 2))
    good = tmp_path / "m.npz"
    m.save(good)
    cases = {
        "scalar.npz": dict(config=np.array(open(good, "rb") and str(np.load(good)["config"])),
                           params=np.float32(0.5), velocity=np.zeros(23, np.float32)),
        "f64.npz": dict(config=np.load(good)["config"], params=np.zeros(23),
                        velocity=np.zeros(23)),
        "novel.npz": dict(config=np.load(good)["config"], params=np.zeros(23, np.float32)),
        "nokind.npz": dict(config=np.array('{"sizes": [4, 3, 2]}'), params=np.zeros(23)),
    }
    for name, arrays in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            load_model(tmp_path / name)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="junk.npz is not a readable"):
        load_model(tmp_path / "junk.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ValueError, match="single .npy array"):
        load_model(tmp_path / "single.npy")
    assert np.array_equal(load_model(good).params, m.params)


def test_a_huge_batch_size_on_a_small_data_set_does_not_allocate_it():
    import dptrain
    r = dptrain.train(model="softmax", dataset="synthetic", n_samples=200, epochs=1,
                      batch_size=10**11, quiet=True)
    assert r["steps"] == 1


def test_gather_rows_and_zero_release_the_gil_and_check_their_arguments():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    out = np.empty((3, 4), np.float32)
    _core.gather_rows(x, np.array([5, 0, 5]), out)
    assert np.array_equal(out, x[[5, 0, 5]])
    y = np.arange(6, dtype=np.int64)
    yo = np.empty(2, np.int64)
    _core.gather_rows(y, np.array([4, 1]), yo)
    assert list(yo) == [4, 1]
    with pytest.raises(IndexError, match=r"index\[1\] = -1 is out of range for 6 rows"):
        _core.gather_rows(x, np.array([0, -1, 2]), out)
    with pytest.raises(ValueError, match=r"out has shape \(3, 4\), expected \(2, 4\)"):
        _core.gather_rows(x, np.array([0, 1]), out)
    with pytest.raises(TypeError, match="out has dtype float64"):
        _core.gather_rows(x, np.array([0, 1, 2]), np.empty((3, 4)))
    g = np.ones(10)
    _core.zero_(g)
    assert not g.any()
    with pytest.raises(ValueError, match="read-only"):
        ro = np.ones(3)
        ro.flags.writeable = False
        _core.zero_(ro)


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_evaluate_ends_a_backward_sweep_in_progress(kind):
    """evaluate/logits reuse the activation scratch: a backward step after them would read
    overwritten activations. The dense stack (then _core.Network) used to keep the sweep open
    (the conv blocks, then _core.ConvNet, did not); both now end it, and backward_layer says
    there is nothing to go back from."""
    rng = np.random.default_rng(0)
    if kind == "dense":
        sizes = (6, 5, 3)
        params = rng.standard_normal(_core.model_plan(*mlp_spec(sizes))["n_params"])
        net = _core.Model(*mlp_spec(sizes), params, np.zeros_like(params))
        x = rng.standard_normal((4, 6))
        last = len(sizes) - 2
    else:
        shape, ch, dense = (1, 6, 6), (2,), (4, 3)
        n = reference.model_plan(*cnn_spec(shape, ch, dense, 3, 0))["n_params"]
        params = rng.standard_normal(n) * 0.1
        net = _core.Model(*cnn_spec(shape, ch, dense, 3, 0), params, np.zeros_like(params))
        x = rng.standard_normal((4, 36))
        last = len(ch) + len(dense) - 1
    labels = np.array([0, 1, 2, 1])
    for forward_only in (lambda: net.evaluate(x, labels),
                         lambda: net.logits(x, np.empty((4, 3)))):
        net.forward_loss(x, labels)
        forward_only()
        with pytest.raises(RuntimeError, match="no forward_loss to go back from"):
            net.backward_layer(last)


@pytest.mark.parametrize("scale", [1e308, -1e308, 3e38, 0.5])
def test_softmax_xent_grad_scale_past_float32_gives_the_twins_infinities(scale):
    """grad_scale 1e308 is inf in float32: the label's gradient (p - 1) * inf is -inf (as
    the NumPy twin computes it), not p * inf - inf = NaN (the fuzzer's 503k-call campaign)."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 5)).astype(np.float32)
    z[0, 2] = 200.0                                 # a row whose softmax is exactly one-hot
    labels = np.array([2, 0, 4, 1, 3, 2])
    got, want = np.empty_like(z), np.empty_like(z)
    with np.errstate(over="ignore", invalid="ignore"):
        loss = _core.softmax_xent(z, labels, got, grad_scale=scale)
        ref_loss = reference.softmax_xent(z, labels, want, grad_scale=scale)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=0)
