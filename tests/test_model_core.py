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
- the two layer lists the models use most, dense stacks (an MLP's) and conv -> ReLU -> pool
  blocks then a dense stack (a CNN's), against the twin over odd sizes, every kernel ISA,
  threads, chunks, views, empty batches and finite differences;
- the boundary: bad construction and batches named, labels out of range, inputs untouched,
  no reference leaks, __init__ twice refused, two Python threads on their own models and on
  one, the GIL released.
"""

import math
import sys
import zlib

import numpy as np
import pytest
from _core_helpers import (
    DTYPES,
    N_CALLS,
    NETS,
    RTOL,
    assert_close,
    blocks_data,
    blocks_id,
    cnn_spec,
    conv_args,
    conv_gil_cases,
    dname,
    family_tests,
    gemm_job,
    mlp_spec,
    numeric_grad,
    randn,
    refcounts,
    rng_for,
    run_gemm,
    run_threads,
    small_convnet,
    small_net,
)

from dptrain import MLP
from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

# (id, layers, input_shape, loss)
MODELS = [
    (
        "cnn",
        [
            ("conv", 4, 3, 1),
            "relu",
            "maxpool2",
            ("conv", 3, 3),
            "relu",
            "maxpool2",
            "flatten",
            ("dense", 6),
            "relu",
            ("dense", 4),
        ],
        (2, 12, 11),
        "softmax_xent",
    ),
    (
        "conv-pool-tanh",
        [("conv", 3, 2), "maxpool2", "tanh", ("conv", 2, 2, 1), "sigmoid", "flatten", ("dense", 3)],
        (1, 9, 8),
        "softmax_xent",
    ),
    (
        "conv-flatten-relu",
        [("conv", 2, 3), "flatten", "relu", ("dense", 4), "flatten", "tanh", ("dense", 2)],
        (2, 6, 5),
        "softmax_xent",
    ),
    (
        "pool-first",
        [
            "tanh",
            "maxpool2",
            ("conv", 2, 3),
            "sigmoid",
            "maxpool2",
            "relu",
            "flatten",
            ("dense", 3),
        ],
        (1, 10, 11),
        "softmax_xent",
    ),
    ("gelu", [("dense", 9), "gelu", ("dense", 5), "gelu", ("dense", 3)], (7,), "softmax_xent"),
    (
        "flatten-only-dense",
        ["flatten", "flatten", ("dense", 6), "flatten", "sigmoid", ("dense", 2)],
        (2, 3, 3),
        "softmax_xent",
    ),
    ("mlp", [("dense", 33), "relu", ("dense", 7), "relu", ("dense", 3)], (17,), "softmax_xent"),
    ("logistic", [("dense", 1)], (13,), "sigmoid_bce"),
    ("bce", [("dense", 5), "sigmoid", ("dense", 1)], (6,), "sigmoid_bce"),
    ("mse", [("dense", 8), "tanh", ("dense", 3)], (5,), "mse"),
    (
        "conv-mse",
        [("conv", 2, 3, 1), "gelu", "maxpool2", ("conv", 3, 2), "flatten"],
        (2, 7, 7),
        "mse",
    ),
    ("conv-only", [("conv", 3, 3)], (1, 5, 4), "softmax_xent"),
    # the layers of issue 36: strides (odd maps, padding, a fused pool after one), average
    # pooling, global average pooling, dropout (its masks keyed like the twin's) and layer
    # norm, on a (C, H, W) map and on features, first among the parameterized layers too
    (
        "strided",
        [("conv", 3, 3, 1, 2), "relu", "maxpool2", ("conv", 4, 2, 0, 3), "flatten", ("dense", 3)],
        (2, 13, 11),
        "softmax_xent",
    ),
    (
        "avgpool-gap",
        [
            ("conv", 3, 3, 1),
            "relu",
            "avgpool2",
            ("conv", 4, 1, 0, 2),
            "globalavgpool",
            ("dense", 3),
        ],
        (2, 9, 7),
        "softmax_xent",
    ),
    (
        "dropout",
        [("dense", 12), "relu", ("dropout", 0.3), ("dense", 6), ("dropout", 0.5), ("dense", 3)],
        (5,),
        "softmax_xent",
    ),
    (
        "layernorm",
        [("layernorm",), ("dense", 8), ("layernorm",), "gelu", ("dense", 2)],
        (6,),
        "mse",
    ),
    (
        "resnet-parts",
        [
            ("conv", 4, 3, 1, 2),
            ("layernorm",),
            "relu",
            ("dropout", 0.2),
            ("conv", 4, 3, 1),
            "avgpool2",
            "globalavgpool",
            ("dense", 3),
        ],
        (1, 10, 10),
        "softmax_xent",
    ),
    # residual blocks: the identity, a strided 1x1 projection, nested, an activation fused
    # after the add, and on features
    (
        "residual",
        [
            ("conv", 4, 3, 1),
            "relu",
            "res_begin",
            ("conv", 4, 3, 1),
            "relu",
            ("conv", 4, 3, 1),
            "res_end",
            "relu",
            "res_begin",
            ("conv", 6, 3, 1, 2),
            ("layernorm",),
            "res_begin",
            "tanh",
            "res_end",
            "res_end",
            "globalavgpool",
            ("dense", 3),
        ],
        (2, 9, 8),
        "softmax_xent",
    ),
    (
        "batchnorm",
        [
            ("conv", 4, 3, 1),
            "batchnorm",
            "relu",
            "res_begin",
            ("conv", 4, 3, 1, 2),
            "batchnorm",
            "res_end",
            "flatten",
            ("dense", 6),
            "batchnorm",
            "tanh",
            ("dense", 3),
        ],
        (2, 7, 6),
        "softmax_xent",
    ),
    (
        "residual-mlp",
        [
            ("dense", 7),
            "res_begin",
            ("dense", 7),
            "gelu",
            ("dropout", 0.25),
            "res_end",
            ("dense", 2),
        ],
        (5,),
        "mse",
    ),
]
MODEL_IDS = [m[0] for m in MODELS]


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
        params[e["weight"] : e["weight"] + n_w] = rng.standard_normal(n_w) / math.sqrt(fan_in)
        params[e["bias"] : e["bias"] + e["bias_shape"][0]] = 0.1 * rng.standard_normal(
            e["bias_shape"]
        )
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
        for name, lo, n in (
            ("W", e["weight"], math.prod(e["weight_shape"])),
            ("b", e["bias"], e["bias_shape"][0]),
        ):
            block = slice(lo, lo + n)
            scale = np.abs(want[block] - start[block]).max() + np.abs(start[block]).max()
            err = np.abs(got[block] - want[block]).max()
            assert err <= tol * scale, (
                f"{what}: grads of layers[{e['layer']}] {name} off by "
                f"{err:.3g} (tolerance {tol * scale:.3g})"
            )


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
        f"{what}: loss_sum {got[0]!r}, expected {want[0]!r}"
    )
    slack = near_ties(outputs, loss, dtype, k)
    assert abs(got[1] - want[1]) <= slack, (
        f"{what}: n_correct {got[1]}, expected {want[1]} (+-{slack})"
    )
    if loss == "mse":
        assert got[1] == 0, what


def reference_outputs(model, params, x, state=None):
    _, layers, shape, loss = model
    plan = ref.model_plan(layers, shape, loss)
    out = np.empty((len(x), math.prod(plan["shapes"][-1])), x.dtype)
    ref.model_logits(layers, shape, loss, params, x, out, state=state)
    return out


def fresh_state(model):
    """A new model's batch norm statistics (means 0, variances 1), as the twin keeps them."""
    _, layers, shape, loss = model
    plan = ref.model_plan(layers, shape, loss)
    state = np.zeros(ref.model.model_state_size(plan))
    for _, var in ref.model._bn_views(plan, state).values():
        var[...] = 1
    return state


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
    state = fresh_state(model)
    want = ref.model_loss_grad(layers, shape, loss, params, grads_ref, x, labels, 0.25, state=state)
    # evaluation's loss: training's but for dropout, which passes its input on, and batch
    # norm, which normalizes by the running statistics (loss_grad has moved them once)
    want_eval = ref.model_evaluate(layers, shape, loss, params, x, labels, state=state)
    outputs_ref = reference_outputs(model, params, x, state)
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
        tol = 1e-4 if dtype == np.float32 else 1e-9  # statistics of the dtype's activations
        np.testing.assert_allclose(m.state, state, rtol=tol, atol=tol, err_msg=what + " state")
        outputs = np.full_like(outputs_ref, np.nan)
        m.logits(x, outputs)
        np.testing.assert_allclose(
            outputs,
            outputs_ref,
            rtol=0,
            err_msg=what + " logits",
            atol=RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(outputs_ref).max()),
        )
        check_result(
            m.evaluate(x, labels), want_eval, outputs_ref, loss, dtype, k, what + " evaluate"
        )
        for before, after in zip(inputs, (params, x, labels)):
            np.testing.assert_array_equal(after, before, err_msg=what + " modified an input")
        results[threads] = got, grads
    # threads = 2 splits the images (conv) and the GEMMs: the same sums in another order
    check_result(
        results[2][0], results[1][0], outputs_ref, loss, dtype, k, f"Model {name} threads 2 vs 1"
    )
    check_blocks(
        plan, results[2][1], results[1][1], start, dtype, k, f"Model {name} threads 2 vs 1"
    )


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
        with pytest.raises(
            RuntimeError, match=f"backward_layer\\(0\\) out of order: the next layer is {n - 1}"
        ):
            m.backward_layer(0, grads=steps)
    for layer in reversed(range(n)):
        m.backward_layer(layer, grads=steps)
    with pytest.raises(RuntimeError, match="no forward_loss to go back from"):
        m.backward_layer(0, grads=steps)
    if name == "logistic":
        check_result(
            got_steps,
            got_whole,
            reference_outputs(model, params, x),
            loss,
            np.float64,
            reduction(plan, len(x)),
            f"Model {name} steps",
        )
        check_blocks(
            plan,
            steps,
            whole,
            np.zeros_like(params),
            np.float64,
            reduction(plan, len(x)),
            f"Model {name} steps",
        )
    else:
        assert got_steps == got_whole, name
        np.testing.assert_array_equal(steps, whole, err_msg=f"Model {name}: steps vs loss_grad")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "model", [MODELS[i] for i in (0, 1, 7, 10)], ids=[MODEL_IDS[i] for i in (0, 1, 7, 10)]
)
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
    check_blocks(
        plan, other, 0.75 * len(x) * once, np.zeros_like(params), dtype, k, what + " grad_scale"
    )
    check_blocks(
        plan, held, 2 * once, np.zeros_like(params), dtype, 1, what + " held grads after grads="
    )


