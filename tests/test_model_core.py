"""_core.Model and _core.model_plan (any layer list, csrc/dp_model.h) against their NumPy twin,
reference.model_* (written layer by layer in the list's order, where the C engine fuses).

- Model against reference.model_loss_grad / model_evaluate / model_logits on layer lists that
  take every path of the engine: the fused conv+relu+maxpool2 and conv+maxpool2+tanh blocks
  (an odd conv output whose last column the pool drops), conv+act across a flatten,
  standalone gelu, maxpool2 and activations (also before the first parameterized layer),
  flatten in odd places, dense-only stacks, the single dense sigmoid_bce layer (the logistic
  fast path), mse with several outputs, a conv-only model; both dtypes; threads=2 equals
  threads=1 to rounding. Tolerances are relative to the size of the terms, per parameter block:
  |got - want| <= RTOL sqrt(k) (max |want - start| + max |start|), k the longest reduction.
- loss_grad is forward_loss + backward_layer(P-1) ... (0); gradients accumulate (+=) and scale
  with grad_scale; evaluate and logits in several chunks (the engine cuts a batch at ~16 MiB
  of activations or 1024 rows), the labels / targets of each chunk its own; label errors name
  the row and leave the gradient alone; an empty batch; central finite differences (float64).
- model_plan: shapes and the flat parameter layout (equal to the twin's), the fused stages,
  and the error of each bad layer list, which names the layer and what is wrong (the twin
  raises the same words).
- PyTorch on the same weights when torch is installed (the layout and the MSE/GELU
  conventions, not our arithmetic).
"""
import math
import zlib

import numpy as np
import pytest

from dptrain import _core as core
from dptrain import reference as ref

DTYPES = [np.float32, np.float64]
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}

# (id, layers, input_shape, loss)
MODELS = [
    ("cnn", [("conv", 4, 3, 1), "relu", "maxpool2", ("conv", 3, 3), "relu", "maxpool2", "flatten",
             ("dense", 6), "relu", ("dense", 4)], (2, 12, 11), "softmax_xent"),
    ("conv-pool-tanh", [("conv", 3, 2), "maxpool2", "tanh", ("conv", 2, 2, 1), "sigmoid", "flatten",
                        ("dense", 3)], (1, 9, 8), "softmax_xent"),
    ("conv-flatten-relu", [("conv", 2, 3), "flatten", "relu", ("dense", 4), "flatten", "tanh",
                           ("dense", 2)], (2, 6, 5), "softmax_xent"),
    ("pool-first", ["tanh", "maxpool2", ("conv", 2, 3), "sigmoid", "maxpool2", "relu", "flatten",
                    ("dense", 3)], (1, 10, 11), "softmax_xent"),
    ("gelu", [("dense", 9), "gelu", ("dense", 5), "gelu", ("dense", 3)], (7,), "softmax_xent"),
    ("flatten-only-dense", ["flatten", "flatten", ("dense", 6), "flatten", "sigmoid", ("dense", 2)],
     (2, 3, 3), "softmax_xent"),
    ("mlp", [("dense", 33), "relu", ("dense", 7), "relu", ("dense", 3)], (17,), "softmax_xent"),
    ("logistic", [("dense", 1)], (13,), "sigmoid_bce"),
    ("bce", [("dense", 5), "sigmoid", ("dense", 1)], (6,), "sigmoid_bce"),
    ("mse", [("dense", 8), "tanh", ("dense", 3)], (5,), "mse"),
    ("conv-mse", [("conv", 2, 3, 1), "gelu", "maxpool2", ("conv", 3, 2), "flatten"], (2, 7, 7), "mse"),
    ("conv-only", [("conv", 3, 3)], (1, 5, 4), "softmax_xent"),
]
MODEL_IDS = [m[0] for m in MODELS]


