"""The layers of issue 36 (strided conv, average and global average pooling, layer norm,
dropout, residual blocks with and without a projection) against PyTorch's, where torch is
installed (it is not a dependency: skipped elsewhere, with the reason):

- one loss_grad in float64 equals torch's loss and gradient (1e-9), with dropout in
  evaluation mode on both sides (logits) and p = 0 in training;
- 200 SGD steps in float32 from the same weights on the same batches give the same training
  loss at every step, within 1e-4 relative (issue 36's parity target);
- dropout's statistics: the kept fraction is 1 - p, the output's mean and variance those of
  torch's nn.Dropout on the same input (their masks are drawn differently: statistics only).
"""

import math

import numpy as np
import pytest

from dptrain import _core as core
from dptrain import reference as ref
from dptrain._torch import torch_flat, torch_sequential

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")

LAYERS = [
    ("conv", 4, 3, 1, 2),
    ("layernorm",),
    "relu",
    "res_begin",  # a residual block with the identity
    ("conv", 4, 3, 1),
    "relu",
    ("conv", 4, 3, 1),
    "res_end",
    "relu",
    "res_begin",  # and one with a strided 1x1 projection
    ("conv", 6, 3, 1, 2),
    "relu",
    "res_end",
    "avgpool2",
    ("conv", 8, 1, 0, 2),
    "globalavgpool",
    ("layernorm",),
    ("dense", 5),
]
SHAPE = (3, 13, 12)


def _data(dtype, batch, seed=0):
    rng = np.random.default_rng(seed)
    plan = ref.model_plan(LAYERS, SHAPE, "softmax_xent")
    params = ref.model_init_params(LAYERS, SHAPE, "softmax_xent", seed, dtype)
    # layer norms away from (1, 0), so that their gradients are not special
    params += (0.1 * rng.standard_normal(params.size)).astype(dtype)
    x = rng.standard_normal((batch, math.prod(SHAPE))).astype(dtype)
    y = rng.integers(0, 5, batch).astype(np.int64)
    return plan, params, x, y


@pytest.mark.parametrize("dropout", [None, 0.0])
def test_loss_grad_equals_torch(dropout):
    layers = LAYERS if dropout is None else LAYERS[:5] + [("dropout", dropout)] + LAYERS[5:]
    plan0, params, x, y = _data(np.float64, 7)
    plan = ref.model_plan(layers, SHAPE, "softmax_xent")
    grads = np.zeros_like(params)
    m = core.Model(layers, SHAPE, "softmax_xent", params, grads)
    loss, _ = m.loss_grad(x, y, 1.0)
    net, owners = torch_sequential(plan, params, torch)
    out = net(torch.from_numpy(x.reshape(len(x), *SHAPE)))
    t_loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(y), reduction="sum")
    t_loss.backward()
    assert abs(loss - t_loss.item()) <= 1e-10 * abs(t_loss.item())
    np.testing.assert_allclose(grads, torch_flat(plan, owners), rtol=1e-9, atol=1e-12)


def test_evaluation_passes_dropout_on_like_torch_eval():
    layers = LAYERS[:5] + [("dropout", 0.5)] + LAYERS[5:-1] + [("dropout", 0.3), LAYERS[-1]]
    plan = ref.model_plan(layers, SHAPE, "softmax_xent")
    _, params, x, _ = _data(np.float64, 9)
    m = core.Model(layers, SHAPE, "softmax_xent", params, np.zeros_like(params))
    out = np.empty((len(x), 5))
    m.logits(x, out)
    net, _ = torch_sequential(plan, params, torch)
    net.eval()
    with torch.no_grad():
        want = net(torch.from_numpy(x.reshape(len(x), *SHAPE))).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-14)


