"""The convolutional network: its C kernels, the fused ConvNet, the CNN model, training.

- conv2d_forward/backward (and their loop twins) and maxpool2_forward/backward against the
  NumPy reference over odd shapes (sizes 1, 3, 7; padding 0 and 1; float32 and float64; every
  kernel ISA this CPU has, conftest.isa), with a tolerance relative to the magnitude
  of the summed terms (|got - want| <= RTOL sqrt(K) * sum of |terms|, as in test_core.py);
- central finite differences for conv and pool backward and for the whole CNN model;
- ConvNet against the reference network, also cut into forward_loss / backward_layer steps
  and split over threads; PyTorch's Conv2d/MaxPool2d/Linear stack on the same weights when
  torch is installed (a check of the layout conventions, not of our arithmetic);
- the boundary: bad arguments named, inputs untouched, no leaked references, the GIL released,
  two Python threads at once;
- training: 2 thread workers give the 1-worker weights, overlap works, the CLI runs, and the
  MNIST CNN reaches >= 98 % test accuracy in 2 epochs (about 25 s on 2 cores).
"""
import math
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain import _core as core
from dptrain import reference as ref
from dptrain.models import CNN, build_model, image_shape, load_model, named_spec

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"
needs_mnist = pytest.mark.skipif(not MNIST_DIR.is_dir(),
                                 reason=f"MNIST not present at {MNIST_DIR}")

DTYPES = [np.float32, np.float64]
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
JOIN_TIMEOUT_S = 60


