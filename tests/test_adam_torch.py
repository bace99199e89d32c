"""Adam, AdamW and RMSprop against PyTorch's: the MNIST-shaped MLP trained 200 steps by
dptrain and by torch.optim.Adam / AdamW / RMSprop from the same weights on the same batches
gives the same training loss at every step (float32 within 1e-4 relative, float64 within
1e-11; or within 64 ulps of 1, where the loss has come so near 0 that its float rounding is
the difference), and the same weights at the end. Skips, saying so, where PyTorch is not
installed."""

import numpy as np
import pytest

import dptrain

pytestmark = pytest.mark.slow  # 200 training steps beside torch

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the Adam-vs-PyTorch comparison needs it"
)

STEPS, BATCH = 200, 32
SIZES = (64, 48, 32, 10)  # the MNIST MLP's shape, smaller: 784 inputs make 200 steps slow


def _torch_net(model):
    """nn.Sequential(Linear, ReLU, ..., Linear) holding the dptrain model's weights."""
    dtype = torch.float64 if model.params.dtype == np.float64 else torch.float32
    layers = []
    for i, (w, b) in enumerate(model.layers()):
        lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.array(w)))
            lin.bias.copy_(torch.from_numpy(np.array(b)))
        layers += [lin] if i == len(SIZES) - 2 else [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _side_by_side(model, net, ours_step, theirs_step, rtol, what):
    """STEPS steps of both on the same batches (blobs around 10 centers): ours_step() after
    dptrain's loss_grad, theirs_step() after torch's backward; the losses compared at every
    step. Returns torch's last loss. Near 0, a loss is log(1 + t) of a t below float's
    resolution at 1: each library's rounding of it is the loss's own size (seen on an AVX2
    CPU: 7.97e-7 against torch's 8.01e-7 at RMSprop's 30th step), so the absolute floor."""
    torch.set_num_threads(1)
    dtype = model.params.dtype
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((SIZES[-1], SIZES[0]))
    floor = 64 * float(np.finfo(dtype).eps)
    for step in range(STEPS):
        y = rng.integers(0, SIZES[-1], BATCH)
        x = (centers[y] + rng.standard_normal((BATCH, SIZES[0]))).astype(dtype)
        model.zero_grad()
        loss_sum, _ = model.loss_grad(x, y)
        ours_step()
        for p in net.parameters():
            p.grad = None
        loss = loss_fn(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        theirs_step()
        assert loss_sum / BATCH == pytest.approx(loss.item(), rel=rtol, abs=floor), (
            f"{what} {dtype}: step {step + 1}: loss {loss_sum / BATCH} (dptrain), "
            f"{loss.item()} (torch)"
        )
    return loss.item()


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-4), ("float64", 1e-11)])
@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("Adam", dict(lr=1e-3)),
        ("Adam", dict(lr=3e-3, weight_decay=1e-2, amsgrad=True, betas=(0.8, 0.99))),
        ("AdamW", dict(lr=1e-3)),
        ("AdamW", dict(lr=3e-3, weight_decay=0.1, amsgrad=True, eps=1e-6)),
        ("RMSprop", dict(lr=1e-3)),
        ("RMSprop", dict(lr=1e-3, momentum=0.9, weight_decay=1e-2)),
        ("RMSprop", dict(lr=3e-4, alpha=0.9, centered=True, momentum=0.5, eps=1e-6)),
    ],
    ids=[
        "adam",
        "adam-wd-amsgrad",
        "adamw",
        "adamw-amsgrad",
        "rmsprop",
        "rmsprop-momentum",
        "rmsprop-centered",
    ],
)
def test_training_loss_equals_torchs(name, kwargs, dtype, rtol):
    model = dptrain.MLP(SIZES, seed=3, dtype=dtype)
    net = _torch_net(model)
    ours = getattr(dptrain, name)(model, **kwargs)
    theirs = getattr(torch.optim, name)(net.parameters(), **kwargs)
    last = _side_by_side(model, net, ours.step, theirs.step, rtol, f"{name} {kwargs}")
    assert last < 0.5 * np.log(SIZES[-1])  # it trained (from log(10) at the start)
    for (w, b), lin in zip(model.layers(), net[::2]):
        for a, t in ((w, lin.weight), (b, lin.bias)):
            np.testing.assert_allclose(a, t.detach().numpy(), rtol=0, atol=50 * rtol)


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-4), ("float64", 1e-11)])
@pytest.mark.parametrize("max_norm", [0.1, 0.3])
def test_clipped_sgd_equals_torchs(max_norm, dtype, rtol):
    """SGD with momentum and the gradient clipped to max_norm (dptrain.engine.clip.GradClip,
    the training loop's clip_norm) against torch.nn.utils.clip_grad_norm_ then
    torch.optim.SGD: the same training loss at every one of 200 steps."""
    from dptrain.engine.clip import GradClip

    model = dptrain.MLP(SIZES, seed=3, dtype=dtype)
    net = _torch_net(model)
    # a rate at which the loss stays well above 0 (near 0 a relative comparison is noise)
    ours = dptrain.SGD(model, lr=0.01, momentum=0.9)
    theirs = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    clip = GradClip(max_norm)

    def torch_step():
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)
        theirs.step()

    _side_by_side(
        model, net, lambda: ours.step(grads=clip(model.grads)), torch_step, rtol, "clipped SGD"
    )
    record = clip.record()
    # the threshold did something: at 0.1 every step is clipped, at 0.3 some
    assert (
        record["clipped_steps"] == STEPS if max_norm == 0.1 else 0 < record["clipped_steps"] < STEPS
    ), record