def train_losses(steps, batch=16, lr=0.05, threads=1, layers=None):
    """(ours, torch's): the training loss of every step of plain SGD, float32, from the same
    weights on the same batches; and both models after (ours, torch's)."""
    layers = layers or LAYERS
    plan = ref.model_plan(layers, SHAPE, "softmax_xent")
    params = ref.model_init_params(layers, SHAPE, "softmax_xent", 0, np.float32)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((steps, batch, math.prod(SHAPE))).astype(np.float32)
    ys = rng.integers(0, 5, (steps, batch)).astype(np.int64)
    net, owners = torch_sequential(plan, params, torch)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    grads = np.zeros_like(params)
    m = core.Model(layers, SHAPE, "softmax_xent", params, grads, threads=threads)
    ours, theirs = [], []
    for x, y in zip(xs, ys):
        grads[...] = 0
        ours.append(m.loss_grad(x, y)[0] / batch)
        params -= np.float32(lr) * grads
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            net(torch.from_numpy(x.reshape(batch, *SHAPE))), torch.from_numpy(y)
        )
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    return np.array(ours), np.array(theirs), (m, net)


BN_LAYERS = [
    ("conv", 4, 3, 1, 2),
    "batchnorm",
    "relu",
    "res_begin",
    ("conv", 4, 3, 1),
    "batchnorm",
    "res_end",
    "relu",
    "globalavgpool",
    ("dense", 8),
    "batchnorm",
    ("dense", 5),
]


def test_200_sgd_steps_follow_torch():
    torch.set_num_threads(1)
    ours, theirs, _ = train_losses(200)
    rel = np.abs(ours - theirs) / np.abs(theirs)
    assert rel.max() <= 1e-4, f"step {rel.argmax()}: {ours[rel.argmax()]} vs {theirs[rel.argmax()]}"
    assert theirs[-20:].mean() < theirs[:20].mean()  # it trained: the check is not vacuous


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics_match_torch(p):
    rows, width = 400, 250
    layers = [("dropout", p), ("dense", 2)]
    x = np.random.default_rng(1).uniform(0.5, 1.5, (rows, width))
    params = np.zeros(2 * width + 2)
    m = core.Model(layers, (width,), "mse", params, np.zeros_like(params))
    m.set_rng(3, 7, 0)
    # the mask comes back through the gradient: d(loss)/dx is not exposed, but W's gradient
    # under a target of -1 is (y + 1) = 1 times the dropped-out input, column by column
    targets = np.full((rows, 2), -1.0)
    grads = np.zeros_like(params)
    m.loss_grad(x, targets, 0.5, grads)
    # dW[o, j] = sum_i 2 * 0.5 * (0 - (-1)) * h[i, j] = sum_i h[i, j], h the dropout's output
    h_sums = grads[:width]
    want = ref.dropout_mask(3, 7, np.arange(rows), width, p, 0)
    hs = ref.dropout_forward(x, p, want)
    np.testing.assert_allclose(h_sums, hs.sum(axis=0), rtol=1e-12)
    kept = want.mean()
    sigma = math.sqrt(p * (1 - p) / want.size)
    assert abs(kept - (1 - p)) <= 5 * sigma, f"kept {kept}, expected {1 - p}"
    t = torch.nn.functional.dropout(torch.from_numpy(x), p, training=True).numpy()
    for stat in (np.mean, np.var):
        a, b = stat(hs), stat(t)
        assert abs(a - b) <= 0.03 * abs(b), f"{stat.__name__}: ours {a}, torch {b}"


def test_batch_norm_trains_and_evaluates_as_torchs():
    """Train mode for 200 SGD steps (the batch's statistics; the loss within 1e-4 at every
    step), then eval mode (the running statistics, updated as torch updates them)."""
    torch.set_num_threads(1)
    ours, theirs, (m, net) = train_losses(200, layers=BN_LAYERS)
    rel = np.abs(ours - theirs) / np.abs(theirs)
    assert rel.max() <= 1e-4, f"step {rel.argmax()}: {ours[rel.argmax()]} vs {theirs[rel.argmax()]}"
    running = np.concatenate(
        [
            np.concatenate([mod.running_mean.numpy(), mod.running_var.numpy()])
            for _, mod in sorted(torch_owners(net))
        ]
    )
    np.testing.assert_allclose(m.state, running, rtol=1e-4, atol=1e-5)
    x = np.random.default_rng(9).standard_normal((20, math.prod(SHAPE))).astype(np.float32)
    out = np.empty((20, 5), np.float32)
    m.logits(x, out)
    net.eval()
    with torch.no_grad():
        want = net(torch.from_numpy(x.reshape(20, *SHAPE))).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def torch_owners(net):
    """(position, module) of the batch norms of a torch twin, in list order."""
    mods = [mod for mod in net.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    return list(enumerate(mods))