def dname(dtype):
    return np.dtype(dtype).name


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def model_data(model, dtype, batch=13, tag=""):
    """(plan, params, x, labels): weights ~ N(0, 1 / fan_in), biases ~ N(0, 0.1), x ~ N(0, 1);
    labels are class labels, or (B, OUT) targets for mse."""
    _, layers, shape, loss = model
    plan = ref.model_plan(layers, shape, loss)
    rng = rng_for("model", model[0], dname(dtype), batch, tag)
    params = np.empty(plan["n_params"], dtype)
    for e in plan["params"]:
        n_w = math.prod(e["weight_shape"])
        fan_in = n_w // e["weight_shape"][0]
        params[e["weight"]:e["weight"] + n_w] = rng.standard_normal(n_w) / math.sqrt(fan_in)
        params[e["bias"]:e["bias"] + e["bias_shape"][0]] = 0.1 * rng.standard_normal(e["bias_shape"])
    x = rng.standard_normal((batch, math.prod(shape))).astype(dtype)
    return plan, params, x, make_labels(plan, batch, rng, dtype)


def make_labels(plan, batch, rng, dtype):
    out = math.prod(plan["shapes"][-1])
    if plan["loss"] == "mse":
        return rng.standard_normal((batch, out)).astype(dtype)
    return rng.integers(0, 2 if plan["loss"] == "sigmoid_bce" else out, batch)


def reduction(plan, batch):
    """The longest sum a forward/backward pass takes (bounds its rounding)."""
    widths = [math.prod(s) for s in plan["shapes"]] + [math.prod(plan["input_shape"])]
    return max(widths) + batch


def check_blocks(plan, got, want, start, dtype, k, what):
    """Per parameter block (W, b of each layer): |got - want| <= RTOL sqrt(k) scale, scale =
    max |want - start| + max |start| of the block."""
    tol = RTOL[np.dtype(dtype)] * math.sqrt(k)
    got, want, start = (np.asarray(a, np.float64) for a in (got, want, start))
    for e in plan["params"]:
        for name, lo, n in (("W", e["weight"], math.prod(e["weight_shape"])),
                            ("b", e["bias"], e["bias_shape"][0])):
            block = slice(lo, lo + n)
            scale = np.abs(want[block] - start[block]).max() + np.abs(start[block]).max()
            err = np.abs(got[block] - want[block]).max()
            assert err <= tol * scale, (f"{what}: grads of layers[{e['layer']}] {name} off by "
                                        f"{err:.3g} (tolerance {tol * scale:.3g})")


def near_ties(outputs, loss, dtype, k):
    """Rows whose prediction could flip under float32 rounding (0 for float64)."""
    if np.dtype(dtype) == np.float64 or loss == "mse":
        return 0
    z = np.asarray(outputs, np.float64)
    tol = 100 * RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(z).max())
    if z.shape[1] == 1:
        return int(np.sum(np.abs(z) <= tol))
    top2 = np.sort(z, axis=1)[:, -2:]
    return int(np.sum(top2[:, 1] - top2[:, 0] <= tol))


def check_result(got, want, outputs, loss, dtype, k, what):
    """(loss_sum, n_correct) against the twin's."""
    assert isinstance(got[0], float) and type(got[1]) is int, f"{what}: returned {got!r}"
    scale = abs(want[0]) + len(outputs) * (1 + float(np.abs(outputs).max(initial=0)))
    assert abs(got[0] - want[0]) <= RTOL[np.dtype(dtype)] * math.sqrt(k) * scale, (
        f"{what}: loss_sum {got[0]!r}, expected {want[0]!r}")
    slack = near_ties(outputs, loss, dtype, k)
    assert abs(got[1] - want[1]) <= slack, f"{what}: n_correct {got[1]}, expected {want[1]} (+-{slack})"
    if loss == "mse":
        assert got[1] == 0, what


def reference_outputs(model, params, x):
    _, layers, shape, loss = model
    plan = ref.model_plan(layers, shape, loss)
    out = np.empty((len(x), math.prod(plan["shapes"][-1])), x.dtype)
    ref.model_logits(layers, shape, loss, params, x, out)
    return out