# (id, layers, input_shape, loss, batch): the conv model's chunks are bounded by memory (its
# activations are ~23 KB a row: 727 rows), the MLP's by the 1024-row cap
CHUNKED = [
    (
        "conv-tanh-pool-mse",
        [("conv", 8, 3, 1), "tanh", "maxpool2", "flatten", ("dense", 3)],
        (4, 16, 16),
        "mse",
        2000,
    ),
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
    check_result(
        m.evaluate(x, labels),
        ref.model_evaluate(layers, shape, loss, params, x, labels),
        outputs_ref,
        loss,
        dtype,
        k,
        what + " evaluate",
    )
    outputs = np.full_like(outputs_ref, np.nan)
    m.logits(x, outputs)
    np.testing.assert_allclose(
        outputs,
        outputs_ref,
        rtol=0,
        err_msg=what + " logits",
        atol=RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(outputs_ref).max()),
    )
    np.testing.assert_array_equal(grads, np.full_like(params, 3.0), err_msg=what + " wrote grads")
    if loss != "mse":
        labels[1500] = 5
        with pytest.raises(ValueError, match=r"labels\[1500\] = 5 is out of range"):
            m.evaluate(x, labels)


@pytest.mark.parametrize(
    "model", [MODELS[i] for i in (0, 6, 7, 8)], ids=[MODEL_IDS[i] for i in (0, 6, 7, 8)]
)
def test_bad_label_names_its_row_and_leaves_grads(model):
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=70, tag="bad label")
    classes = 2 if loss == "sigmoid_bce" else math.prod(plan["shapes"][-1])
    grads = np.ones_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    for row, value in ((0, -1), (65, classes), (69, 2**40)):
        bad = labels.copy()
        bad[row] = value
        for call in (
            lambda: m.loss_grad(x, bad),
            lambda: m.forward_loss(x, bad),
            lambda: m.evaluate(x, bad),
        ):
            with pytest.raises(
                ValueError,
                match=rf"labels\[{row}\] = {value} is out of range: "
                rf"expected 0 <= label < {classes}",
            ):
                call()
        np.testing.assert_array_equal(
            grads, np.ones_like(params), err_msg=f"Model {name}: wrote grads"
        )
    with pytest.raises(RuntimeError, match="no forward_loss"):  # the refused sweep is none
        m.backward_layer(m.n_param_layers - 1)


def test_mse_targets_are_checked():
    model = MODELS[9]
    _, layers, shape, loss = model
    plan, params, x, targets = model_data(model, np.float64, batch=4)
    m = core.Model(layers, shape, loss, params, np.zeros_like(params))
    cases = [
        (None, TypeError, "targets must be a float64 array, got None"),
        (targets[:, :2].copy(), ValueError, r"targets has shape \(4, 2\), expected \(4, 3\)"),
        (targets.astype(np.float32), TypeError, "targets has dtype float32, expected float64"),
        (np.zeros(4, np.int64), TypeError, "targets has dtype int64"),
    ]
    for bad, exc, match in cases:
        for call in (m.loss_grad, m.forward_loss, m.evaluate):
            with pytest.raises(exc, match=match):
                call(x, bad)
    assert m.loss_grad(x, targets, 1.0) == (
        pytest.approx(ref.mse(reference_outputs(model, params, x), targets), rel=1e-12),
        0,
    )


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_empty_batch(model):
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=0)
    grads = np.ones_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    assert (
        m.loss_grad(x, labels)
        == (0.0, 0)
        == ref.model_loss_grad(layers, shape, loss, params, np.ones_like(params), x, labels)
    )
    assert m.forward_loss(x, labels) == (0.0, 0)
    # a share of no rows (a worker's, of a batch with fewer rows than workers) is a sweep:
    # its steps come in order as the others' do (overlap's), and add nothing
    for layer in reversed(range(m.n_param_layers)):
        m.backward_layer(layer)
    with pytest.raises(RuntimeError, match="no forward_loss"):  # that sweep has ended
        m.backward_layer(m.n_param_layers - 1)
    assert (
        m.evaluate(x, labels)
        == (0.0, 0)
        == ref.model_evaluate(layers, shape, loss, params, x, labels)
    )
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
    (
        "cnn",
        [("conv", 2, 3, 1), "relu", "maxpool2", "flatten", ("dense", 3)],
        (1, 6, 5),
        "softmax_xent",
    ),
    (
        "conv-pool-tanh",
        [("conv", 2, 2), "maxpool2", "tanh", ("conv", 2, 2, 1), "sigmoid", "flatten", ("dense", 2)],
        (2, 5, 6),
        "softmax_xent",
    ),
    (
        "gelu-bce",
        [("dense", 4), "gelu", ("dense", 3), "sigmoid", ("dense", 1)],
        (3,),
        "sigmoid_bce",
    ),
    ("logistic", [("dense", 1)], (4,), "sigmoid_bce"),
    (
        "gelu-mse",
        ["gelu", ("conv", 2, 3), "gelu", "flatten", ("dense", 3), "tanh", ("dense", 2)],
        (1, 5, 5),
        "mse",
    ),
    (
        "strided-avgpool-gap",
        [
            ("conv", 3, 3, 1, 2),
            "tanh",
            "avgpool2",
            ("conv", 2, 1, 0, 2),
            "globalavgpool",
            ("dense", 2),
        ],
        (2, 9, 10),
        "softmax_xent",
    ),
    (
        "layernorm",
        [("dense", 5), ("layernorm",), "tanh", ("dense", 4), ("layernorm",), ("dense", 2)],
        (3,),
        "mse",
    ),
    (
        "residual",
        [
            ("conv", 2, 3, 1),
            "res_begin",
            ("conv", 2, 3, 1),
            "tanh",
            "res_end",
            "res_begin",
            ("conv", 3, 3, 1, 2),
            "res_end",
            "sigmoid",
            "flatten",
            ("dense", 2),
        ],
        (1, 6, 5),
        "softmax_xent",
    ),
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
    np.testing.assert_allclose(
        grads, numeric, rtol=1e-5, atol=1e-8, err_msg=f"Model {name} gradient vs finite differences"
    )


