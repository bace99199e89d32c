"""The NumPy reference (dptrain.reference) against independent truths.

The reference is the oracle the C core is tested against, so here it is checked against
things that do not share its code: np.matmul, naive float64 loss formulas, central finite
differences, and PyTorch's SGD update written out by hand (torch itself is not imported).
"""

import math

import numpy as np
import pytest
from _core_helpers import mlp_spec

from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def rel_err(a, b):
    """||a - b|| / (||a|| + ||b||), 0 when both are zero."""
    den = np.linalg.norm(a) + np.linalg.norm(b)
    return 0.0 if den == 0 else float(np.linalg.norm(a - b) / den)


# ---------------------------------------------------------------------------------------
# gemm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 33, 5), (33, 7, 64), (4, 9, 1)])
def test_gemm_matches_matmul(dtype, trans_a, trans_b, m, n, k):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    op_a = a.T.astype(np.float64) if trans_a else a.astype(np.float64)
    op_b = b.T.astype(np.float64) if trans_b else b.astype(np.float64)
    for alpha, beta in [(1.0, 0.0), (0.5, 0.0), (-2.0, 1.0), (1.5, -0.25)]:
        c = c0.copy()
        ref.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        expected = alpha * np.matmul(op_a, op_b) + beta * c0.astype(np.float64)
        assert c.dtype == dtype
        np.testing.assert_allclose(
            c,
            expected,
            **TOL[dtype],
            err_msg=f"gemm shape m,n,k={m, n, k} trans=({trans_a}, {trans_b}) "
            f"alpha={alpha} beta={beta} dtype={np.dtype(dtype).name}",
        )


def test_gemm_beta_zero_never_reads_c():
    a = np.ones((3, 4))
    b = np.ones((4, 2))
    c = np.full((3, 2), np.nan)
    ref.gemm(a, b, c, beta=0.0)
    np.testing.assert_array_equal(c, np.full((3, 2), 4.0))