# ---------------------------------------------------------------------------------------
# Model against the twin


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_model_matches_reference(isa, model, dtype):
    """loss_grad (grad_scale 0.25, into a gradient that is not zero), logits and evaluate, on
    1 and 2 threads; the inputs are left as they were; the getters describe the model."""
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, dtype)
    start = rng_for("start", name, dname(dtype)).standard_normal(params.size).astype(dtype)
    grads_ref = start.copy()
    want = ref.model_loss_grad(layers, shape, loss, params, grads_ref, x, labels, 0.25)
    outputs_ref = reference_outputs(model, params, x)
    k = reduction(plan, len(x))
    inputs = [a.copy() for a in (params, x, labels)]
    results = {}
    for threads in (1, 2):
        what = f"Model {name} dtype={dname(dtype)} threads={threads}"
        grads = start.copy()
        m = core.Model(layers, shape, loss, params, grads, threads=threads)
        assert (m.threads, m.loss, m.n_params, m.input_shape) == (threads, loss, params.size, shape)
        assert m.n_param_layers == len(plan["params"]) and m.params is params and m.grads is grads
        assert m.sizes == (math.prod(shape), *(math.prod(s) for s in plan["shapes"])), what
        got = m.loss_grad(x, labels, 0.25)
        check_result(got, want, outputs_ref, loss, dtype, k, what + " loss_grad")
        check_blocks(plan, grads, grads_ref, start, dtype, k, what + " loss_grad")
        outputs = np.full_like(outputs_ref, np.nan)
        m.logits(x, outputs)
        np.testing.assert_allclose(outputs, outputs_ref, rtol=0, err_msg=what + " logits",
                                   atol=RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(outputs_ref).max()))
        check_result(m.evaluate(x, labels), want, outputs_ref, loss, dtype, k, what + " evaluate")
        for before, after in zip(inputs, (params, x, labels)):
            np.testing.assert_array_equal(after, before, err_msg=what + " modified an input")
        results[threads] = got, grads
    # threads = 2 splits the images (conv) and the GEMMs: the same sums in another order
    check_result(results[2][0], results[1][0], outputs_ref, loss, dtype, k, f"Model {name} threads 2 vs 1")
    check_blocks(plan, results[2][1], results[1][1], start, dtype, k, f"Model {name} threads 2 vs 1")


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_steps_equal_loss_grad(model):
    """forward_loss, then backward_layer(P-1) ... (0) into another buffer, is loss_grad (to the
    bit: the same engine calls; the logistic fast path to rounding); a step out of order, or
    with no sweep in progress, is refused."""
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, tag="steps")
    whole, steps = np.zeros_like(params), np.zeros_like(params)
    m = core.Model(layers, shape, loss, params, whole, threads=2)
    got_whole = m.loss_grad(x, labels)
    got_steps = m.forward_loss(x, labels)
    n = m.n_param_layers
    if n > 1:
        with pytest.raises(RuntimeError, match=f"backward_layer\\(0\\) out of order: the next layer is {n - 1}"):
            m.backward_layer(0, grads=steps)
    for layer in reversed(range(n)):
        m.backward_layer(layer, grads=steps)
    with pytest.raises(RuntimeError, match="no forward_loss to go back from"):
        m.backward_layer(0, grads=steps)
    if name == "logistic":
        check_result(got_steps, got_whole, reference_outputs(model, params, x), loss, np.float64,
                     reduction(plan, len(x)), f"Model {name} steps")
        check_blocks(plan, steps, whole, np.zeros_like(params), np.float64, reduction(plan, len(x)),
                     f"Model {name} steps")
    else:
        assert got_steps == got_whole, name
        np.testing.assert_array_equal(steps, whole, err_msg=f"Model {name}: steps vs loss_grad")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("model", [MODELS[i] for i in (0, 1, 7, 10)], ids=[MODEL_IDS[i] for i in (0, 1, 7, 10)])