TRAIN_FD_MODELS = [  # layers whose training loss is not evaluate's: differenced through loss_grad
    (
        "batchnorm",
        [
            ("conv", 3, 3, 1),
            "batchnorm",
            "tanh",
            "flatten",
            ("dense", 4),
            "batchnorm",
            ("dense", 2),
        ],
        (2, 4, 5),
        "softmax_xent",
    ),
    (
        "dropout-batchnorm-residual",
        [("dense", 5), "res_begin", "batchnorm", ("dropout", 0.4), "res_end", ("dense", 3)],
        (4,),
        "mse",
    ),
]


@pytest.mark.parametrize("model", TRAIN_FD_MODELS, ids=[m[0] for m in TRAIN_FD_MODELS])
def test_training_gradient_matches_finite_differences(model):
    """Batch norm (the batch's statistics) and dropout (the same masks: the key is fixed):
    loss_grad's gradient is the central difference of its own loss."""
    name, layers, shape, loss = model
    plan, params, x, labels = model_data(model, np.float64, batch=6, tag="fd")
    grads = np.zeros_like(params)
    m = core.Model(layers, shape, loss, params, grads)
    m.set_rng(5, 3, 0)
    m.loss_grad(x, labels, 0.5)
    scratch = np.zeros_like(params)
    numeric = central_differences(lambda: 0.5 * m.loss_grad(x, labels, 0.5, scratch)[0], params)
    np.testing.assert_allclose(
        grads, numeric, rtol=1e-5, atol=1e-8, err_msg=f"Model {name} gradient vs finite differences"
    )


# ---------------------------------------------------------------------------------------
# model_plan


def test_plan_layout_of_a_small_cnn():
    """Shapes and the flat layout spelled out: W then b per layer, PyTorch's shapes."""
    plan = core.model_plan(
        [("conv", 4, 3, 1), "relu", ("maxpool2",), "flatten", ("dense", 5), ["gelu"], ("dense", 3)],
        (2, 8, 8),
    )
    assert plan["layers"] == [
        ("conv", 4, 3, 1),
        ("relu",),
        ("maxpool2",),
        ("flatten",),
        ("dense", 5),
        ("gelu",),
        ("dense", 3),
    ]
    assert plan["input_shape"] == (2, 8, 8) and plan["loss"] == "softmax_xent"
    assert plan["shapes"] == [(4, 8, 8), (4, 8, 8), (4, 4, 4), (64,), (5,), (5,), (3,)]
    assert plan["params"] == [
        {"layer": 0, "weight": 0, "weight_shape": (4, 2, 3, 3), "bias": 72, "bias_shape": (4,)},
        {"layer": 4, "weight": 76, "weight_shape": (5, 64), "bias": 396, "bias_shape": (5,)},
        {"layer": 6, "weight": 401, "weight_shape": (3, 5), "bias": 416, "bias_shape": (3,)},
    ]
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
    ran = [
        i
        for s in stages
        for i in range(s["layers"][0], s["layers"][1] + 1)
        if kinds[i] != "flatten"
    ]
    assert ran == [i for i, kind in enumerate(kinds) if kind != "flatten"]
    ops = [op for s in stages for op in s["ops"].split("+")]
    assert ops == [kind for kind in kinds if kind != "flatten"]


@pytest.mark.parametrize(
    "layers,shape,stages",
    [
        (
            [("conv", 2, 3), "relu", "maxpool2", "flatten", ("dense", 2)],
            (1, 8, 8),
            ["conv+relu+maxpool2", "dense"],
        ),
        (
            [("conv", 2, 3), "maxpool2", "tanh", ("dense", 2)],
            (1, 8, 8),
            ["conv+maxpool2+tanh", "dense"],
        ),
        (
            [("conv", 2, 3), "maxpool2", "gelu", ("dense", 2)],
            (1, 8, 8),
            ["conv+maxpool2", "gelu", "dense"],
        ),
        (
            [("conv", 2, 3), "flatten", "sigmoid", ("dense", 2)],
            (1, 8, 8),
            ["conv+sigmoid", "dense"],
        ),
        (
            [("conv", 2, 3), "gelu", "maxpool2", ("dense", 2)],
            (1, 8, 8),
            ["conv", "gelu", "maxpool2", "dense"],
        ),
        (
            ["maxpool2", "relu", ("dense", 4), "relu", "tanh", ("dense", 2)],
            (1, 8, 8),
            ["maxpool2", "relu", "dense+relu", "tanh", "dense"],
        ),
    ],
    ids=[
        "conv+relu+pool",
        "conv+pool+tanh",
        "conv+pool,gelu",
        "conv+act-across-flatten",
        "standalone",
        "dense+act",
    ],
)
def test_plan_fuses_the_documented_patterns(layers, shape, stages):
    assert [s["ops"] for s in core.model_plan(layers, shape)["stages"]] == stages