def test_gemm_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="b has shape"):
        ref.gemm(np.ones((3, 4)), np.ones((5, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"c has shape \(3, 3\), expected \(3, 2\)"):
        ref.gemm(np.ones((3, 4)), np.ones((4, 2)), np.zeros((3, 3)))
    with pytest.raises(TypeError, match="dtype"):
        ref.gemm(np.ones((3, 4)), np.ones((4, 2), np.float32), np.zeros((3, 2)))


# ---------------------------------------------------------------------------------------
# dense and relu


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_forward_and_backward_formulas(dtype):
    rng = np.random.default_rng(1)
    batch, n_in, n_out = 7, 5, 3
    x = rng.standard_normal((batch, n_in)).astype(dtype)
    w = rng.standard_normal((n_out, n_in)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    y = np.empty((batch, n_out), dtype)
    ref.dense_forward(x, w, b, y)
    x64, w64, b64 = (v.astype(np.float64) for v in (x, w, b))
    np.testing.assert_allclose(y, x64 @ w64.T + b64, **TOL[dtype])

    dy = rng.standard_normal((batch, n_out)).astype(dtype)
    dw0 = rng.standard_normal((n_out, n_in)).astype(dtype)
    db0 = rng.standard_normal(n_out).astype(dtype)
    dw, db, dx = dw0.copy(), db0.copy(), np.full((batch, n_in), np.nan, dtype)
    ref.dense_backward(dy, x, w, dw, db, dx)
    dy64 = dy.astype(np.float64)
    np.testing.assert_allclose(dw, dw0 + dy64.T @ x64, **TOL[dtype])  # accumulated
    np.testing.assert_allclose(db, db0 + dy64.sum(0), **TOL[dtype])
    np.testing.assert_allclose(dx, dy64 @ w64, **TOL[dtype])  # overwritten

    dw2, db2 = dw0.copy(), db0.copy()
    ref.dense_backward(dy, x, w, dw2, db2)  # dx=None: the first layer
    np.testing.assert_array_equal(dw2, dw)
    np.testing.assert_array_equal(db2, db)


def test_dense_rejects_shape_mismatch():
    x, w, b = np.ones((4, 5)), np.ones((3, 5)), np.ones(3)
    with pytest.raises(ValueError, match=r"x has shape \(4, 6\), expected \(4, 5\)"):
        ref.dense_forward(np.ones((4, 6)), w, b, np.empty((4, 3)))
    with pytest.raises(ValueError, match="b has shape"):
        ref.dense_forward(x, w, np.ones(4), np.empty((4, 3)))
    with pytest.raises(ValueError, match="dx has shape"):
        ref.dense_backward(np.ones((4, 3)), x, w, np.zeros((3, 5)), np.zeros(3), np.empty((4, 4)))


def test_relu_in_place_and_backward_uses_output():
    x = np.array([[-1.0, 0.0, 2.0], [3.0, -0.5, 0.25]])
    y = np.empty_like(x)
    ref.relu_forward(x, y)
    np.testing.assert_array_equal(y, [[0, 0, 2], [3, 0, 0.25]])
    x_alias = x.copy()
    ref.relu_forward(x_alias, x_alias)  # y may be x
    np.testing.assert_array_equal(x_alias, y)

    dy = np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])
    dx = np.empty_like(dy)
    ref.relu_backward(dy, y, dx)  # y == 0 (including x == 0) passes no gradient
    np.testing.assert_array_equal(dx, [[0, 0, 30], [40, 0, 60]])
    ref.relu_backward(dy, y, dy)  # dx may be dy
    np.testing.assert_array_equal(dy, dx)


# ---------------------------------------------------------------------------------------
# losses


def naive_softmax_xent(z, labels):
    """Per-sample -log(softmax(z)[y]) in float64, no stabilisation (moderate z only)."""
    z = z.astype(np.float64)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return -np.log(p[np.arange(len(labels)), labels])


def naive_sigmoid_bce(z, labels):
    """Per-sample -y log(s) - (1 - y) log(1 - s) in float64, no stabilisation."""
    s = 1.0 / (1.0 + np.exp(-z.astype(np.float64)))
    y = labels.astype(np.float64)
    return -(y * np.log(s) + (1 - y) * np.log(1 - s))


def central_diff(f, z, h=1e-6):
    """d f / d z by central differences, for float64 z (any shape)."""
    grad = np.zeros_like(z)
    flat, gflat = z.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        f_plus = f(z)
        flat[i] = old - h
        f_minus = f(z)
        flat[i] = old
        gflat[i] = (f_plus - f_minus) / (2 * h)
    return grad


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_xent_matches_naive_formula(dtype):
    rng = np.random.default_rng(2)
    z = (3 * rng.standard_normal((9, 4))).astype(dtype)
    labels = rng.integers(0, 4, size=9)
    loss = ref.softmax_xent(z, labels)
    assert isinstance(loss, float)
    np.testing.assert_allclose(loss, naive_softmax_xent(z, labels).sum(), rtol=1e-5)


def test_softmax_xent_is_stable_for_large_logits():
    z = np.array([[1000.0, 0.0, -1000.0], [-1e4, 1e4, 1e4]], dtype=np.float32)
    labels = np.array([0, 0])
    dz = np.empty_like(z)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no exp overflow
        loss = ref.softmax_xent(z, labels, dz, grad_scale=1.0)
    # sample 0: -log(1) = 0; sample 1: logsumexp = 1e4 + log 2, minus z[0] = -1e4
    np.testing.assert_allclose(loss, 0.0 + 2e4 + math.log(2), rtol=1e-6)
    np.testing.assert_allclose(dz, [[0, 0, 0], [-1, 0.5, 0.5]], atol=1e-6)


@pytest.mark.parametrize("grad_scale", [None, 0.3])
def test_softmax_xent_gradient_is_finite_difference(grad_scale):
    rng = np.random.default_rng(3)
    z = rng.standard_normal((5, 3))
    labels = rng.integers(0, 3, size=5)
    scale = 1 / 5 if grad_scale is None else grad_scale
    dz = np.full_like(z, np.nan)
    ref.softmax_xent(z, labels, dz, grad_scale)
    fd = central_diff(lambda v: scale * ref.softmax_xent(v, labels), z.copy())
    assert rel_err(dz, fd) < 1e-8


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8,), (8, 1)])
def test_sigmoid_bce_matches_naive_formula(dtype, shape):
    rng = np.random.default_rng(4)
    z = (3 * rng.standard_normal(shape)).astype(dtype)
    labels = rng.integers(0, 2, size=8)
    dz = np.empty_like(z)
    loss = ref.sigmoid_bce(z, labels, dz)
    assert isinstance(loss, float) and dz.shape == shape and dz.dtype == dtype
    np.testing.assert_allclose(loss, naive_sigmoid_bce(z.reshape(-1), labels).sum(), rtol=1e-5)
    s = 1 / (1 + np.exp(-z.reshape(-1).astype(np.float64)))
    np.testing.assert_allclose(dz.reshape(-1), (s - labels) / 8, **TOL[dtype])