def dname(dtype):
    return np.dtype(dtype).name


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def assert_close(got, want, scale, *, dtype, k, what):
    """|got - want| <= RTOL[dtype] * sqrt(k) * scale elementwise (scale: sum of |terms|)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    tol = RTOL[np.dtype(dtype)] * math.sqrt(max(k, 1)) * (np.asarray(scale, np.float64) + 1e-30)
    err = np.abs(got - want)
    bad = ~(err <= tol)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err / tol, 0))), want.shape)
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} values off; worst at {i}: got "
                    f"{got[i]!r}, expected {want[i]!r} (tolerance {tol[i]:.3g})")


# ---------------------------------------------------------------------------------------
# convolution against the reference

# (B, C, H, W, OC, KH, KW): sizes 1, 3, 7 mixed, non-square images and kernels, a kernel as
# large as the image, 1x1 (no im2col copy), and the two layers of the studies' CNN
CONV_SHAPES = [
    (1, 1, 1, 1, 1, 1, 1), (3, 1, 7, 7, 1, 3, 3), (1, 3, 7, 3, 7, 3, 3), (7, 3, 3, 7, 3, 1, 3),
    (3, 7, 7, 7, 3, 3, 1), (1, 3, 7, 7, 3, 7, 7), (3, 7, 3, 3, 7, 1, 1), (1, 7, 3, 7, 1, 3, 7),
    (2, 3, 32, 32, 32, 3, 3), (2, 32, 15, 15, 64, 3, 3),
]


def conv_cases(max_work=None):
    """(shape, padding) pairs whose kernel fits; max_work bounds B C OC H W (the loop twin)."""
    for shape in CONV_SHAPES:
        for pad in (0, 1):
            b, c, h, w, oc, kh, kw = shape
            if max_work and b * c * oc * h * w > max_work:
                continue
            if h + 2 * pad >= kh and w + 2 * pad >= kw:
                yield pytest.param(shape, pad, id="x".join(map(str, shape)) + f"-p{pad}")


def conv_data(shape, pad, dtype, tag=""):
    b, c, h, w, oc, kh, kw = shape
    rng = rng_for("conv", shape, pad, dname(dtype), tag)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    x = rng.standard_normal((b, c, h, w)).astype(dtype)
    wt = rng.standard_normal((oc, c, kh, kw)).astype(dtype)
    bias = rng.standard_normal(oc).astype(dtype)
    dy = rng.standard_normal((b, oc, oh, ow)).astype(dtype)
    return x, wt, bias, dy


def conv_magnitudes(x, w, b, dy, pad):
    """Sums of |terms| of every output of forward and backward (the reference on |.|)."""
    ax, aw, ab, ady = (np.abs(a).astype(np.float64) for a in (x, w, b, dy))
    y = np.empty(dy.shape)
    ref.conv2d_forward(ax, aw, ab, y, padding=pad)
    dw, db, dx = np.zeros(aw.shape), np.zeros(ab.shape), np.empty(ax.shape)
    ref.conv2d_backward(ady, ax, aw, dw, db, dx, padding=pad)
    return y, dw, db, dx


def check_conv(fwd, bwd, shape, pad, dtype, what, **kw):
    x, w, b, dy = conv_data(shape, pad, dtype)
    inputs = [a.copy() for a in (x, w, b, dy)]
    y_mag, dw_mag, db_mag, dx_mag = conv_magnitudes(x, w, b, dy, pad)
    k_fwd = w[0].size
    what = f"{what} shape={shape} padding={pad} dtype={dname(dtype)}"

    y, y_ref = np.full(dy.shape, np.nan, dtype), np.empty(dy.shape, dtype)
    fwd(x, w, b, y, padding=pad, **kw)
    ref.conv2d_forward(x, w, b, y_ref, padding=pad)
    assert_close(y, y_ref, y_mag, dtype=dtype, k=k_fwd, what=f"{what}: y")

    # dw, db accumulate onto what is there; dx is written over NaN
    start_w = rng_for("start", shape).standard_normal(w.shape).astype(dtype)
    start_b = rng_for("start_b", shape).standard_normal(b.shape).astype(dtype)
    dw, db, dx = start_w.copy(), start_b.copy(), np.full(x.shape, np.nan, dtype)
    dw_ref, db_ref, dx_ref = start_w.copy(), start_b.copy(), np.empty(x.shape, dtype)
    bwd(dy, x, w, dw, db, dx, padding=pad, **kw)
    ref.conv2d_backward(dy, x, w, dw_ref, db_ref, dx_ref, padding=pad)
    positions = dy[0, 0].size * dy.shape[0]
    assert_close(dw, dw_ref, dw_mag + np.abs(start_w), dtype=dtype, k=positions, what=f"{what}: dw")
    assert_close(db, db_ref, db_mag + np.abs(start_b), dtype=dtype, k=positions, what=f"{what}: db")
    assert_close(dx, dx_ref, dx_mag, dtype=dtype, k=w.shape[0] * w[0, 0].size, what=f"{what}: dx")
    # without dx, dw and db are the same
    dw2, db2 = start_w.copy(), start_b.copy()
    bwd(dy, x, w, dw2, db2, padding=pad, **kw)
    np.testing.assert_array_equal(dw2, dw, err_msg=f"{what}: dw without dx")
    for before, after, name in zip(inputs, (x, w, b, dy), ("x", "w", "b", "dy")):
        np.testing.assert_array_equal(after, before, err_msg=f"{what}: input {name} modified")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape,pad", list(conv_cases()))
def test_conv2d_matches_reference(isa, shape, pad, dtype):
    check_conv(core.conv2d_forward, core.conv2d_backward, shape, pad, dtype,
               f"conv2d[{isa}]")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape,pad", list(conv_cases(max_work=20000)))
def test_conv2d_naive_twin_matches_reference(shape, pad, dtype):
    check_conv(core.conv2d_forward_naive, core.conv2d_backward_naive, shape, pad, dtype,
               "conv2d_naive")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_conv2d_with_a_context(threads, dtype):
    ctx = core.Context(threads=threads)
    for shape, pad in [((3, 7, 7, 7, 3, 3, 1), 1), ((2, 32, 15, 15, 64, 3, 3), 0)]:
        check_conv(core.conv2d_forward, core.conv2d_backward, shape, pad, dtype,
                   f"conv2d[Context(threads={threads})]", ctx=ctx)


# ---------------------------------------------------------------------------------------
# pooling against the reference

POOL_SHAPES = [(1, 1, 2, 2), (3, 1, 7, 7), (1, 3, 7, 3), (7, 3, 3, 7), (2, 7, 30, 30),
               (2, 3, 13, 13), (1, 2, 2, 41), (3, 2, 33, 18)]


def pool_input(shape, dtype, tag=""):
    """Random values with ties (a coarse grid), NaNs and -inf, so that the argmax rule shows."""
    rng = rng_for("pool", shape, dname(dtype), tag)
    x = np.round(rng.standard_normal(shape) * 2) / 2
    x[rng.random(shape) < 0.03] = np.nan
    x[rng.random(shape) < 0.03] = -np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_maxpool2_matches_reference_exactly(isa, shape, dtype):
    x = pool_input(shape, dtype)
    x_in = x.copy()
    out_shape = (shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    y, idx = np.full(out_shape, 7, dtype), np.full(out_shape, 9, np.uint8)
    y_ref, idx_ref = np.empty(out_shape, dtype), np.empty(out_shape, np.uint8)
    core.maxpool2_forward(x, y, idx)
    ref.maxpool2_forward(x, y_ref, idx_ref)
    what = f"maxpool2 shape={shape} dtype={dname(dtype)}"
    np.testing.assert_array_equal(idx, idx_ref, err_msg=f"{what}: idx")
    np.testing.assert_array_equal(y, y_ref, err_msg=f"{what}: y")   # NaN == NaN here
    np.testing.assert_array_equal(x, x_in, err_msg=f"{what}: x modified")

    dy = rng_for("pool dy", shape).standard_normal(out_shape).astype(dtype)
    dx, dx_ref = np.full(shape, np.nan, dtype), np.empty(shape, dtype)
    core.maxpool2_backward(dy, idx, dx)
    ref.maxpool2_backward(dy, idx, dx_ref)
    np.testing.assert_array_equal(dx, dx_ref, err_msg=f"{what}: dx")
    assert np.isfinite(dx).all(), f"{what}: dx not fully written"


def test_maxpool2_picks_the_first_maximum_and_nan(isa):
    x = np.array([[[[1, 3, 0, 5, 2, 2, 7],
                    [3, 2, 5, 5, 2, 2, 7],
                    [np.nan, 1, 0, 0, 9, 9, 9]]]], dtype=np.float32)
    y, idx = np.empty((1, 1, 1, 3), np.float32), np.empty((1, 1, 1, 3), np.uint8)
    core.maxpool2_forward(x, y, idx)
    assert idx.ravel().tolist() == [1, 1, 0]          # ties: the first in (0,0),(0,1),(1,0),(1,1)
    assert y.ravel().tolist() == [3, 5, 2]
    x[0, 0, 1, 0] = np.nan
    core.maxpool2_forward(x, y, idx)
    assert idx[0, 0, 0, 0] == 2 and np.isnan(y[0, 0, 0, 0])


# ---------------------------------------------------------------------------------------
# finite differences (float64)


def numeric_grad(f, a, eps=1e-6):
    g = np.empty_like(a)
    flat, gflat = a.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


@pytest.mark.parametrize("pad", [0, 1])
def test_conv2d_backward_matches_finite_differences(pad):
    rng = np.random.default_rng(pad)
    x = rng.standard_normal((2, 2, 5, 4))
    w = rng.standard_normal((3, 2, 3, 2))
    b = rng.standard_normal(3)
    oh, ow = 5 + 2 * pad - 2, 4 + 2 * pad - 1
    g = rng.standard_normal((2, 3, oh, ow))

    def loss():
        y = np.empty(g.shape)
        core.conv2d_forward(x, w, b, y, padding=pad)
        return float((g * y).sum())

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    core.conv2d_backward(g, x, w, dw, db, dx, padding=pad)
    for name, analytic, arr in (("dw", dw, w), ("db", db, b), ("dx", dx, x)):
        numeric = numeric_grad(loss, arr)
        err = np.abs(analytic - numeric).max() / np.abs(numeric).max()
        assert err < 1e-8, f"conv2d_backward padding={pad}: {name} relative error {err:.2e}"


def test_maxpool2_backward_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 10.0   # distinct: no ties
    out_shape = (2, 3, 3, 3)
    g = rng.standard_normal(out_shape)
    y, idx = np.empty(out_shape), np.empty(out_shape, np.uint8)

    def loss():
        core.maxpool2_forward(x, y, idx)
        return float((g * y).sum())

    loss()
    dx = np.empty_like(x)
    core.maxpool2_backward(g, idx, dx)
    numeric = numeric_grad(loss, x, eps=1e-4)
    np.testing.assert_allclose(dx, numeric, atol=1e-9)


@pytest.mark.parametrize("kernel,padding", [(3, 0), (3, 1), (2, 1)])
def test_cnn_model_gradient_matches_finite_differences(kernel, padding):
    m = CNN((2, 11, 10), 3, channels=(2, 3), hidden=(5,), kernel=kernel, padding=padding,
            dtype="float64", seed=1)
    rng = np.random.default_rng(kernel + padding)
    x = rng.standard_normal((6, 2 * 11 * 10))
    y = rng.integers(0, 3, 6)
    m.forward_backward(x, y)
    analytic = m.grads.copy()
    numeric = numeric_grad(lambda: m.evaluate(x, y)[0], m.params)
    err = np.abs(analytic - numeric).max() / np.abs(numeric).max()
    assert err < 1e-6, f"CNN kernel={kernel} padding={padding}: relative gradient error {err:.2e}"


# ---------------------------------------------------------------------------------------
# ConvNet against the reference network

# (input_shape, channels, dense, kernel, padding)
NETS = [
    ((1, 12, 10), (3, 4), (6, 5), 3, 0),
    ((2, 9, 9), (4,), (7, 3), 3, 1),
    ((3, 8, 8), (2, 3), (4,), 1, 0),
    ((3, 9, 7), (2, 3), (4,), 1, 0),
    ((1, 28, 28), (32, 64), (128, 10), 3, 0),
    ((3, 32, 32), (32, 64), (128, 10), 3, 0),
]


def net_id(case):
    shape, ch, dense, k, p = case
    dims = "x".join(map(str, shape))
    return f"{dims}-c{'.'.join(map(str, ch))}-d{'.'.join(map(str, dense))}-k{k}p{p}"


def net_data(case, dtype, batch=13, tag=""):
    shape, ch, dense, k, p = case
    params = ref.cnn_init_params(shape, ch, dense, 1, dtype, k, p)
    rng = rng_for("net", case, dname(dtype), tag)
    x = rng.standard_normal((batch, math.prod(shape))).astype(dtype)
    labels = rng.integers(0, dense[-1], batch)
    start = rng.standard_normal(params.size).astype(dtype)
    return params, x, labels, start


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NETS, ids=net_id)
def test_convnet_matches_reference(isa, case, dtype, threads):
    shape, ch, dense, k, p = case
    params, x, labels, start = net_data(case, dtype)
    grads, grads_ref = start.copy(), start.copy()
    net = core.ConvNet(shape, ch, dense, params, grads, kernel=k, padding=p, threads=threads)
    assert net.n_params == params.size == ref.cnn_n_params(shape, ch, dense, k, p)
    assert net.sizes == ref.cnn_sizes(shape, ch, dense, k, p)
    what = f"ConvNet {net_id(case)} dtype={dname(dtype)} threads={threads}"
    loss, correct = net.loss_grad(x, labels, 0.25)
    loss_ref, correct_ref = ref.cnn_loss_grad(shape, ch, dense, params, grads_ref, x, labels,
                                              0.25, kernel=k, padding=p)
    rtol = 2e-5 if dtype == np.float32 else 1e-11
    assert correct == correct_ref, what
    assert abs(loss - loss_ref) <= rtol * abs(loss_ref), f"{what}: loss {loss} vs {loss_ref}"
    diff = grads.astype(np.float64) - grads_ref
    scale = np.abs(grads_ref - start).max()
    assert np.abs(diff).max() <= 10 * rtol * scale, (
        f"{what}: grads off by {np.abs(diff).max():.3g} (scale {scale:.3g})")
    logits, logits_ref = np.empty((len(x), dense[-1]), dtype), np.empty((len(x), dense[-1]), dtype)
    net.logits(x, logits)
    ref.cnn_logits(shape, ch, dense, params, x, logits_ref, kernel=k, padding=p)
    np.testing.assert_allclose(logits, logits_ref, rtol=rtol, atol=rtol * np.abs(logits_ref).max(),
                               err_msg=what)
    ev = net.evaluate(x, labels)
    assert ev[1] == correct and abs(ev[0] - loss) <= rtol * abs(loss), f"{what}: evaluate {ev}"


@pytest.mark.parametrize("case", NETS[:3], ids=net_id)
def test_convnet_steps_equal_loss_grad(case):
    shape, ch, dense, k, p = case
    params, x, labels, _ = net_data(case, np.float64)
    g1, g2 = np.zeros_like(params), np.zeros_like(params)
    net = core.ConvNet(shape, ch, dense, params, g1, kernel=k, padding=p, threads=2)
    whole = net.loss_grad(x, labels)
    step = net.forward_loss(x, labels)
    n_layers = len(ch) + len(dense)
    with pytest.raises(RuntimeError, match=f"out of order: the next layer is {n_layers - 1}"):
        net.backward_layer(0, grads=g2)
    for layer in reversed(range(n_layers)):
        net.backward_layer(layer, grads=g2)
    assert step == whole
    np.testing.assert_array_equal(g2, g1)
    with pytest.raises(RuntimeError, match="no forward_loss to go back from"):
        net.backward_layer(0, grads=g2)


def test_evaluate_in_chunks_equals_one_pass():
    """More rows than one evaluation chunk (256): the chunks' sums add up."""
    case = ((1, 8, 8), (2,), (4, 3), 3, 0)
    params, x, labels, _ = net_data(case, np.float64, batch=600)
    net = core.ConvNet(*case[:3], params, np.zeros_like(params))
    loss, correct = net.evaluate(x, labels)
    loss_ref, correct_ref = ref.cnn_evaluate(*case[:3], params, x, labels)
    assert correct == correct_ref and abs(loss - loss_ref) < 1e-10 * loss_ref


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_cnn_matches_pytorch(shape):
    """Our layout conventions (NCHW rows, W (OC, C, KH, KW), flatten order, pooling floor)
    are PyTorch's: the same weights give the same loss and gradients."""
    torch = pytest.importorskip("torch")
    m = CNN(shape, 10, dtype="float64", seed=3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, math.prod(shape)))
    y = rng.integers(0, 10, 4)
    loss = m.forward_backward(x, y)
    c = shape[0]
    net = torch.nn.Sequential(
        torch.nn.Conv2d(c, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(m.sizes[2], 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).double()
    params = [p for p in net.parameters()]
    flat = [a for wb in m.layers() for a in wb]
    assert [tuple(p.shape) for p in params] == [a.shape for a in flat]
    with torch.no_grad():
        for p, a in zip(params, flat):
            p.copy_(torch.from_numpy(a))
    t_loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x).reshape(4, *shape)),
                                               torch.from_numpy(y))
    t_loss.backward()
    assert abs(t_loss.item() - loss) < 1e-12
    for p, (i, g) in zip(params, enumerate(a for wb in m.grad_layers() for a in wb)):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=f"parameter tensor {i}")