def test_gradients_accumulate_and_scale(model, dtype):
    """Two calls from zero give twice one call's gradient; grad_scale s gives s B times the
    default (1/B) gradient; grads= writes the given buffer and leaves the held one alone."""
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, dtype, tag="accumulate")
    k, what = reduction(plan, len(x)), f"Model {name} dtype={dname(dtype)}"
    held, other = np.zeros_like(params), np.zeros_like(params)
    m = core.Model(layers, shape, loss, params, held)
    first = m.loss_grad(x, labels)
    once = held.copy()
    assert np.any(once != 0)
    assert m.loss_grad(x, labels) == first
    check_blocks(plan, held, 2 * once, np.zeros_like(params), dtype, k, what + " accumulation")
    m.loss_grad(x, labels, 0.75, other)
    check_blocks(plan, other, 0.75 * len(x) * once, np.zeros_like(params), dtype, k, what + " grad_scale")
    check_blocks(plan, held, 2 * once, np.zeros_like(params), dtype, 1, what + " held grads after grads=")


# (id, layers, input_shape, loss, batch): the conv model's chunks are bounded by memory (its
# activations are ~23 KB a row: 727 rows), the MLP's by the 1024-row cap
CHUNKED = [
    ("conv-tanh-pool-mse", [("conv", 8, 3, 1), "tanh", "maxpool2", "flatten", ("dense", 3)],
     (4, 16, 16), "mse", 2000),
    ("mlp", [("dense", 20), "gelu", ("dense", 5)], (9,), "softmax_xent", 2500),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", CHUNKED, ids=[c[0] for c in CHUNKED])
def test_evaluate_and_logits_in_chunks(case, dtype):
    """Batches larger than a chunk: the chunks' sums add up to the twin's, each chunk reads its
    own labels / targets and writes its own output rows; a bad label in a later chunk is
    named by its row in the batch."""
    name, layers, shape, loss, batch = case
    model = case[:4]
    plan, params, x, labels = model_data(model, dtype, batch=batch, tag="chunks")
    grads = np.full_like(params, 3.0)
    m = core.Model(layers, shape, loss, params, grads)
    what, k = f"Model {name} B={batch} dtype={dname(dtype)}", reduction(plan, 1)
    outputs_ref = reference_outputs(model, params, x)
    check_result(m.evaluate(x, labels), ref.model_evaluate(layers, shape, loss, params, x, labels),
                 outputs_ref, loss, dtype, k, what + " evaluate")
    outputs = np.full_like(outputs_ref, np.nan)
    m.logits(x, outputs)
    np.testing.assert_allclose(outputs, outputs_ref, rtol=0, err_msg=what + " logits",
                               atol=RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(outputs_ref).max()))
    np.testing.assert_array_equal(grads, np.full_like(params, 3.0), err_msg=what + " wrote grads")
    if loss != "mse":
        labels[1500] = 5
        with pytest.raises(ValueError, match=r"labels\[1500\] = 5 is out of range"):
            m.evaluate(x, labels)


@pytest.mark.parametrize("model", [MODELS[i] for i in (0, 6, 7, 8)], ids=[MODEL_IDS[i] for i in (0, 6, 7, 8)])
def test_bad_label_names_its_row_and_leaves_grads(model):
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=70, tag="bad label")
    classes = 2 if loss == "sigmoid_bce" else math.prod(plan["shapes"][-1])
    grads = np.ones_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    for row, value in ((0, -1), (65, classes), (69, 2 ** 40)):
        bad = labels.copy()
        bad[row] = value
        for call in (lambda: m.loss_grad(x, bad), lambda: m.forward_loss(x, bad),
                     lambda: m.evaluate(x, bad)):
            with pytest.raises(ValueError, match=rf"labels\[{row}\] = {value} is out of range: "
                                                 rf"expected 0 <= label < {classes}"):
                call()
        np.testing.assert_array_equal(grads, np.ones_like(params), err_msg=f"Model {name}: wrote grads")
    with pytest.raises(RuntimeError, match="no forward_loss"):        # the refused sweep is none
        m.backward_layer(m.n_param_layers - 1)