@pytest.mark.parametrize("grad_scale", [None, 2.5])
def test_sigmoid_bce_gradient_is_finite_difference(grad_scale):
    rng = np.random.default_rng(5)
    z = 2 * rng.standard_normal(6)
    labels = rng.integers(0, 2, size=6)
    scale = 1 / 6 if grad_scale is None else grad_scale
    dz = np.full_like(z, np.nan)
    ref.sigmoid_bce(z, labels, dz, grad_scale)
    fd = central_diff(lambda v: scale * ref.sigmoid_bce(v, labels), z.copy())
    assert rel_err(dz, fd) < 1e-8


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_bce_stays_finite_for_huge_logits(dtype):
    z = np.array([1e4, 1e4, -1e4, -1e4], dtype=dtype)
    labels = np.array([1, 0, 1, 0])
    dz = np.empty_like(z)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no exp overflow
        loss = ref.sigmoid_bce(z, labels, dz, grad_scale=1.0)
    # confident and right costs ~0, confident and wrong costs |z|
    assert math.isfinite(loss)
    np.testing.assert_allclose(loss, 2e4, rtol=1e-6)
    assert np.all(np.isfinite(dz))
    np.testing.assert_array_equal(dz, np.array([0, 1, -1, 0], dtype=dtype))


def test_sigmoid_bce_keeps_tiny_losses():
    """Confident and right: the loss log1p(exp(-|z|)) ~ exp(-|z|) must not round to 0
    (log(1 + exp(-40)) would)."""
    z = np.array([40.0, -40.0])
    loss = ref.sigmoid_bce(z, np.array([1, 0]))
    np.testing.assert_allclose(loss, 2 * math.exp(-40), rtol=1e-12)


def test_losses_reject_bad_labels_and_shapes():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"labels contains 4, expected values in \[0, 4\)"):
        ref.softmax_xent(z, np.array([0, 1, 4]))
    with pytest.raises(ValueError, match="labels contains -1"):
        ref.softmax_xent(z, np.array([0, -1, 2]))
    with pytest.raises(ValueError, match=r"labels has shape \(2,\), expected \(3,\)"):
        ref.softmax_xent(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="dlogits has shape"):
        ref.softmax_xent(z, np.array([0, 1, 2]), np.empty((3, 3)))
    with pytest.raises(ValueError, match=r"labels contains 2, expected values in \[0, 2\)"):
        ref.sigmoid_bce(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="logits has shape"):
        ref.sigmoid_bce(np.zeros((3, 2)), np.array([0, 1, 1]))
    with pytest.raises(TypeError, match="labels has dtype"):
        ref.softmax_xent(z, np.array([0.0, 1.0, 2.0]))


# ---------------------------------------------------------------------------------------
# argmax and count_correct


def test_argmax_takes_first_maximum():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [-1.0, -5.0, -0.5]])
    out = np.full(3, -7, dtype=np.int64)
    ref.argmax(x, out)
    np.testing.assert_array_equal(out, [1, 0, 2])
    with pytest.raises(TypeError, match="out has dtype"):
        ref.argmax(x, np.empty(3, dtype=np.int32))


def test_count_correct_multiclass_and_binary():
    z = np.array([[0.1, 0.9], [0.8, 0.2], [0.5, 0.5]])
    assert ref.count_correct(z, np.array([1, 0, 1])) == 2  # the tie predicts class 0
    zb = np.array([2.0, -1.0, 0.0, 0.5])  # z == 0 predicts 0
    labels = np.array([1, 0, 0, 0])
    assert ref.count_correct(zb, labels) == 3
    assert ref.count_correct(zb.reshape(4, 1), labels) == 3
    assert isinstance(ref.count_correct(zb, labels), int)


# ---------------------------------------------------------------------------------------
# model_* on dense stacks (an MLP): finite-difference gradient check and accumulation