# ---------------------------------------------------------------------------------------
# the CNN model


def test_cnn_architecture_and_parameter_count():
    cifar = build_model("cnn", 3072, 10)
    assert cifar.input_shape == (3, 32, 32) and cifar.sizes == (3072, 7200, 2304, 128, 10)
    # PyTorch's count for conv(3->32,3x3), conv(32->64,3x3), fc(2304->128), fc(128->10)
    assert cifar.n_params == (32 * 27 + 32) + (64 * 288 + 64) + (2304 * 128 + 128) + 1290
    mnist = build_model("cnn", 784, 10)
    assert mnist.input_shape == (1, 28, 28) and mnist.sizes[2] == 1600
    assert mnist.n_params == 320 + 18496 + (1600 * 128 + 128) + 1290
    for m in (cifar, mnist):
        spec = named_spec("cnn", m.n_features, 10)     # planned, not allocated
        assert tuple(spec["sizes"]) == m.sizes and spec["n_params"] == m.n_params
        assert spec == m.spec()
        slices = m.layer_slices()
        assert slices[0][0] == 0 and slices[-1][1] == m.n_params and len(slices) == 4
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
    assert image_shape(12544) == (1, 112, 112) and image_shape(27) == (3, 3, 3)
    with pytest.raises(ValueError, match="20 features, neither s\\*s nor 3\\*s\\*s"):
        build_model("cnn", 20, 2)
    # a data set that knows its sample shape passes it
    wide = build_model("cnn", 3 * 12 * 20, 4, input_shape=(3, 12, 20))
    assert wide.input_shape == (3, 12, 20)
    spec = named_spec("cnn", 720, 4, input_shape=(3, 12, 20))
    assert tuple(spec["sizes"]) == wide.sizes and spec["n_params"] == wide.n_params
    with pytest.raises(ValueError, match="input_shape \\(3, 12, 21\\) is not a \\(C, H, W\\) of"):
        build_model("cnn", 720, 4, input_shape=(3, 12, 21))