DENSE = ("dense", 2)
BAD_PLANS = [  # (id, layers, input_shape, loss, exception, what the message must say)
    (
        "dropout-rate-1",
        [("dropout", 1.0), DENSE],
        (4,),
        "mse",
        ValueError,
        r"layers\[0\] = \('dropout', 1.0\): dropout's rate must be in \[0, 1\)",
    ),
    (
        "dropout-rate-negative",
        [DENSE, ("dropout", -0.1)],
        (4,),
        "mse",
        ValueError,
        r"dropout's rate must be in \[0, 1\)",
    ),
    (
        "dropout-rate-nan",
        [("dropout", float("nan")), DENSE],
        (4,),
        "mse",
        ValueError,
        r"dropout's rate must be in \[0, 1\)",
    ),
    (
        "dropout-rate-text",
        [("dropout", "0.5"), DENSE],
        (4,),
        "mse",
        TypeError,
        r"dropout's rate must be a number, got str",
    ),
    ("dropout-no-rate", ["dropout", DENSE], (4,), "mse", ValueError, r"one rate: \('dropout', p\)"),
    (
        "conv-stride-0",
        [("conv", 2, 3, 0, 0)],
        (1, 5, 5),
        "mse",
        ValueError,
        r"the stride must be 1\.\.2147483647",
    ),
    (
        "conv-five-sizes",
        [("conv", 2, 3, 0, 1, 1)],
        (1, 5, 5),
        "mse",
        ValueError,
        r"\('conv', out_channels, kernel\[, padding\[, stride\]\]\)",
    ),
    (
        "avgpool-on-flat",
        ["flatten", "avgpool2", DENSE],
        (1, 4, 4),
        "mse",
        ValueError,
        r"layers\[1\] \('avgpool2'\) gets a \(16,\) input: average pooling needs a \(C, H, W\)",
    ),
    (
        "avgpool-1-row",
        ["avgpool2", DENSE],
        (2, 1, 4),
        "mse",
        ValueError,
        r"average pooling needs a map of at least 2x2",
    ),
    (
        "gap-on-flat",
        [DENSE, "globalavgpool", DENSE],
        (4,),
        "mse",
        ValueError,
        r"\('globalavgpool'\) gets a \(2,\) input: global average pooling needs a \(C, H, W\)",
    ),
    ("layernorm-sizes", [("layernorm", 3), DENSE], (4,), "mse", ValueError, r"takes no sizes"),
    (
        "res-end-alone",
        [DENSE, "res_end"],
        (4,),
        "mse",
        ValueError,
        r"layers\[1\] \('res_end'\) gets a \(2,\) input: res_end without its res_begin",
    ),
    (
        "res-not-closed",
        ["res_begin", DENSE, "res_begin", DENSE, "res_end"],
        (4,),
        "mse",
        ValueError,
        r"layers\[0\] \('res_begin'\) gets a \(4,\) input: a residual block is not closed",
    ),
    (
        "res-features-width",
        ["res_begin", DENSE, "res_end"],
        (4,),
        "mse",
        ValueError,
        r"a residual block on features must keep their number",
    ),
    (
        "res-no-projection",
        ["res_begin", ("conv", 2, 3), "res_end", DENSE],
        (1, 9, 9),
        "mse",
        ValueError,
        r"layers\[2\] \('res_end'\) gets a \(2, 7, 7\) input: no 1x1 projection",
    ),
    (
        "unknown-kind",
        [("dense", 3), "softmax"],
        (4,),
        "softmax_xent",
        ValueError,
        r"layers\[1\]: unknown layer 'softmax'",
    ),
    (
        "name-with-nul",
        ["relu\0junk", DENSE],
        (4,),
        "softmax_xent",
        ValueError,
        r"layers\[0\]: unknown layer 'relu\\x00junk'",
    ),
    (
        "name-surrogate",
        ["\udcff", DENSE],
        (4,),
        "softmax_xent",
        ValueError,
        r"layers\[0\]: unknown layer '\\udcff'",
    ),
    (
        "conv-on-flat",
        [("dense", 4), ("conv", 2, 3)],
        (5,),
        "mse",
        ValueError,
        r"layers\[1\] \('conv'\) gets a \(4,\) input: conv needs a \(C, H, W\) input",
    ),
    (
        "pool-on-flat",
        ["flatten", "maxpool2", DENSE],
        (1, 4, 4),
        "mse",
        ValueError,
        r"layers\[1\] \('maxpool2'\) gets a \(16,\) input: max-pooling needs a \(C, H, W\) input",
    ),
    (
        "kernel-too-large",
        [("conv", 2, 6, 1)],
        (1, 3, 7),
        "mse",
        ValueError,
        r"layers\[0\] \('conv'\) gets a \(1, 3, 7\) input: "
        r"conv kernel larger than the padded input",
    ),
    (
        "pool-below-2x2",
        [("conv", 2, 3), "maxpool2", "maxpool2", DENSE],
        (1, 5, 5),
        "mse",
        ValueError,
        r"layers\[2\] \('maxpool2'\) gets a \(2, 1, 1\) input: "
        r"max-pooling needs a map of at least 2x2",
    ),
    (
        "no-parameters",
        ["relu", "flatten"],
        (4,),
        "mse",
        ValueError,
        r"layers has no dense, conv, layernorm or batchnorm layer",
    ),
    (
        "softmax-1-output",
        [("dense", 4), ("dense", 1)],
        (5,),
        "softmax_xent",
        ValueError,
        r"softmax cross-entropy needs >= 2 outputs, but layers\[1\] \('dense'\) gives \(1,\)",
    ),
    (
        "bce-2-outputs",
        [("dense", 2), "tanh"],
        (5,),
        "sigmoid_bce",
        ValueError,
        r"sigmoid BCE needs exactly 1 output, but layers\[1\] \('tanh'\) gives \(2,\)",
    ),
    (
        "too-many-layers",
        [DENSE] * 65,
        (4,),
        "mse",
        ValueError,
        r"layers has 65 entries, expected 1 to 64",
    ),
    ("no-layers", [], (4,), "mse", ValueError, r"layers has 0 entries"),
    (
        "float-size",
        [("dense", 2.5)],
        (4,),
        "mse",
        TypeError,
        r"layers\[0\] = \('dense', 2.5\): sizes must be ints",
    ),
    (
        "str-size",
        [DENSE, ("conv", "3", 3)],
        (4,),
        "mse",
        TypeError,
        r"layers\[1\] = .*sizes must be ints, got str",
    ),
    (
        "zero-size",
        [("dense", 0)],
        (4,),
        "mse",
        ValueError,
        r"layers\[0\] = .*the output size must be 1\.\.",
    ),
    (
        "huge-size",
        [("dense", 2**31)],
        (4,),
        "mse",
        ValueError,
        r"layers\[0\] = .*the output size must be",
    ),
    (
        "negative-padding",
        [("conv", 2, 3, -1)],
        (1, 4, 4),
        "mse",
        ValueError,
        r"layers\[0\] = .*padding must be 0\.\.",
    ),
    (
        "conv-one-size",
        [("conv", 2)],
        (1, 4, 4),
        "mse",
        ValueError,
        r"layers\[0\] = \('conv', 2\): 'conv' takes",
    ),
    (
        "dense-no-size",
        [DENSE, ("dense",)],
        (4,),
        "mse",
        ValueError,
        r"layers\[1\] = .*'dense' takes one size",
    ),
    (
        "relu-with-size",
        [("relu", 1), DENSE],
        (4,),
        "mse",
        ValueError,
        r"layers\[0\] = .*'relu' takes no sizes",
    ),
    (
        "not-a-spec",
        [DENSE, 5],
        (4,),
        "mse",
        TypeError,
        r"layers\[1\] must be a layer name or a tuple",
    ),
    (
        "name-not-first",
        [(3, "dense")],
        (4,),
        "mse",
        TypeError,
        r"layers\[0\] = .*the first entry must be",
    ),
    ("layers-not-a-list", "relu", (4,), "mse", TypeError, r"layers must be a list"),
    (
        "params-overflow",
        [("dense", 2**31 - 1)] * 3,
        (2**31 - 1,),
        "mse",
        ValueError,
        r"layers\[2\] \('dense'\) gets a \(2147483647,\) input: parameter count overflows",
    ),
    ("input-2-d", [DENSE], (2, 3), "mse", ValueError, r"input_shape .* has 2 entries"),
    ("input-zero", [DENSE], (0,), "mse", ValueError, r"input_shape .*positive"),
    (
        "input-too-large",
        [DENSE],
        [65536, 65536, 1],
        "mse",
        ValueError,
        r"input_shape \[65536, 65536, 1\]: the input size does not fit an int",
    ),
    ("unknown-loss", [DENSE], (4,), "hinge", ValueError, r"loss must be"),
]