def test_mse_targets_are_checked():
    model = MODELS[9]
    _, layers, shape, loss = model
    plan, params, x, targets = model_data(model, np.float64, batch=4)
    m = core.Model(layers, shape, loss, params, np.zeros_like(params))
    cases = [(None, TypeError, "targets must be a float64 array, got None"),
             (targets[:, :2].copy(), ValueError, r"targets has shape \(4, 2\), expected \(4, 3\)"),
             (targets.astype(np.float32), TypeError, "targets has dtype float32, expected float64"),
             (np.zeros(4, np.int64), TypeError, "targets has dtype int64")]
    for bad, exc, match in cases:
        for call in (m.loss_grad, m.forward_loss, m.evaluate):
            with pytest.raises(exc, match=match):
                call(x, bad)
    assert m.loss_grad(x, targets, 1.0) == (pytest.approx(ref.mse(reference_outputs(model, params, x), targets),
                                                          rel=1e-12), 0)


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_empty_batch(model):
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=0)
    grads = np.ones_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    assert m.loss_grad(x, labels) == (0.0, 0) == ref.model_loss_grad(layers, shape, loss, params,
                                                                      np.ones_like(params), x, labels)
    assert m.forward_loss(x, labels) == (0.0, 0)
    with pytest.raises(RuntimeError, match="no forward_loss"):     # nothing to go back from
        m.backward_layer(m.n_param_layers - 1)
    assert m.evaluate(x, labels) == (0.0, 0) == ref.model_evaluate(layers, shape, loss, params, x, labels)
    m.logits(x, np.empty((0, math.prod(plan["shapes"][-1]))))
    np.testing.assert_array_equal(grads, np.ones_like(params), err_msg=f"Model {name}")


# ---------------------------------------------------------------------------------------
# finite differences (float64)


def central_differences(loss, a, eps=1e-6):
    """d loss() / d a, a perturbed in place one entry at a time (the Model holds it)."""
    grad = np.empty(a.size)
    flat = a.reshape(-1)
    for i, old in enumerate(flat.copy()):
        flat[i] = old + eps
        up = loss()
        flat[i] = old - eps
        grad[i] = (up - loss()) / (2 * eps)
        flat[i] = old
    return grad


FD_MODELS = [
    ("cnn", [("conv", 2, 3, 1), "relu", "maxpool2", "flatten", ("dense", 3)], (1, 6, 5), "softmax_xent"),
    ("conv-pool-tanh", [("conv", 2, 2), "maxpool2", "tanh", ("conv", 2, 2, 1), "sigmoid", "flatten",
                        ("dense", 2)], (2, 5, 6), "softmax_xent"),
    ("gelu-bce", [("dense", 4), "gelu", ("dense", 3), "sigmoid", ("dense", 1)], (3,), "sigmoid_bce"),
    ("logistic", [("dense", 1)], (4,), "sigmoid_bce"),
    ("gelu-mse", ["gelu", ("conv", 2, 3), "gelu", "flatten", ("dense", 3), "tanh", ("dense", 2)],
     (1, 5, 5), "mse"),
]


@pytest.mark.parametrize("grad_scale", [None, 0.3], ids=["default_scale", "scale=0.3"])
@pytest.mark.parametrize("model", FD_MODELS, ids=[m[0] for m in FD_MODELS])
def test_gradient_matches_finite_differences(model, grad_scale):
    """loss_grad's gradient is the central difference of grad_scale * evaluate()'s loss."""
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=6, tag="fd")
    grads = np.zeros_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    m.loss_grad(x, labels, grad_scale)
    gs = 1 / len(x) if grad_scale is None else grad_scale
    numeric = central_differences(lambda: gs * m.evaluate(x, labels)[0], params)
    np.testing.assert_allclose(grads, numeric, rtol=1e-5, atol=1e-8,
                               err_msg=f"Model {name} gradient vs finite differences")


# ---------------------------------------------------------------------------------------
# model_plan