def make_problem(sizes, loss, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    params = ref.model_init_params(*mlp_spec(sizes, loss), seed, np.float64)
    x = rng.standard_normal((batch, sizes[0]))
    n_classes = 2 if loss == "sigmoid_bce" else sizes[-1]
    labels = rng.integers(0, n_classes, size=batch)
    return params, x, labels


@pytest.mark.parametrize(
    "sizes,loss",
    [((5, 7, 3), "softmax_xent"), ((4, 6, 1), "sigmoid_bce"), ((6, 3), "softmax_xent")],
)
@pytest.mark.parametrize("grad_scale", [None, 0.7])
def test_dense_stack_gradient_is_finite_difference(sizes, loss, grad_scale):
    params, x, labels = make_problem(sizes, loss)
    spec = mlp_spec(sizes, loss)
    scale = 1 / len(x) if grad_scale is None else grad_scale
    grads = np.zeros_like(params)
    loss_sum, n_correct = ref.model_loss_grad(*spec, params, grads, x, labels, grad_scale)
    assert (loss_sum, n_correct) == ref.model_evaluate(*spec, params, x, labels)

    def scaled_loss(p):
        return scale * ref.model_evaluate(*spec, p, x, labels)[0]

    fd = central_diff(scaled_loss, params.copy(), h=1e-5)
    err = rel_err(grads, fd)
    assert err < 1e-6, f"model_loss_grad sizes={sizes} loss={loss}: relative error {err:.2e}"
    assert np.count_nonzero(grads) > 0.5 * grads.size  # the check is not vacuous


@pytest.mark.parametrize("sizes,loss", [((5, 7, 3), "softmax_xent"), ((4, 6, 1), "sigmoid_bce")])
def test_dense_stack_loss_grad_accumulates(sizes, loss):
    params, x, labels = make_problem(sizes, loss, seed=1)
    spec = mlp_spec(sizes, loss)
    params_before = params.copy()
    once = np.zeros_like(params)
    ref.model_loss_grad(*spec, params, once, x, labels)
    twice = np.zeros_like(params)
    ref.model_loss_grad(*spec, params, twice, x, labels)
    ref.model_loss_grad(*spec, params, twice, x, labels)
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-14, atol=1e-15)
    offset = np.linspace(-1, 1, params.size)
    started = offset.copy()
    ref.model_loss_grad(*spec, params, started, x, labels)
    np.testing.assert_allclose(started, offset + once, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(params, params_before)  # params are only read


def test_dense_stack_split_batches_sum_to_the_full_batch():
    """Two half batches with grad_scale=1/B accumulate the full batch's mean gradient:
    the identity data-parallel training relies on."""
    sizes, loss = (5, 7, 3), "softmax_xent"
    spec = mlp_spec(sizes, loss)
    params, x, labels = make_problem(sizes, loss, batch=10, seed=2)
    full = np.zeros_like(params)
    full_loss, full_correct = ref.model_loss_grad(*spec, params, full, x, labels)
    halves = np.zeros_like(params)
    l1, c1 = ref.model_loss_grad(*spec, params, halves, x[:5], labels[:5], 1 / 10)
    l2, c2 = ref.model_loss_grad(*spec, params, halves, x[5:], labels[5:], 1 / 10)
    np.testing.assert_allclose(halves, full, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(l1 + l2, full_loss, rtol=1e-12)
    assert c1 + c2 == full_correct


def test_dense_stack_float32_and_logits():
    sizes, loss = (5, 7, 3), "softmax_xent"
    spec = mlp_spec(sizes, loss)
    params64, x64, labels = make_problem(sizes, loss)
    params32, x32 = params64.astype(np.float32), x64.astype(np.float32)
    g32, g64 = np.zeros_like(params32), np.zeros_like(params64)
    l32, _ = ref.model_loss_grad(*spec, params32, g32, x32, labels)
    l64, _ = ref.model_loss_grad(*spec, params64, g64, x64, labels)
    assert g32.dtype == np.float32
    np.testing.assert_allclose(l32, l64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-6)

    out = np.empty((len(x64), 3))
    ref.model_logits(*spec, params64, x64, out)
    (w1, b1), (w2, b2) = ref.model_unflatten(*spec, params64)
    np.testing.assert_allclose(out, np.maximum(x64 @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-12)


def test_dense_stack_rejects_bad_arguments():
    sizes = (5, 7, 3)
    spec = mlp_spec(sizes)
    params, x, labels = make_problem(sizes, "softmax_xent")
    grads = np.zeros_like(params)
    with pytest.raises(ValueError, match=r"x has shape \(8, 4\), expected \(8, 5\)"):
        ref.model_loss_grad(*spec, params, grads, x[:, :4], labels)
    bad_labels = labels.copy()
    bad_labels[3] = 3
    with pytest.raises(ValueError, match=r"labels contains 3, expected values in \[0, 3\)"):
        ref.model_loss_grad(*spec, params, grads, x, bad_labels)
    with pytest.raises(ValueError, match="grads has shape"):
        ref.model_loss_grad(*spec, params, grads[:-1], x, labels)
    with pytest.raises(ValueError, match="params has shape"):
        ref.model_evaluate(*spec, params[:-1], x, labels)
    with pytest.raises(ValueError, match="sigmoid BCE needs exactly 1 output"):
        ref.model_evaluate(*mlp_spec(sizes, "sigmoid_bce"), params, x, labels)
    with pytest.raises(ValueError, match="loss must be one of"):
        ref.model_evaluate(*mlp_spec(sizes, "hinge"), params, x, labels)
    np.testing.assert_array_equal(grads, 0)  # a rejected call writes nothing


# ---------------------------------------------------------------------------------------
# sgd_step


def torch_sgd_by_hand(p, grads_per_step, lr, momentum, dampening, weight_decay, nesterov):
    """torch.optim.SGD's update (torch/optim/sgd.py, _single_tensor_sgd), element by element
    in Python floats, over a list of gradients."""
    p = [float(v) for v in p]
    bufs = [None] * len(p)
    for grads in grads_per_step:
        for i in range(len(p)):
            d_p = float(grads[i])
            if weight_decay != 0:
                d_p = d_p + weight_decay * p[i]
            if momentum != 0:
                if bufs[i] is None:
                    bufs[i] = d_p  # torch.clone(d_p).detach()
                else:
                    bufs[i] = bufs[i] * momentum + (1 - dampening) * d_p
                if nesterov:
                    d_p = d_p + momentum * bufs[i]
                else:
                    d_p = bufs[i]
            p[i] = p[i] - lr * d_p
    return np.array(p), (np.array(bufs) if momentum != 0 else None)


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.5),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
    dict(lr=0.02, momentum=0.7, dampening=0.3, weight_decay=0.05),
]


@pytest.mark.parametrize(
    "config", SGD_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
)
def test_sgd_step_matches_pytorch_formulas(config):
    rng = np.random.default_rng(6)
    p0 = rng.standard_normal(11)
    grads_per_step = [rng.standard_normal(11) for _ in range(3)]
    full = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False) | config

    params = p0.copy()
    velocity = np.full_like(p0, np.nan) if full["momentum"] else None  # first step never reads it
    for step, grads in enumerate(grads_per_step):
        grads_before = grads.copy()
        ref.sgd_step(params, grads, velocity, first_step=(step == 0), **config)
        np.testing.assert_array_equal(grads, grads_before)  # grads are not modified

    expected_p, expected_v = torch_sgd_by_hand(p0, grads_per_step, **full)
    np.testing.assert_allclose(params, expected_p, rtol=1e-14, atol=1e-15)
    if expected_v is not None:
        np.testing.assert_allclose(velocity, expected_v, rtol=1e-14, atol=1e-15)
    assert not np.allclose(params, p0)