def test_cnn_takes_image_batches_as_pytorch_passes_them():
    # (B, C, H, W) is viewed as the flat rows: the same loss, gradient, logits and evaluation,
    # and the caller's array is not copied or changed
    rng = np.random.default_rng(3)
    images = rng.standard_normal((6, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    flat_model = CNN((3, 8, 8), 4, channels=(4,), hidden=(8,), seed=1)
    image_model = CNN((3, 8, 8), 4, channels=(4,), hidden=(8,), seed=1)
    before = images.copy()
    assert flat_model.loss_grad(images.reshape(6, -1), y) == image_model.loss_grad(images, y)
    np.testing.assert_array_equal(flat_model.grads, image_model.grads)
    assert np.array_equal(images, before)
    np.testing.assert_array_equal(flat_model.logits(images.reshape(6, -1)),
                                  image_model.logits(images))
    np.testing.assert_array_equal(flat_model.predict(images.reshape(6, -1)),
                                  image_model.predict(images))
    assert flat_model.evaluate(images.reshape(6, -1), y) == image_model.evaluate(images, y)
    assert image_model._rows(images).base is images          # a view, no copy
    with pytest.raises(ValueError, match=r"x has shape \(6, 3, 8, 7\), expected \(B, 192\) "
                                         r"rows or \(B, 3, 8, 8\) samples"):
        image_model.loss_grad(images[..., :7].copy(), y)
    with pytest.raises(ValueError, match="not C-contiguous: pass np.ascontiguousarray"):
        image_model.logits(np.asfortranarray(images))


def test_cnn_init_is_pytorch_default_and_seeded():
    a, b = CNN(seed=5), CNN(seed=5)
    assert np.array_equal(a.params, b.params)
    assert not np.array_equal(a.params, CNN(seed=6).params)
    for (w, bias), fan_in in zip(a.layers(), (9, 288, 1600, 128)):
        bound = 1 / math.sqrt(fan_in)
        assert np.abs(w).max() <= bound and np.abs(bias).max() <= bound
        assert np.abs(w).max() > 0.9 * bound
    saved = a.params.copy()
    a.params[:] = 0
    a.reset_parameters()
    np.testing.assert_array_equal(a.params, saved)


def test_cnn_buffers_can_be_caller_owned_and_grads_accumulate(tmp_path):
    n = CNN((1, 8, 8), 3, channels=(2,), hidden=(4,)).n_params
    params, grads = np.zeros(n, np.float32), np.zeros(n, np.float32)
    m = CNN((1, 8, 8), 3, channels=(2,), hidden=(4,), params=params, grads=grads)
    assert m.params is params and m.grads is grads
    assert not params.any()                  # given buffers are used as they are
    m.reset_parameters()
    x, y = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32), np.arange(5) % 3
    m.loss_grad(x, y)
    once = grads.copy()
    m.loss_grad(x, y)
    np.testing.assert_allclose(grads, 2 * once, rtol=1e-6)
    m.zero_grad()
    assert not grads.any()
    with pytest.raises(ValueError, match=rf"grads has dtype float64 and shape \({n},\)"):
        CNN((1, 8, 8), 3, channels=(2,), hidden=(4,), grads=np.zeros(n))
    # save / load
    m.velocity[:] = 0.5
    path = tmp_path / "cnn.npz"
    m.save(path)
    back = load_model(path)
    assert isinstance(back, CNN) and back.input_shape == (1, 8, 8) and back.channels == (2,)
    np.testing.assert_array_equal(back.params, m.params)
    np.testing.assert_array_equal(back.velocity, m.velocity)
    with pytest.raises(ValueError, match="channels"):
        CNN((1, 8, 8), 3, channels=(3,), hidden=(4,)).load_state(path)


# ---------------------------------------------------------------------------------------
# the boundary


def small_convnet(threads=1, dtype=np.float32):
    case = ((2, 8, 7), (3,), (5, 4), 3, 1)
    params, x, labels, _ = net_data(case, dtype, batch=9)
    grads = np.zeros_like(params)
    return core.ConvNet(*case[:3], params, grads, kernel=3, padding=1, threads=threads), x, labels


def conv_args(dtype=np.float32):
    x, w, b, dy = conv_data((2, 3, 7, 6, 4, 3, 3), 0, dtype)
    return x, w, b, np.empty(dy.shape, dtype), dy


BAD_CALLS = {
    "x dtype": (lambda x, w, b, y, dy: core.conv2d_forward(x.astype(np.float16), w, b, y),
                TypeError, "x has dtype float16, expected float32 or float64"),
    "w dtype": (lambda x, w, b, y, dy: core.conv2d_forward(x, w.astype(np.float64), b, y),
                TypeError, "w has dtype float64, expected float32 \\(the dtype of x\\)"),
    "x ndim": (lambda x, w, b, y, dy: core.conv2d_forward(x[0], w, b, y),
               ValueError, "x has shape \\(3, 7, 6\\), expected a 4-D array"),
    "channels": (lambda x, w, b, y, dy: core.conv2d_forward(x, w[:, :2].copy(), b, y),
                 ValueError, "w.shape\\[1\\] must be x's channel count 3"),
    "y shape": (lambda x, w, b, y, dy: core.conv2d_forward(x, w, b,
                                                         np.empty((2, 4, 4, 4), np.float32)),
                ValueError, "y has shape \\(2, 4, 4, 4\\), expected \\(2, 4, 5, 4\\)"),
    "b shape": (lambda x, w, b, y, dy: core.conv2d_forward(x, w, b[:3], y),
                ValueError, "b has shape \\(3,\\), expected \\(4,\\)"),
    "kernel too big": (lambda x, w, b, y, dy: core.conv2d_forward(
        np.ascontiguousarray(x[:, :, :2]), w, b, np.empty((2, 4, 1, 4), np.float32)),
        ValueError, "3x3 kernel is larger than the 2x6 input"),
    "padding": (lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, y, padding=-1),
                ValueError, "padding must be >= 0, got -1"),
    "not contiguous": (lambda x, w, b, y, dy: core.conv2d_forward(x[:, :, :, ::-1], w, b, y),
                       ValueError, "x must be C-contiguous"),
    "read-only y": (lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, _readonly(y)),
                    ValueError, "y is read-only"),
    "y aliases x": (lambda x, w, b, y, dy: core.conv2d_forward(
        x, w, b, x.reshape(-1)[:y.size].reshape(y.shape)),
        ValueError, "y shares memory with x"),
    "dy shape": (lambda x, w, b, y, dy: core.conv2d_backward(
        dy[:1], x, w, np.zeros_like(w), np.zeros_like(b)),
        ValueError, "dy has shape \\(1, 4, 5, 4\\), expected \\(2, 4, 5, 4\\)"),
    "dw shape": (lambda x, w, b, y, dy: core.conv2d_backward(
        dy, x, w, np.zeros_like(w)[:2], np.zeros_like(b)),
        ValueError, "dw has shape \\(2, 3, 3, 3\\), expected \\(4, 3, 3, 3\\)"),
    "dx aliases x": (lambda x, w, b, y, dy: core.conv2d_backward(
        dy, x, w, w.copy(), np.zeros_like(b), x),
        ValueError, "dx shares memory with x"),
    "ctx": (lambda x, w, b, y, dy: core.conv2d_forward(x, w, b, y, ctx="fast"),
            TypeError, "ctx must be a dptrain._core.Context or None, got str"),
    "pool idx dtype": (lambda x, w, b, y, dy: core.maxpool2_forward(
        x, np.empty((2, 3, 3, 3), np.float32), np.empty((2, 3, 3, 3), np.int64)),
        TypeError, "idx has dtype int64, expected uint8"),
    "pool y shape": (lambda x, w, b, y, dy: core.maxpool2_forward(
        x, np.empty((2, 3, 3, 2), np.float32), np.empty((2, 3, 3, 2), np.uint8)),
        ValueError, "y has shape \\(2, 3, 3, 2\\), expected \\(2, 3, 3, 3\\)"),
    "pool too small": (lambda x, w, b, y, dy: core.maxpool2_forward(
        np.ascontiguousarray(x[:, :, :1]), np.empty((2, 3, 0, 3), np.float32),
        np.empty((2, 3, 0, 3), np.uint8)),
        ValueError, "2x2 pooling needs H >= 2 and W >= 2"),
    "pool idx value": (lambda x, w, b, y, dy: core.maxpool2_backward(
        np.ones((2, 3, 3, 3), np.float32), np.full((2, 3, 3, 3), 4, np.uint8), x),
        ValueError, "idx holds 4 at flat position 0: a window position is 0..3"),
}


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_kernel_arguments_are_named(name):
    fn, exc, pattern = BAD_CALLS[name]
    args = conv_args()
    before = [a.copy() for a in args]
    with pytest.raises(exc, match=pattern):
        fn(*args)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: an argument was modified")