def test_plan_layout_of_a_small_cnn():
    """Shapes and the flat layout spelled out: W then b per layer, PyTorch's shapes."""
    plan = core.model_plan([("conv", 4, 3, 1), "relu", ("maxpool2",), "flatten", ("dense", 5),
                            ["gelu"], ("dense", 3)], (2, 8, 8))
    assert plan["layers"] == [("conv", 4, 3, 1), ("relu",), ("maxpool2",), ("flatten",), ("dense", 5),
                              ("gelu",), ("dense", 3)]
    assert plan["input_shape"] == (2, 8, 8) and plan["loss"] == "softmax_xent"
    assert plan["shapes"] == [(4, 8, 8), (4, 8, 8), (4, 4, 4), (64,), (5,), (5,), (3,)]
    assert plan["params"] == [
        {"layer": 0, "weight": 0, "weight_shape": (4, 2, 3, 3), "bias": 72, "bias_shape": (4,)},
        {"layer": 4, "weight": 76, "weight_shape": (5, 64), "bias": 396, "bias_shape": (5,)},
        {"layer": 6, "weight": 401, "weight_shape": (3, 5), "bias": 416, "bias_shape": (3,)}]
    assert plan["n_params"] == 419
    assert core.model_plan([("conv", 4, 3)], (1, 5, 5), loss="mse")["layers"] == [("conv", 4, 3, 0)]


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_plan_equals_the_twin(model):
    _, layers, shape, loss = model
    plan = core.model_plan(layers, shape, loss)
    stages = plan.pop("stages")
    assert plan == ref.model_plan(layers, shape, loss)
    # the stages run every layer but the flattens, once and in order
    kinds = [spec[0] for spec in plan["layers"]]
    ran = [i for s in stages for i in range(s["layers"][0], s["layers"][1] + 1) if kinds[i] != "flatten"]
    assert ran == [i for i, kind in enumerate(kinds) if kind != "flatten"]
    ops = [op for s in stages for op in s["ops"].split("+")]
    assert ops == [kind for kind in kinds if kind != "flatten"]


@pytest.mark.parametrize("layers,shape,stages", [
    ([("conv", 2, 3), "relu", "maxpool2", "flatten", ("dense", 2)], (1, 8, 8),
     ["conv+relu+maxpool2", "dense"]),
    ([("conv", 2, 3), "maxpool2", "tanh", ("dense", 2)], (1, 8, 8), ["conv+maxpool2+tanh", "dense"]),
    ([("conv", 2, 3), "maxpool2", "gelu", ("dense", 2)], (1, 8, 8), ["conv+maxpool2", "gelu", "dense"]),
    ([("conv", 2, 3), "flatten", "sigmoid", ("dense", 2)], (1, 8, 8), ["conv+sigmoid", "dense"]),
    ([("conv", 2, 3), "gelu", "maxpool2", ("dense", 2)], (1, 8, 8), ["conv", "gelu", "maxpool2", "dense"]),
    (["maxpool2", "relu", ("dense", 4), "relu", "tanh", ("dense", 2)], (1, 8, 8),
     ["maxpool2", "relu", "dense+relu", "tanh", "dense"]),
], ids=["conv+relu+pool", "conv+pool+tanh", "conv+pool,gelu", "conv+act-across-flatten",
        "standalone", "dense+act"])
def test_plan_fuses_the_documented_patterns(layers, shape, stages):
    assert [s["ops"] for s in core.model_plan(layers, shape)["stages"]] == stages