@pytest.mark.parametrize("case", BAD_PLANS, ids=[c[0] for c in BAD_PLANS])
def test_bad_layer_lists_are_named(case):
    """model_plan and Model refuse, naming the layer and what is wrong; the twin in the same
    words (the loss's wording aside: the C parser says what its "s" format takes)."""
    _, layers, shape, loss, exc, match = case
    with pytest.raises(exc, match=match) as c_error:
        core.model_plan(layers, shape, loss)
    with pytest.raises(
        exc, match=match if loss in ref.MODEL_LOSSES else "loss must be"
    ) as ref_error:
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
    model = (
        "mix",
        [
            ("conv", 3, 3, 1),
            "gelu",
            "maxpool2",
            ("conv", 2, 2),
            "tanh",
            "flatten",
            ("dense", 5),
            "sigmoid",
            ("dense", 3),
        ],
        (2, 9, 8),
        "mse",
    )
    _, layers, shape, loss = model
    plan, params, x, targets = model_data(model, np.float64, batch=5, tag="torch")
    grads = np.zeros_like(params)
    got = core.Model(layers, shape, loss, params, grads).loss_grad(x, targets, 1.0)
    views = {e["layer"]: e for e in plan["params"]}
    modules = []
    for i, (kind, *sizes) in enumerate(plan["layers"]):
        if kind in ("dense", "conv"):
            e = views[i]
            w = params[e["weight"] : e["weight"] + math.prod(e["weight_shape"])].reshape(
                e["weight_shape"]
            )
            b = params[e["bias"] : e["bias"] + e["bias_shape"][0]]
            mod = (
                torch.nn.Linear(w.shape[1], w.shape[0])
                if kind == "dense"
                else torch.nn.Conv2d(w.shape[1], w.shape[0], sizes[1], padding=sizes[2])
            ).double()
            with torch.no_grad():
                mod.weight.copy_(torch.from_numpy(w.copy()))
                mod.bias.copy_(torch.from_numpy(b.copy()))
        else:
            mod = {
                "maxpool2": lambda: torch.nn.MaxPool2d(2),
                "relu": torch.nn.ReLU,
                "tanh": torch.nn.Tanh,
                "sigmoid": torch.nn.Sigmoid,
                "gelu": torch.nn.GELU,
                "flatten": torch.nn.Flatten,
            }[kind]()
        modules.append(mod)
    net = torch.nn.Sequential(*modules)
    out = net(torch.from_numpy(x.reshape(len(x), *shape).copy()))
    torch_loss = torch.nn.MSELoss(reduction="sum")(out, torch.from_numpy(targets))
    torch_loss.backward()
    assert abs(got[0] - torch_loss.item()) <= 1e-10 * abs(torch_loss.item())
    for e, mod in ((views[i], modules[i]) for i in views):
        w_grad = grads[e["weight"] : e["weight"] + math.prod(e["weight_shape"])].reshape(
            e["weight_shape"]
        )
        np.testing.assert_allclose(w_grad, mod.weight.grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(
            grads[e["bias"] : e["bias"] + e["bias_shape"][0]],
            mod.bias.grad.numpy(),
            rtol=1e-9,
            atol=1e-12,
        )


# ---------------------------------------------------------------------------------------
# dense stacks: dense layers with ReLU between them, none after the last


NET_CASES = [  # (sizes, loss, B)
    ((784, 256, 128, 10), "softmax_xent", 64),
    ((7, 33, 3), "softmax_xent", 129),
    ((7, 33, 3), "softmax_xent", 1),
    ((1, 2), "softmax_xent", 33),
    ((5, 1), "sigmoid_bce", 33),  # one layer, one output: the fused logistic kernel
    ((20, 1), "sigmoid_bce", 129),  # fused, more than one 64-row block
    ((20, 1), "sigmoid_bce", 1),
    ((20, 7, 1), "sigmoid_bce", 33),  # BCE through the general layer path
]


def stack_id(case):
    sizes, loss, batch = case
    return f"{'-'.join(map(str, sizes))}-{loss}-B{batch}"


def stack_data(sizes, loss, batch, dtype, tag="net"):
    rng = rng_for(tag, sizes, loss, batch, dname(dtype))
    params = ref.model_init_params(
        *mlp_spec(sizes, loss), seed=zlib.crc32(repr((tag, sizes)).encode()), dtype=dtype
    )
    x = randn(rng, (batch, sizes[0]), dtype)
    n_classes = 2 if loss == "sigmoid_bce" else sizes[-1]
    labels = rng.integers(0, n_classes, batch)
    return params, x, labels, rng


def ambiguous_rows(logits, loss, dtype, k):
    """Rows whose prediction could flip under rounding: top-2 gap (or |z|) within tolerance."""
    logits = np.asarray(logits, np.float64)
    tol = 100 * RTOL[np.dtype(dtype)] * math.sqrt(k) * (1 + np.abs(logits).max())
    if loss == "sigmoid_bce":
        return int(np.sum(np.abs(logits.reshape(-1)) <= tol))
    top2 = np.sort(logits, axis=1)[:, -2:]
    return int(np.sum(top2[:, 1] - top2[:, 0] <= tol))


def net_k(sizes, batch):
    """Reduction length that bounds the rounding of a forward/backward pass."""
    return max(sizes) + batch


def assert_grads_close(sizes, loss, grads, grads_ref, grads0, dtype, k, what):
    """Per-block (W_l, b_l) comparison, relative to the largest entry of the block."""
    blocks = zip(
        *(ref.model_unflatten(*mlp_spec(sizes, loss), flat) for flat in (grads, grads_ref, grads0))
    )
    for layer, ((w, b), (w_ref, b_ref), (w0, b0)) in enumerate(blocks):
        for name, got, want, start in [("W", w, w_ref, w0), ("b", b, b_ref, b0)]:
            scale = np.abs(want - start).max() + np.abs(start).max()
            assert_close(
                got, want, dtype=dtype, scale=scale, k=k, what=f"{what} grads {name}_{layer}"
            )


def check_loss_and_correct(got, want, logits_ref, loss, dtype, k, batch, what):
    loss_sum, n_correct = got
    loss_ref, correct_ref = want
    assert isinstance(loss_sum, float) and isinstance(n_correct, int), what
    scale = abs(loss_ref) + batch * (1 + float(np.abs(logits_ref).max()))
    assert_close(loss_sum, loss_ref, dtype=dtype, scale=scale, k=k, what=what + " loss_sum")
    slack = 0 if np.dtype(dtype) == np.float64 else ambiguous_rows(logits_ref, loss, dtype, k)
    assert abs(n_correct - correct_ref) <= slack, (
        f"{what}: n_correct {n_correct}, expected {correct_ref} (+-{slack} near-ties)"
    )


def reference_logits(sizes, loss, params, x):
    out = np.empty((x.shape[0], sizes[-1]), x.dtype)
    ref.model_logits(*mlp_spec(sizes, loss), params, x, out)
    return out


@pytest.mark.parametrize("grad_scale", [None, 0.25], ids=["default_scale", "scale=0.25"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NET_CASES, ids=stack_id)
def test_dense_stack_loss_grad(isa, case, dtype, grad_scale):
    sizes, loss, batch = case
    params, x, labels, rng = stack_data(sizes, loss, batch, dtype)
    grads0 = randn(rng, params.shape, dtype)  # loss_grad accumulates into whatever is there
    grads, grads_ref = grads0.copy(), grads0.copy()
    params_in, x_in, labels_in = params.copy(), x.copy(), labels.copy()
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    got = net.loss_grad(x, labels) if grad_scale is None else net.loss_grad(x, labels, grad_scale)
    want = ref.model_loss_grad(*mlp_spec(sizes, loss), params, grads_ref, x, labels, grad_scale)
    what = f"Model.loss_grad[{isa}] {stack_id(case)} dtype={dname(dtype)} gs={grad_scale}"
    k = net_k(sizes, batch)
    check_loss_and_correct(
        got, want, reference_logits(sizes, loss, params, x), loss, dtype, k, batch, what
    )
    assert_grads_close(sizes, loss, grads, grads_ref, grads0, dtype, k, what)
    np.testing.assert_array_equal(params, params_in, err_msg=what + " modified params")
    np.testing.assert_array_equal(x, x_in, err_msg=what + " modified x")
    np.testing.assert_array_equal(labels, labels_in, err_msg=what + " modified labels")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NET_CASES, ids=stack_id)
def test_dense_stack_loss_grad_accumulates(case, dtype):
    """Two calls on the same batch from zero grads give twice the gradient of one call."""
    sizes, loss, batch = case
    params, x, labels, _ = stack_data(sizes, loss, batch, dtype, tag="accumulate")
    grads = np.zeros_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    first = net.loss_grad(x, labels)
    once = grads.copy()
    second = net.loss_grad(x, labels)
    assert first == second
    assert np.any(once != 0)
    assert_close(
        grads,
        2 * once,
        dtype=dtype,
        scale=2 * np.abs(once).max(),
        k=batch,
        what=f"Model.loss_grad accumulation {stack_id(case)} dtype={dname(dtype)}",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(
    "sizes,loss",
    [
        ((784, 256, 128, 10), "softmax_xent"),
        ((7, 33, 3), "softmax_xent"),
        ((20, 1), "sigmoid_bce"),
        ((20, 7, 1), "sigmoid_bce"),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_dense_stack_evaluate_and_logits_chunked(sizes, loss, dtype):
    """B = 2500 is evaluated in 1024-row chunks: 1024 + 1024 + 452."""
    batch = 2500
    params, x, labels, _ = stack_data(sizes, loss, batch, dtype, tag="evaluate")
    grads = np.full_like(params, 3.0)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    what = f"Model.evaluate {'-'.join(map(str, sizes))} B={batch} dtype={dname(dtype)}"
    k = net_k(sizes, 1)
    logits_ref = reference_logits(sizes, loss, params, x)
    got = net.evaluate(x, labels)
    want = ref.model_evaluate(*mlp_spec(sizes, loss), params, x, labels)
    check_loss_and_correct(got, want, logits_ref, loss, dtype, k, batch, what)
    logits = np.full((batch, sizes[-1]), np.nan, dtype)
    net.logits(x, logits)
    scale = 1 + np.abs(logits_ref).max()
    assert_close(logits, logits_ref, dtype=dtype, scale=scale, k=k, what=what + " logits")
    np.testing.assert_array_equal(
        grads, np.full_like(params, 3.0), err_msg="evaluate/logits must not touch grads"
    )
    # evaluate is the forward of loss_grad: the same loss and count on the same batch
    small = slice(0, 100)
    lg = core.Model(*mlp_spec(sizes, loss), params, np.zeros_like(params)).loss_grad(
        x[small], labels[small]
    )
    ev = net.evaluate(x[small], labels[small])
    assert_close(
        lg[0],
        ev[0],
        dtype=dtype,
        scale=abs(ev[0]) + 100,
        k=k,
        what=what + " evaluate vs loss_grad loss",
    )
    assert lg[1] == ev[1]


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(
    "case",
    [
        ((784, 256, 128, 10), "softmax_xent", 129),
        ((7, 33, 3), "softmax_xent", 7),
        ((20, 7, 1), "sigmoid_bce", 33),
        ((20, 1), "sigmoid_bce", 129),
    ],
    ids=stack_id,
)
def test_dense_stack_threads_match_one_thread(isa, case, threads, dtype):
    sizes, loss, batch = case
    params, x, labels, _ = stack_data(sizes, loss, batch, dtype, tag="threads")
    g1, gt = np.zeros_like(params), np.zeros_like(params)
    net1 = core.Model(*mlp_spec(sizes, loss), params, g1, threads=1)
    nett = core.Model(*mlp_spec(sizes, loss), params, gt, threads=threads)
    assert nett.threads == threads
    what = f"Model threads={threads} vs 1 {stack_id(case)} dtype={dname(dtype)}"
    k = net_k(sizes, batch)
    r1, rt = net1.loss_grad(x, labels), nett.loss_grad(x, labels)
    logits1 = np.empty((batch, sizes[-1]), dtype)
    net1.logits(x, logits1)
    check_loss_and_correct(rt, r1, logits1, loss, dtype, k, batch, what)
    assert_grads_close(sizes, loss, gt, g1, np.zeros_like(params), dtype, k, what)
    logits_t = np.empty_like(logits1)
    nett.logits(x, logits_t)
    assert_close(
        logits_t, logits1, dtype=dtype, scale=1 + np.abs(logits1).max(), k=k, what=what + " logits"
    )
    check_loss_and_correct(
        nett.evaluate(x, labels),
        net1.evaluate(x, labels),
        logits1,
        loss,
        dtype,
        k,
        batch,
        what + " evaluate",
    )


@pytest.mark.parametrize(
    "sizes,loss,grad_scale",
    [
        ((4, 5, 3), "softmax_xent", None),
        ((3, 4, 5, 2), "softmax_xent", 0.3),
        ((4, 5, 1), "sigmoid_bce", None),
        ((4, 1), "sigmoid_bce", 0.3),  # the fused logistic kernel
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_dense_stack_gradient_finite_differences(sizes, loss, grad_scale):
    """loss_grad's gradient equals central differences of grad_scale * evaluate()'s loss.

    The Model holds params by reference, so perturbing the array in place is seen by
    evaluate: this also checks that the held buffer is the caller's, not a copy.
    """
    batch = 7
    params, x, labels, _ = stack_data(sizes, loss, batch, np.float64, tag="fd")
    grads = np.zeros_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    net.loss_grad(x, labels, grad_scale)
    gs = 1.0 / batch if grad_scale is None else grad_scale
    num = numeric_grad(lambda: gs * net.evaluate(x, labels)[0], params)
    np.testing.assert_allclose(
        grads,
        num,
        rtol=1e-5,
        atol=1e-8,
        err_msg=f"Model {sizes} {loss} gradient vs finite differences",
    )


def test_dense_stack_params_can_be_a_view_into_a_larger_buffer():
    sizes = (7, 5, 3)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    assert n == ref.model_plan(*mlp_spec(sizes))["n_params"]
    shared = np.zeros(3 * n + 10)
    params, grads = shared[5 : 5 + n], shared[5 + n : 5 + 2 * n]
    params[...] = ref.model_init_params(*mlp_spec(sizes), seed=1, dtype=np.float64)
    rng = rng_for("view")
    x, labels = rng.standard_normal((9, 7)), rng.integers(0, 3, 9)
    net = core.Model(*mlp_spec(sizes), params, grads)
    assert net.params is params and net.grads is grads
    assert net.sizes == (7, 5, 5, 3) and net.loss == "softmax_xent"  # input, dense, relu, dense
    got = net.loss_grad(x, labels)
    grads_ref = np.zeros(n)
    want = ref.model_loss_grad(*mlp_spec(sizes), params, grads_ref, x, labels)
    assert_close(
        got[0], want[0], dtype=np.float64, scale=abs(want[0]) + 9, k=16, what="Model on views loss"
    )
    assert_close(
        grads,
        grads_ref,
        dtype=np.float64,
        scale=np.abs(grads_ref).max(),
        k=16,
        what="Model on views grads",
    )
    assert np.all(shared[:5] == 0) and np.all(shared[5 + 2 * n :] == 0), "wrote outside the views"


@pytest.mark.parametrize(
    "loss,sizes", [("softmax_xent", (5, 4, 3)), ("sigmoid_bce", (5, 1)), ("sigmoid_bce", (5, 3, 1))]
)
def test_dense_stack_empty_batch(loss, sizes):
    params = ref.model_init_params(*mlp_spec(sizes, loss), seed=0, dtype=np.float64)
    grads = np.ones_like(params)
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    x, labels = np.empty((0, sizes[0])), np.empty(0, np.int64)
    assert net.loss_grad(x, labels) == (0.0, 0)
    assert net.evaluate(x, labels) == (0.0, 0)
    net.logits(x, np.empty((0, sizes[-1])))
    np.testing.assert_array_equal(grads, np.ones_like(params))


# ---------------------------------------------------------------------------------------
# conv blocks: conv -> ReLU -> 2x2 max-pool, then a dense stack


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("case", NETS, ids=blocks_id)
def test_conv_blocks_match_reference(isa, case, dtype, threads):
    shape, ch, dense, k, p = case
    spec = cnn_spec(shape, ch, dense, k, p)
    params, x, labels, start = blocks_data(case, dtype)
    grads, grads_ref = start.copy(), start.copy()
    net = core.Model(*spec, params, grads, threads=threads)
    plan = ref.model_plan(*spec)
    assert net.n_params == params.size == plan["n_params"]
    assert net.sizes == (math.prod(shape), *(math.prod(s) for s in plan["shapes"]))
    what = f"Model {blocks_id(case)} dtype={dname(dtype)} threads={threads}"
    loss, correct = net.loss_grad(x, labels, 0.25)
    loss_ref, correct_ref = ref.model_loss_grad(*spec, params, grads_ref, x, labels, 0.25)
    rtol = 2e-5 if dtype == np.float32 else 1e-11
    assert correct == correct_ref, what
    assert abs(loss - loss_ref) <= rtol * abs(loss_ref), f"{what}: loss {loss} vs {loss_ref}"
    diff = grads.astype(np.float64) - grads_ref
    scale = np.abs(grads_ref - start).max()
    assert np.abs(diff).max() <= 10 * rtol * scale, (
        f"{what}: grads off by {np.abs(diff).max():.3g} (scale {scale:.3g})"
    )
    logits, logits_ref = np.empty((len(x), dense[-1]), dtype), np.empty((len(x), dense[-1]), dtype)
    net.logits(x, logits)
    ref.model_logits(*spec, params, x, logits_ref)
    np.testing.assert_allclose(
        logits, logits_ref, rtol=rtol, atol=rtol * np.abs(logits_ref).max(), err_msg=what
    )
    ev = net.evaluate(x, labels)
    assert ev[1] == correct and abs(ev[0] - loss) <= rtol * abs(loss), f"{what}: evaluate {ev}"


@pytest.mark.parametrize("case", NETS[:3], ids=blocks_id)
def test_conv_blocks_steps_equal_loss_grad(case):
    shape, ch, dense, k, p = case
    params, x, labels, _ = blocks_data(case, np.float64)
    g1, g2 = np.zeros_like(params), np.zeros_like(params)
    net = core.Model(*cnn_spec(shape, ch, dense, k, p), params, g1, threads=2)
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
    params, x, labels, _ = blocks_data(case, np.float64, batch=600)
    net = core.Model(*cnn_spec(*case[:3]), params, np.zeros_like(params))
    loss, correct = net.evaluate(x, labels)
    loss_ref, correct_ref = ref.model_evaluate(*cnn_spec(*case[:3]), params, x, labels)
    assert correct == correct_ref and abs(loss - loss_ref) < 1e-10 * loss_ref


def test_bad_conv_block_arguments_are_named():
    spec = cnn_spec((1, 8, 8), (2,), (3,))
    p = np.zeros(ref.model_plan(*spec)["n_params"], np.float32)
    g = np.zeros_like(p)
    cases = [
        (
            lambda: core.Model(spec[0], (1, 8), spec[2], p, g),
            ValueError,
            "input_shape \\(1, 8\\) has 2 entries, expected \\(F,\\) or \\(C, H, W\\)",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 6, 6), (2, 2), (3,)), p, g),
            ValueError,
            "layers\\[3\\] \\('conv'\\) gets a \\(2, 2, 2\\) input: "
            "conv kernel larger than the padded",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 3, 3), (2,), (3,)), p, g),
            ValueError,
            "layers\\[2\\] \\('maxpool2'\\) gets a \\(2, 1, 1\\) input: max-pooling needs a map of "
            "at least 2x2",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 8, 8), (2,), (1,)), p, g),
            ValueError,
            "loss 'softmax_xent' on this model: softmax cross-entropy needs >= 2 outputs",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 8, 8), (2,), (0, 3)), p, g),
            ValueError,
            "layers\\[4\\] = \\('dense', 0\\): the output size must be 1..",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 8, 8), (2,), (3,), kernel=0), p, g),
            ValueError,
            "the kernel size must be 1..",
        ),
        (
            lambda: core.Model(*cnn_spec((1, 8, 8), (2,), (3,), padding=-2), p, g),
            ValueError,
            "padding must be 0..",
        ),
        (lambda: core.Model(*spec, p, g, threads=0), ValueError, "threads must be in \\[1, "),
        (
            lambda: core.Model(*spec, p[:-1], g),
            ValueError,
            f"params has shape \\({p.size - 1},\\), expected",
        ),
        (
            lambda: core.Model(*spec, p, g.astype(np.float64)),
            TypeError,
            "grads has dtype float64, expected float32",
        ),
        (lambda: core.Model(*spec, p, p), ValueError, "grads shares memory with params"),
        (
            lambda: core.Model(cnn_spec((1, 8, 8), ("a",), (3,))[0], *spec[1:], p, g),
            TypeError,
            "sizes must be ints, got str",
        ),
        (
            lambda: core.Model(7, *spec[1:], p, g),
            TypeError,
            "layers must be a list of layer specs, got int",
        ),
    ]
    for build, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            build()
    net = core.Model(*spec, p, g)
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