def test_sgd_step_float32_and_velocity_rules():
    p = np.ones(4, np.float32)
    ref.sgd_step(p, np.full(4, 2, np.float32), None, lr=0.25)  # momentum 0: velocity unused
    assert p.dtype == np.float32
    np.testing.assert_array_equal(p, 0.5)
    with pytest.raises(ValueError, match="velocity is None"):
        ref.sgd_step(p, p.copy(), None, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="velocity has shape"):
        ref.sgd_step(p, p.copy(), np.zeros(3, np.float32), lr=0.1, momentum=0.9)


# ---------------------------------------------------------------------------------------
# sum_buffers and scale_


def test_sum_buffers_adds_in_the_order_given():
    big = np.full(3, 1e8, np.float32)
    one = np.ones(3, np.float32)
    out = np.empty(3, np.float32)
    ref.sum_buffers(out, [big, one, -big])  # (1e8 + 1) rounds to 1e8 in float32
    np.testing.assert_array_equal(out, 0)
    ref.sum_buffers(out, [big, -big, one])
    np.testing.assert_array_equal(out, 1)


def test_sum_buffers_slice_scale_and_alias():
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(10) for _ in range(3)]
    out = np.full(10, -99.0)
    ref.sum_buffers(out, inputs, scale=0.5, start=2, stop=7)
    expected = 0.5 * ((inputs[0] + inputs[1]) + inputs[2])
    np.testing.assert_array_equal(out[2:7], expected[2:7])
    np.testing.assert_array_equal(out[:2], -99.0)  # outside [start, stop) untouched
    np.testing.assert_array_equal(out[7:], -99.0)

    first = inputs[0].copy()
    alias = [first, inputs[1], inputs[2]]
    ref.sum_buffers(first, alias, scale=1 / 3)  # out is inputs[0]; stop=None: to the end
    np.testing.assert_allclose(first, (inputs[0] + inputs[1] + inputs[2]) / 3, rtol=1e-15)

    with pytest.raises(ValueError, match="inputs\\[1\\] has shape"):
        ref.sum_buffers(out, [inputs[0], np.zeros(9)])
    with pytest.raises(ValueError, match="range"):
        ref.sum_buffers(out, inputs, start=5, stop=11)
    with pytest.raises(ValueError, match="inputs is empty"):
        ref.sum_buffers(out, [])