DENSE = ("dense", 2)
BAD_PLANS = [   # (id, layers, input_shape, loss, exception, what the message must say)
    ("unknown-kind", [("dense", 3), "softmax"], (4,), "softmax_xent", ValueError,
     r"layers\[1\]: unknown layer 'softmax'"),
    ("name-with-nul", ["relu\0junk", DENSE], (4,), "softmax_xent", ValueError,
     r"layers\[0\]: unknown layer 'relu\\x00junk'"),
    ("name-surrogate", ["\udcff", DENSE], (4,), "softmax_xent", ValueError,
     r"layers\[0\]: unknown layer '\\udcff'"),
    ("conv-on-flat", [("dense", 4), ("conv", 2, 3)], (5,), "mse", ValueError,
     r"layers\[1\] \('conv'\) gets a \(4,\) input: conv needs a \(C, H, W\) input"),
    ("pool-on-flat", ["flatten", "maxpool2", DENSE], (1, 4, 4), "mse", ValueError,
     r"layers\[1\] \('maxpool2'\) gets a \(16,\) input: max-pooling needs a \(C, H, W\) input"),
    ("kernel-too-large", [("conv", 2, 6, 1)], (1, 3, 7), "mse", ValueError,
     r"layers\[0\] \('conv'\) gets a \(1, 3, 7\) input: conv kernel larger than the padded input"),
    ("pool-below-2x2", [("conv", 2, 3), "maxpool2", "maxpool2", DENSE], (1, 5, 5), "mse", ValueError,
     r"layers\[2\] \('maxpool2'\) gets a \(2, 1, 1\) input: max-pooling needs a map of at least 2x2"),
    ("no-parameters", ["relu", "flatten"], (4,), "mse", ValueError,
     r"layers has no dense or conv layer"),
    ("softmax-1-output", [("dense", 4), ("dense", 1)], (5,), "softmax_xent", ValueError,
     r"softmax cross-entropy needs >= 2 outputs, but layers\[1\] \('dense'\) gives \(1,\)"),
    ("bce-2-outputs", [("dense", 2), "tanh"], (5,), "sigmoid_bce", ValueError,
     r"sigmoid BCE needs exactly 1 output, but layers\[1\] \('tanh'\) gives \(2,\)"),
    ("too-many-layers", [DENSE] * 65, (4,), "mse", ValueError, r"layers has 65 entries, expected 1 to 64"),
    ("no-layers", [], (4,), "mse", ValueError, r"layers has 0 entries"),
    ("float-size", [("dense", 2.5)], (4,), "mse", TypeError, r"layers\[0\] = \('dense', 2.5\): sizes must be ints"),
    ("str-size", [DENSE, ("conv", "3", 3)], (4,), "mse", TypeError, r"layers\[1\] = .*sizes must be ints, got str"),
    ("zero-size", [("dense", 0)], (4,), "mse", ValueError, r"layers\[0\] = .*the output size must be 1\.\."),
    ("huge-size", [("dense", 2 ** 31)], (4,), "mse", ValueError, r"layers\[0\] = .*the output size must be"),
    ("negative-padding", [("conv", 2, 3, -1)], (1, 4, 4), "mse", ValueError, r"layers\[0\] = .*padding must be 0\.\."),
    ("conv-one-size", [("conv", 2)], (1, 4, 4), "mse", ValueError, r"layers\[0\] = \('conv', 2\): 'conv' takes"),
    ("dense-no-size", [DENSE, ("dense",)], (4,), "mse", ValueError, r"layers\[1\] = .*'dense' takes one size"),
    ("relu-with-size", [("relu", 1), DENSE], (4,), "mse", ValueError, r"layers\[0\] = .*'relu' takes no sizes"),
    ("not-a-spec", [DENSE, 5], (4,), "mse", TypeError, r"layers\[1\] must be a layer name or a tuple"),
    ("name-not-first", [(3, "dense")], (4,), "mse", TypeError, r"layers\[0\] = .*the first entry must be"),
    ("layers-not-a-list", "relu", (4,), "mse", TypeError, r"layers must be a list"),
    ("params-overflow", [("dense", 2 ** 31 - 1)] * 3, (2 ** 31 - 1,), "mse", ValueError,
     r"layers\[2\] \('dense'\) gets a \(2147483647,\) input: parameter count overflows"),
    ("input-2-d", [DENSE], (2, 3), "mse", ValueError, r"input_shape .* has 2 entries"),
    ("input-zero", [DENSE], (0,), "mse", ValueError, r"input_shape .*positive"),
    ("input-too-large", [DENSE], [65536, 65536, 1], "mse", ValueError,
     r"input_shape \[65536, 65536, 1\]: the input size does not fit an int"),
    ("unknown-loss", [DENSE], (4,), "hinge", ValueError, r"loss must be"),
]