def test_bad_convnet_arguments_are_named():
    p = np.zeros(ref.cnn_n_params((1, 8, 8), (2,), (3,)), np.float32)
    g = np.zeros_like(p)
    cases = [
        (dict(input_shape=(1, 8)), ValueError, "input_shape has 2 entries, expected \\(C, H, W\\)"),
        (dict(input_shape=(1, 6, 6), channels=(2, 2)), ValueError,
         "conv layer 1 gets a \\(2, 2, 2\\) input: a 3x3 kernel with padding 0 leaves no 2x2"),
        (dict(input_shape=(1, 3, 3)), ValueError, "conv layer 0 gets a \\(1, 3, 3\\) input"),
        (dict(dense=(1,)), ValueError, "dense\\[-1\\] is the class count and must be >= 2"),
        (dict(dense=(0, 3)), ValueError, "dense\\[0\\] = 0, expected a positive size"),
        (dict(kernel=0), ValueError, "kernel must be >= 1, got 0"),
        (dict(padding=-2), ValueError, "padding must be >= 0, got -2"),
        (dict(threads=0), ValueError, "threads must be in \\[1, "),
        (dict(params=p[:-1]), ValueError, f"params has shape \\({p.size - 1},\\), expected"),
        (dict(grads=g.astype(np.float64)), TypeError, "grads has dtype float64, expected float32"),
        (dict(grads=p), ValueError, "grads shares memory with params"),
        (dict(channels=("a",)), TypeError, "channels\\[0\\] must be an int, got str"),
        (dict(channels=7), TypeError, "channels must be a sequence of ints, got int"),
    ]
    for change, exc, pattern in cases:
        kw = dict(input_shape=(1, 8, 8), channels=(2,), dense=(3,), params=p, grads=g)
        kw.update(change)
        extra = {k: kw.pop(k) for k in ("kernel", "padding", "threads") if k in kw}
        with pytest.raises(exc, match=pattern):
            core.ConvNet(kw["input_shape"], kw["channels"], kw["dense"], kw["params"],
                         kw["grads"], **extra)
    net = core.ConvNet((1, 8, 8), (2,), (3,), p, g)
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(ValueError, match="x has shape \\(4, 63\\), expected \\(4, 64\\)"):
        net.loss_grad(x[:, :63].copy(), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="labels\\[2\\] = 3 is out of range"):
        net.loss_grad(x, np.array([0, 1, 3, 0]))
    with pytest.raises(TypeError, match="x has dtype float64, expected float32"):
        net.evaluate(x.astype(np.float64), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="grads shares memory with params"):
        net.loss_grad(x, np.zeros(4, np.int64), grads=p)
    assert not g.any(), "a refused call wrote into grads"


