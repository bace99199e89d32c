"""The convolutional network as a model: dptrain.models.CNN's gradient against central finite
differences and against PyTorch's Conv2d/MaxPool2d/Linear stack on the same weights (when torch
is installed: a check of the layout conventions, not of our arithmetic), its architecture and
parameter count, image batches as PyTorch passes them, its initialization, caller-owned
buffers and save/load; training: 2 thread workers give the 1-worker weights, overlap works,
the CLI runs, and the MNIST CNN reaches >= 98 % test accuracy in 2 epochs (about 25 s on 2
cores). (Its kernels: test_conv.py and test_pool.py; the engine's conv blocks:
test_model_core.py.)
"""

import math

import numpy as np
import pytest
from _core_helpers import numeric_grad
from _mnist import find_mnist, mnist_mark

import dptrain
from dptrain.models import CNN, build_model, image_shape, load_model, named_spec

MNIST_DIR, needs_mnist = find_mnist(), mnist_mark()


@pytest.mark.parametrize("kernel,padding", [(3, 0), (3, 1), (2, 1)])
def test_cnn_model_gradient_matches_finite_differences(kernel, padding):
    m = CNN(
        (2, 11, 10),
        3,
        channels=(2, 3),
        hidden=(5,),
        kernel=kernel,
        padding=padding,
        dtype="float64",
        seed=1,
    )
    rng = np.random.default_rng(kernel + padding)
    x = rng.standard_normal((6, 2 * 11 * 10))
    y = rng.integers(0, 3, 6)
    m.forward_backward(x, y)
    analytic = m.grads.copy()
    numeric = numeric_grad(lambda: m.evaluate(x, y)[0], m.params)
    err = np.abs(analytic - numeric).max() / np.abs(numeric).max()
    assert err < 1e-6, f"CNN kernel={kernel} padding={padding}: relative gradient error {err:.2e}"


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
        torch.nn.Conv2d(c, 32, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(m.sizes[2], 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    ).double()
    params = [p for p in net.parameters()]
    flat = [a for wb in m.layers() for a in wb]
    assert [tuple(p.shape) for p in params] == [a.shape for a in flat]
    with torch.no_grad():
        for p, a in zip(params, flat):
            p.copy_(torch.from_numpy(a))
    t_loss = torch.nn.functional.cross_entropy(
        net(torch.from_numpy(x).reshape(4, *shape)), torch.from_numpy(y)
    )
    t_loss.backward()
    assert abs(t_loss.item() - loss) < 1e-12
    for p, (i, g) in zip(params, enumerate(a for wb in m.grad_layers() for a in wb)):
        np.testing.assert_allclose(
            g, p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=f"parameter tensor {i}"
        )


def test_cnn_architecture_and_parameter_count():
    cifar = build_model("cnn", 3072, 10)
    assert cifar.input_shape == (3, 32, 32) and cifar.sizes == (3072, 7200, 2304, 128, 10)
    # PyTorch's count for conv(3->32,3x3), conv(32->64,3x3), fc(2304->128), fc(128->10)
    assert cifar.n_params == (32 * 27 + 32) + (64 * 288 + 64) + (2304 * 128 + 128) + 1290
    mnist = build_model("cnn", 784, 10)
    assert mnist.input_shape == (1, 28, 28) and mnist.sizes[2] == 1600
    assert mnist.n_params == 320 + 18496 + (1600 * 128 + 128) + 1290
    for m in (cifar, mnist):
        spec = named_spec("cnn", m.n_features, 10)  # planned, not allocated
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
    np.testing.assert_array_equal(
        flat_model.logits(images.reshape(6, -1)), image_model.logits(images)
    )
    np.testing.assert_array_equal(
        flat_model.predict(images.reshape(6, -1)), image_model.predict(images)
    )
    assert flat_model.evaluate(images.reshape(6, -1), y) == image_model.evaluate(images, y)
    assert image_model._rows(images).base is images  # a view, no copy
    with pytest.raises(
        ValueError,
        match=r"x has shape \(6, 3, 8, 7\), expected \(B, 192\) "
        r"rows or \(B, 3, 8, 8\) samples",
    ):
        image_model.loss_grad(images[..., :7].copy(), y)
    # another layout is copied into C order, as fit copies it (tests/test_inputs.py)
    np.testing.assert_array_equal(
        image_model.logits(np.asfortranarray(images)), image_model.logits(images)
    )


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
    assert not params.any()  # given buffers are used as they are
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
# training


def _train(**kw):
    kw.setdefault("quiet", True)
    kw.setdefault("allow_download", False)
    return dptrain.train(**kw)


# 12x12 "images" of the synthetic binary set: a CNN small enough for many steps in a test
SMALL = dict(
    model="cnn",
    dataset="synthetic",
    n_samples=384,
    n_features=144,
    batch_size=64,
    epochs=1,
    lr=0.05,
    momentum=0.9,
    seed=3,
)


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
    rc = main(
        [
            "train",
            "--model",
            "cnn",
            "--dataset",
            "synthetic",
            "--n-samples",
            "256",
            "--n-features",
            "144",
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--lr",
            "0.05",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert "cnn (144, 800, 64, 128, 2)" in capsys.readouterr().out
    assert out.is_file()
    rc = main(
        ["train", "--model", "cnn", "--dataset", "synthetic", "--n-samples", "256", "--epochs", "1"]
    )
    assert rc == 1 and "neither s*s nor 3*s*s" in capsys.readouterr().err


@pytest.mark.slow
@needs_mnist
def test_mnist_cnn_reaches_98_percent_in_2_epochs():
    r = _train(
        model="cnn",
        dataset="mnist",
        data_dir=MNIST_DIR,
        epochs=2,
        batch_size=128,
        lr=0.05,
        momentum=0.9,
        threads=2,
        seed=0,
    )
    assert r["dataset"]["source"].startswith(str(MNIST_DIR)), r["dataset"]
    assert r["model"]["sizes"] == [784, 5408, 1600, 128, 10]
    assert r["final_test_accuracy"] >= 0.98, r["test_accuracy"]