@pytest.mark.parametrize("case", BAD_PLANS, ids=[c[0] for c in BAD_PLANS])
def test_bad_layer_lists_are_named(case):
    """model_plan and Model refuse, naming the layer and what is wrong; the twin in the same
    words (the loss's wording aside: the C parser says what its "s" format takes)."""
    _, layers, shape, loss, exc, match = case
    with pytest.raises(exc, match=match) as c_error:
        core.model_plan(layers, shape, loss)
    with pytest.raises(exc, match=match if loss in ref.MODEL_LOSSES else "loss must be") as ref_error:
        ref.model_plan(layers, shape, loss)
    if loss in ref.MODEL_LOSSES:
        assert str(c_error.value) == str(ref_error.value)
    with pytest.raises(exc, match=match):
        core.Model(layers, shape, loss, np.zeros(4), np.zeros(4))


def test_model_checks_params_against_the_plan():
    layers, shape = [("dense", 3), "relu", ("dense", 2)], (4,)
    n = core.model_plan(layers, shape)["n_params"]
    with pytest.raises(ValueError, match=rf"params has shape \({n - 1},\), expected \({n},\)"):
        core.Model(layers, shape, "softmax_xent", np.zeros(n - 1), np.zeros(n))
    with pytest.raises(TypeError, match="grads"):
        core.Model(layers, shape, "softmax_xent", np.zeros(n), np.zeros(n, np.float32))
    with pytest.raises(ValueError, match="threads must be in"):
        core.Model(layers, shape, "softmax_xent", np.zeros(n), np.zeros(n), threads=0)


# ---------------------------------------------------------------------------------------
# PyTorch on the same weights (the conventions: layouts, GELU's erf form, MSE without 1/2)


def test_model_matches_pytorch():
    torch = pytest.importorskip("torch")
    model = ("mix", [("conv", 3, 3, 1), "gelu", "maxpool2", ("conv", 2, 2), "tanh", "flatten",
                     ("dense", 5), "sigmoid", ("dense", 3)], (2, 9, 8), "mse")
    _, layers, shape, loss = model
    plan, params, x, targets = model_data(model, np.float64, batch=5, tag="torch")
    grads = np.zeros_like(params)
    got = core.Model(layers, shape, loss, params, grads).loss_grad(x, targets, 1.0)
    views = {e["layer"]: e for e in plan["params"]}
    modules = []
    for i, (kind, *sizes) in enumerate(plan["layers"]):
        if kind in ("dense", "conv"):
            e = views[i]
            w = params[e["weight"]:e["weight"] + math.prod(e["weight_shape"])].reshape(e["weight_shape"])
            b = params[e["bias"]:e["bias"] + e["bias_shape"][0]]
            mod = (torch.nn.Linear(w.shape[1], w.shape[0]) if kind == "dense" else
                   torch.nn.Conv2d(w.shape[1], w.shape[0], sizes[1], padding=sizes[2])).double()
            with torch.no_grad():
                mod.weight.copy_(torch.from_numpy(w.copy()))
                mod.bias.copy_(torch.from_numpy(b.copy()))
        else:
            mod = {"maxpool2": lambda: torch.nn.MaxPool2d(2), "relu": torch.nn.ReLU, "tanh": torch.nn.Tanh,
                   "sigmoid": torch.nn.Sigmoid, "gelu": torch.nn.GELU, "flatten": torch.nn.Flatten}[kind]()
        modules.append(mod)
    net = torch.nn.Sequential(*modules)
    out = net(torch.from_numpy(x.reshape(len(x), *shape).copy()))
    torch_loss = torch.nn.MSELoss(reduction="sum")(out, torch.from_numpy(targets))
    torch_loss.backward()
    assert abs(got[0] - torch_loss.item()) <= 1e-10 * abs(torch_loss.item())
    for e, mod in ((views[i], modules[i]) for i in views):
        w_grad = grads[e["weight"]:e["weight"] + math.prod(e["weight_shape"])].reshape(e["weight_shape"])
        np.testing.assert_allclose(w_grad, mod.weight.grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grads[e["bias"]:e["bias"] + e["bias_shape"][0]], mod.bias.grad.numpy(),
                                   rtol=1e-9, atol=1e-12)