def test_no_reference_leaks():
    net, x, labels = small_convnet()
    x4, w, b, y, _ = conv_args()
    objs = [net.params, net.grads, x, labels, x4, w, b, y]
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(200):
        net.loss_grad(x, labels)
        net.evaluate(x, labels)
        core.conv2d_forward(x4, w, b, y)
        with pytest.raises(ValueError):
            net.loss_grad(x[:, 1:].copy(), labels)
    net.forward_loss(x, labels)
    for layer in reversed(range(3)):
        net.backward_layer(layer)
    assert [sys.getrefcount(o) for o in objs] == before


def gil_cases():
    x = np.random.default_rng(0).standard_normal((64, 16, 30, 30)).astype(np.float32)
    w = np.ones((32, 16, 3, 3), np.float32)
    b = np.zeros(32, np.float32)
    y = np.empty((64, 32, 28, 28), np.float32)
    p, idx = np.empty((64, 32, 14, 14), np.float32), np.empty((64, 32, 14, 14), np.uint8)
    core.maxpool2_forward(y, p, idx)
    m = CNN((1, 28, 28), 10)
    mx = np.random.default_rng(1).standard_normal((256, 784)).astype(np.float32)
    my = np.arange(256) % 10
    return {
        "conv2d_forward": lambda: core.conv2d_forward(x, w, b, y),
        "conv2d_backward": lambda: core.conv2d_backward(y, x, w, np.zeros_like(w), b.copy()),
        "maxpool2_forward": lambda: core.maxpool2_forward(y, p, idx),
        "maxpool2_backward": lambda: core.maxpool2_backward(p, idx, y),
        "ConvNet.loss_grad": lambda: m.loss_grad(mx, my),
        "ConvNet.evaluate": lambda: m.evaluate(mx, my),
    }