def test_conv_blocks_no_reference_leaks():
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
    """Calls on one Model (or one Context) serialize: each thread gets its own batch's
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


@pytest.mark.parametrize("kernel", ["Model.loss_grad", "Model.evaluate"])
def test_conv_blocks_release_the_gil(kernel, gil_probe):
    assert gil_probe(conv_gil_cases()[kernel]), (
        f"{kernel}: the main thread never ran while the worker was inside the call"
    )


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.boundary
def test_model_rejects_bad_construction():
    sizes = (784, 256, 10)
    layers, shape, _ = mlp_spec(sizes)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    p, g = np.zeros(n, np.float32), np.zeros(n, np.float32)
    with pytest.raises(ValueError, match="loss"):
        core.Model(layers, shape, "hinge", p, g)
    with pytest.raises(ValueError, match="sigmoid_bce"):
        core.Model(layers, shape, "sigmoid_bce", p, g)
    with pytest.raises(ValueError, match="softmax_xent"):
        core.Model(*mlp_spec((784, 1)), np.zeros(785), np.zeros(785))
    with pytest.raises(ValueError, match="layers has 0 entries"):
        core.Model(*mlp_spec((784,)), p, g)
    with pytest.raises(ValueError, match="the output size must be"):
        core.Model(*mlp_spec((784, 0, 10)), p, g)
    with pytest.raises(ValueError, match="params has shape"):
        core.Model(layers, shape, "softmax_xent", p[:-1], g)
    with pytest.raises(ValueError, match="grads has shape"):
        core.Model(layers, shape, "softmax_xent", p, g[:-1])
    with pytest.raises(TypeError, match="grads has dtype float64"):
        core.Model(layers, shape, "softmax_xent", p, g.astype(np.float64))
    with pytest.raises(TypeError, match="params has dtype float16"):
        core.Model(layers, shape, "softmax_xent", p.astype(np.float16), g)
    with pytest.raises(ValueError, match="shares memory"):
        core.Model(layers, shape, "softmax_xent", p, p)
    with pytest.raises(ValueError, match="C-contiguous"):
        core.Model(layers, shape, "softmax_xent", np.zeros(2 * n, np.float32)[::2], g)
    with pytest.raises(TypeError, match="ndarray"):
        core.Model(layers, shape, "softmax_xent", p.tolist(), g)
    with pytest.raises(ValueError, match="threads"):
        core.Model(layers, shape, "softmax_xent", p, g, threads=0)
    g.flags.writeable = False
    with pytest.raises(ValueError, match="grads is read-only"):
        core.Model(layers, shape, "softmax_xent", p, g)


@pytest.mark.boundary
def test_model_rejects_bad_batches():
    sizes = (784, 16, 10)
    n = core.model_plan(*mlp_spec(sizes))["n_params"]
    params, grads = np.zeros(n, np.float32), np.zeros(n, np.float32)
    net = core.Model(*mlp_spec(sizes), params, grads)
    x, labels = np.zeros((64, 784), np.float32), np.zeros(64, np.int64)
    out = np.zeros((64, 10), np.float32)
    cases = [
        (
            lambda: net.loss_grad(np.zeros((64, 783), np.float32), labels),
            ValueError,
            "x has shape (64, 783), expected (64, 784)",
        ),
        (
            lambda: net.evaluate(np.zeros((64, 783), np.float32), labels),
            ValueError,
            "x has shape (64, 783), expected (64, 784)",
        ),
        (
            lambda: net.logits(x, np.zeros((64, 9), np.float32)),
            ValueError,
            "out has shape (64, 9), expected (64, 10)",
        ),
        (
            lambda: net.loss_grad(x.astype(np.float64), labels),
            TypeError,
            "x has dtype float64, expected float32",
        ),
        (lambda: net.logits(x, out.astype(np.float64)), TypeError, "out has dtype float64"),
        (lambda: net.loss_grad(x, labels.astype(np.int32)), TypeError, "labels has dtype int32"),
        (lambda: net.evaluate(x, labels.astype(np.int32)), TypeError, "labels has dtype int32"),
        (lambda: net.loss_grad(x, labels[:63]), ValueError, "labels has shape"),
        (lambda: net.loss_grad(x, None), TypeError, "labels"),
        (lambda: net.loss_grad(x.tolist(), labels), TypeError, "x must be a numpy.ndarray"),
        (lambda: net.loss_grad(np.asfortranarray(x), labels), ValueError, "C-contiguous"),
        (lambda: net.loss_grad(x, labels, float("nan")), ValueError, "grad_scale"),
        (lambda: net.loss_grad(x, labels, float("inf")), ValueError, "grad_scale"),
        (lambda: net.logits(x, out[:, :5]), ValueError, "out"),
    ]
    for thunk, exc, fragment in cases:
        with pytest.raises(exc) as info:
            thunk()
        assert fragment in str(info.value), f"{str(info.value)!r} lacks {fragment!r}"
    assert not grads.any(), "a rejected call wrote into grads"
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        net.logits(x, out)
    grads.flags.writeable = False
    with pytest.raises(ValueError, match="grads is read-only"):
        net.loss_grad(x, labels)
    buf = np.zeros(64 * 784, np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        net.logits(buf.reshape(64, 784), buf[:640].reshape(64, 10))


@pytest.mark.boundary
@pytest.mark.parametrize(
    "sizes,loss",
    [((6, 5, 3), "softmax_xent"), ((6, 5, 1), "sigmoid_bce"), ((6, 1), "sigmoid_bce")],
    ids=["softmax", "bce_layers", "bce_fused"],
)
@pytest.mark.parametrize("index", [0, 100])
def test_model_labels_out_of_range_named_and_grads_untouched(sizes, loss, index):
    """A batch with a bad label raises, naming index and value, and adds nothing to grads.

    Index 100 lies in the second 64-row block of the fused logistic kernel.
    """
    params, grads, x, labels = small_net(loss, sizes, batch=129)
    bad_value = 7
    labels[index] = bad_value
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    for method in (net.evaluate, net.loss_grad):
        with pytest.raises(ValueError) as info:
            method(x, labels)
        msg = str(info.value)
        assert f"labels[{index}]" in msg and str(bad_value) in msg, msg
    assert not grads.any(), (
        f"loss_grad raised on labels[{index}] = {bad_value} but had already accumulated into "
        f"grads ({np.count_nonzero(grads)} of {grads.size} entries nonzero)"
    )


@pytest.mark.boundary
@pytest.mark.parametrize("loss,sizes", [("softmax_xent", (6, 5, 3)), ("sigmoid_bce", (6, 1))])
def test_model_does_not_modify_inputs(loss, sizes):
    params, grads, x, labels = small_net(loss, sizes)
    keep = params.copy(), x.copy(), labels.copy()
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    net.loss_grad(x, labels)
    net.evaluate(x, labels)
    net.logits(x, np.empty((x.shape[0], sizes[-1])))
    for arr, before, name in zip((params, x, labels), keep, ("params", "x", "labels")):
        np.testing.assert_array_equal(arr, before, err_msg=f"Model modified {name}")


@pytest.mark.boundary
def test_model_init_twice_rejected():
    params, grads, _, _ = small_net()
    net = core.Model(*mlp_spec((6, 5, 3)), params, grads)
    with pytest.raises(RuntimeError, match="already initialized"):
        net.__init__(*mlp_spec((6, 5, 3)), params, grads)


@pytest.mark.boundary
@pytest.mark.parametrize("loss,sizes", [("softmax_xent", (6, 5, 3)), ("sigmoid_bce", (6, 1))])
def test_model_no_reference_leaks(loss, sizes):
    params, grads, x, labels = small_net(loss, sizes)
    out = np.empty((x.shape[0], sizes[-1]))
    base = refcounts([params, grads])
    net = core.Model(*mlp_spec(sizes, loss), params, grads)
    assert refcounts([params, grads]) == [c + 1 for c in base], "Model holds one reference each"
    assert net.params is params and net.grads is grads
    objs = [params, grads, x, labels, out]
    net.loss_grad(x, labels, 1e-9)
    before = refcounts(objs)
    for _ in range(N_CALLS // 4):
        net.loss_grad(x, labels, 1e-9)
        net.evaluate(x, labels)
        net.logits(x, out)
        try:
            net.loss_grad(x[:, :-1], labels)
        except ValueError:
            pass
    assert refcounts(objs) == before
    del objs, net
    assert refcounts([params, grads]) == base, "Model not freed: params/grads still held"


@pytest.mark.boundary
def test_model_failed_init_holds_nothing():
    params, grads, _, _ = small_net()
    base = refcounts([params, grads])
    for _ in range(N_CALLS // 4):
        with pytest.raises(ValueError):
            core.Model(*mlp_spec((6, 5, 4)), params, grads)  # wrong length
        net = core.Model(*mlp_spec((6, 5, 3)), params, grads)
        with pytest.raises(RuntimeError):
            net.__init__(*mlp_spec((6, 5, 3)), params, grads)
        del net
    assert refcounts([params, grads]) == base


NET_SIZES = (64, 48, 10)


def net_job(seed, threads=1, dtype=np.float32):
    params = ref.model_init_params(*mlp_spec(NET_SIZES), seed=seed, dtype=dtype)
    grads = np.zeros_like(params)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((129, NET_SIZES[0])).astype(dtype)
    labels = rng.integers(0, NET_SIZES[-1], 129)
    return core.Model(*mlp_spec(NET_SIZES), params, grads, threads=threads), x, labels


def run_net(job, repeats):
    net, x, labels = job
    return [net.loss_grad(x, labels) for _ in range(repeats)], net.grads.copy()


@pytest.mark.boundary
@pytest.mark.parametrize("net_threads", [1, 2])
def test_two_threads_own_arrays_match_sequential(net_threads):
    repeats = 10
    gemm_jobs = [gemm_job(s) for s in (1, 2)]
    net_jobs = [net_job(s, net_threads) for s in (1, 2)]
    net_jobs_seq = [net_job(s, net_threads) for s in (1, 2)]
    seq_gemm = [run_gemm(j, 1)[0] for j in gemm_jobs]
    seq_net = [run_net(j, repeats) for j in net_jobs_seq]

    def worker(i):
        return lambda: (run_gemm(gemm_jobs[i], repeats), run_net(net_jobs[i], repeats))

    results = run_threads([worker(0), worker(1)])
    for i, (gemm_outs, (losses, grads)) in enumerate(results):
        for c in gemm_outs:
            np.testing.assert_array_equal(c, seq_gemm[i], err_msg=f"thread {i} gemm")
        assert losses == seq_net[i][0], f"thread {i} loss_grad results"
        np.testing.assert_array_equal(grads, seq_net[i][1], err_msg=f"thread {i} grads")


@pytest.mark.boundary
def test_two_threads_sharing_one_model():
    """Calls on one Model serialize: each thread gets its own batch's (loss, correct) and
    grads hold the sum of every call's gradient, as if the calls had run one after another."""
    repeats = 8
    net, x0, labels0 = net_job(5, threads=2)
    _, x1, labels1 = net_job(6)
    solo = {}
    for key, x, labels in (("0", x0, labels0), ("1", x1, labels1)):
        g_before = net.grads.copy()
        solo[key] = net.loss_grad(x, labels)
        solo["g" + key] = net.grads - g_before
    net.grads[:] = 0

    def worker(x, labels):
        return lambda: [net.loss_grad(x, labels) for _ in range(repeats)]

    r0, r1 = run_threads([worker(x0, labels0), worker(x1, labels1)])
    assert r0 == [solo["0"]] * repeats
    assert r1 == [solo["1"]] * repeats
    want = repeats * (solo["g0"].astype(np.float64) + solo["g1"])
    np.testing.assert_allclose(net.grads, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# ---------------------------------------------------------------------------------------
# behaviour fixed after review


def test_nan_weights_give_a_nan_loss_not_a_finite_one():
    m = MLP((4, 3, 2), dtype="float64")
    m.params[0] = np.nan
    loss, _ = m.loss_grad(np.ones((2, 4)), np.array([0, 1]))
    assert np.isnan(loss)


def test_model_plan_and_huge_sizes_are_checked():
    with pytest.raises(ValueError, match="sizes must be positive ints"):
        core.model_plan(*mlp_spec([-5, 3]))
    n = 2**31 - 1
    with pytest.raises(ValueError, match=r"expected \(6442450944,\)"):  # 3 * 2**31, not negative
        core.Model(*mlp_spec((n, 3)), np.zeros(66, np.float32), np.zeros(66, np.float32))


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_evaluate_ends_a_backward_sweep_in_progress(kind):
    """evaluate/logits reuse the activation scratch: a backward step after them would read
    overwritten activations. The dense stack (then _core.Network) used to keep the sweep open
    (the conv blocks, then _core.ConvNet, did not); both now end it, and backward_layer says
    there is nothing to go back from."""
    rng = np.random.default_rng(0)
    if kind == "dense":
        sizes = (6, 5, 3)
        params = rng.standard_normal(core.model_plan(*mlp_spec(sizes))["n_params"])
        net = core.Model(*mlp_spec(sizes), params, np.zeros_like(params))
        x = rng.standard_normal((4, 6))
        last = len(sizes) - 2
    else:
        shape, ch, dense = (1, 6, 6), (2,), (4, 3)
        n = ref.model_plan(*cnn_spec(shape, ch, dense, 3, 0))["n_params"]
        params = rng.standard_normal(n) * 0.1
        net = core.Model(*cnn_spec(shape, ch, dense, 3, 0), params, np.zeros_like(params))
        x = rng.standard_normal((4, 36))
        last = len(ch) + len(dense) - 1
    labels = np.array([0, 1, 2, 1])
    for forward_only in (lambda: net.evaluate(x, labels), lambda: net.logits(x, np.empty((4, 3)))):
        net.forward_loss(x, labels)
        forward_only()
        with pytest.raises(RuntimeError, match="no forward_loss to go back from"):
            net.backward_layer(last)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(family_tests((), gil=("Model.loss_grad", "Model.evaluate")))