def test_scale_slice():
    buf = np.arange(6, dtype=np.float32)
    ref.scale_(buf, 2.0, start=1, stop=4)
    np.testing.assert_array_equal(buf, [0, 2, 4, 6, 4, 5])
    ref.scale_(buf, 0.5)
    np.testing.assert_array_equal(buf, [0, 1, 2, 3, 2, 2.5])
    assert buf.dtype == np.float32
    with pytest.raises(ValueError, match="range"):
        ref.scale_(buf, 2.0, start=4, stop=3)


# ---------------------------------------------------------------------------------------
# layout and init


def test_model_unflatten_views():
    sizes = (5, 7, 3)
    spec = mlp_spec(sizes)
    assert ref.model_plan(*spec)["n_params"] == 7 * 5 + 7 + 3 * 7 + 3
    flat = np.arange(ref.model_plan(*spec)["n_params"], dtype=np.float64)
    (w1, b1), (w2, b2) = ref.model_unflatten(*spec, flat)
    assert (w1.shape, b1.shape, w2.shape, b2.shape) == ((7, 5), (7,), (3, 7), (3,))
    assert w1[0, 1] == 1 and w1[1, 0] == 5  # row-major (OUT, IN)
    assert b1[0] == 35 and w2[0, 0] == 42 and b2[-1] == flat.size - 1
    w2[0, 0] = -1.0  # views, not copies
    assert flat[42] == -1.0
    with pytest.raises(ValueError, match="layers has 0 entries"):
        ref.model_plan(*mlp_spec((5,)))


def test_model_init_params_deterministic_and_bounded():
    sizes = (784, 64, 10)
    spec = mlp_spec(sizes)
    a = ref.model_init_params(*spec, 0, np.float32)
    b = ref.model_init_params(*spec, 0, np.float32)
    c = ref.model_init_params(*spec, 1, np.float32)
    assert a.dtype == np.float32 and a.shape == (ref.model_plan(*spec)["n_params"],)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for (w, bias), n_in in zip(ref.model_unflatten(*spec, a), sizes[:-1]):
        bound = 1 / math.sqrt(n_in)
        for name, arr in (("W", w), ("b", bias)):
            assert np.abs(arr).max() <= bound, f"{name} of a layer with IN={n_in}"
        # uniform over the whole interval, not a narrower one
        assert np.abs(w).max() > 0.95 * bound and abs(w.mean()) < 0.05 * bound


def test_model_init_params_draw_order():
    """Layer by layer, W then b, each from U(-1/sqrt(IN), 1/sqrt(IN)) of one generator."""
    sizes = (3, 4, 2)
    rng = np.random.default_rng(42)
    parts = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        bound = 1 / math.sqrt(n_in)
        parts.append(rng.uniform(-bound, bound, n_out * n_in))
        parts.append(rng.uniform(-bound, bound, n_out))
    np.testing.assert_array_equal(
        ref.model_init_params(*mlp_spec(sizes), 42, np.float64), np.concatenate(parts)
    )