@pytest.mark.parametrize("kernel", ["conv2d_forward", "conv2d_backward", "maxpool2_forward",
                                    "maxpool2_backward", "ConvNet.loss_grad",
                                    "ConvNet.evaluate"])
def test_kernel_releases_the_gil(kernel, gil_probe):
    assert gil_probe(gil_cases()[kernel]), (
        f"{kernel}: the main thread never ran while the worker was inside the call")


def run_threads(targets):
    barrier = threading.Barrier(len(targets))
    results, errors = [None] * len(targets), []

    def body(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i, fn), daemon=True)
               for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
        assert not t.is_alive(), f"a thread did not finish in {JOIN_TIMEOUT_S} s: deadlock?"
    if errors:
        raise errors[0]
    return results


def test_two_threads_with_their_own_networks_match_sequential():
    def job(threads):
        net, x, labels = small_convnet(threads)
        return lambda: ([net.loss_grad(x, labels) for _ in range(5)], net.grads.copy())

    seq = [job(t)() for t in (1, 2)]
    par = run_threads([job(1), job(2)])
    for (losses, grads), (want_losses, want_grads) in zip(par, seq):
        assert losses == want_losses
        np.testing.assert_array_equal(grads, want_grads)


def test_two_threads_sharing_one_network_and_one_context():
    """Calls on one ConvNet (or one Context) serialize: each thread gets its own batch's
    result and the gradients sum up as if the calls had run one after another."""
    net, x0, labels0 = small_convnet(threads=2)
    x1, labels1 = x0[::-1].copy(), labels0[::-1].copy()
    solo0 = net.loss_grad(x0, labels0)
    g0 = net.grads.copy()
    solo1 = net.loss_grad(x1, labels1)
    g1 = net.grads - g0
    net.grads[:] = 0
    ctx = core.Context(threads=2)
    x, w, b, y, dy = conv_args()
    y_want = np.empty_like(y)
    core.conv2d_forward(x, w, b, y_want)

    def worker(xx, ll):
        def run():
            out = [net.loss_grad(xx, ll) for _ in range(6)]
            yy = np.empty_like(y)
            for _ in range(6):
                core.conv2d_forward(x, w, b, yy, ctx=ctx)
            return out, yy
        return run

    (r0, y0), (r1, y1) = run_threads([worker(x0, labels0), worker(x1, labels1)])
    assert r0 == [solo0] * 6 and r1 == [solo1] * 6
    want = 6 * (g0.astype(np.float64) + g1)
    np.testing.assert_allclose(net.grads, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(y0, y_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y0, y1)


# ---------------------------------------------------------------------------------------
# training


def _train(**kw):
    kw.setdefault("quiet", True)
    kw.setdefault("allow_download", False)
    return dptrain.train(**kw)


# 12x12 "images" of the synthetic binary set: a CNN small enough for many steps in a test
SMALL = dict(model="cnn", dataset="synthetic", n_samples=384, n_features=144, batch_size=64,
             epochs=1, lr=0.05, momentum=0.9, seed=3)


def test_two_workers_give_the_one_worker_weights():
    one = _train(**SMALL)
    two = _train(**SMALL, workers=2, backend="thread")
    assert one["steps"] == two["steps"] == 6
    sizes = one["model"]["sizes"]
    assert one["model"]["n_params"] == named_spec("cnn", sizes[0], sizes[-1])["n_params"]
    np.testing.assert_allclose(two["params"], one["params"], rtol=0, atol=1e-5)
    assert not np.array_equal(one["params"], _train(**{**SMALL, "epochs": 2})["params"])


def test_overlap_and_buckets_work_for_the_cnn():
    plain = _train(**SMALL, workers=2, backend="thread")
    over = _train(**SMALL, workers=2, backend="thread", overlap=True, bucket_kb=16)
    np.testing.assert_allclose(over["params"], plain["params"], rtol=0, atol=1e-6)


def test_cli_trains_the_cnn(tmp_path, capsys):
    from dptrain.cli import main
    out = tmp_path / "r.json"
    rc = main(["train", "--model", "cnn", "--dataset", "synthetic", "--n-samples", "256",
               "--n-features", "144", "--epochs", "1", "--batch-size", "64", "--lr", "0.05",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "cnn (144, 800, 64, 128, 2)" in capsys.readouterr().out
    assert out.is_file()
    rc = main(["train", "--model", "cnn", "--dataset", "synthetic", "--n-samples", "256",
               "--epochs", "1"])
    assert rc == 1 and "neither s*s nor 3*s*s" in capsys.readouterr().err


@pytest.mark.slow
@needs_mnist
def test_mnist_cnn_reaches_98_percent_in_2_epochs():
    r = _train(model="cnn", dataset="mnist", data_dir=MNIST_DIR, epochs=2, batch_size=128,
               lr=0.05, momentum=0.9, threads=2, seed=0)
    assert r["dataset"]["source"].startswith(str(MNIST_DIR)), r["dataset"]
    assert r["model"]["sizes"] == [784, 5408, 1600, 128, 10]
    assert r["final_test_accuracy"] >= 0.98, r["test_accuracy"]
