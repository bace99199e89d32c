"""The models: any list of layers (``Sequential``), and the named families built on it,
LogisticRegression, SoftmaxRegression, MLP and CNN.

Every model is a list of layers (``dptrain.nn``: Dense, Conv2d, MaxPool2, Flatten, ReLU, Tanh,
Sigmoid, GELU) on an input shape, with a loss, run by the C core's one engine
(``_core.Model``): one call per batch does forward, loss and backward with the GIL released,
with conv -> activation -> pool fused into one pass. A model owns three flat, contiguous
buffers, one per role:

- ``params``: per dense or conv layer in list order, its W then its b: dense W (OUT, IN)
  row-major (PyTorch's nn.Linear), conv W (OC, C, K, K) (nn.Conv2d), b (OUT,);
- ``grads``: the same layout; backward ACCUMULATES into it, ``zero_grad`` clears it;
- ``velocity``: SGD's momentum buffer (optimizer state), same layout.

Because each role is one buffer, a data-parallel engine all-reduces ``grads`` in one
collective and updates ``params`` with one kernel. ``params``/``grads`` may also be passed in
(for example views into shared memory), and are then used in place, never copied.

Initialization is PyTorch's default for nn.Linear and nn.Conv2d (kaiming_uniform_(a=sqrt(5))
for W, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the same bound for b; fan_in = IN for a
dense layer and C K K for a conv), drawn from ``np.random.default_rng(seed)`` layer by layer,
W in row-major order then b, in float64, then rounded to the dtype: the same seed gives the
same model on every worker and every run.

Precision: ``dtype`` "float32" or "float64" is the buffers' dtype and the arithmetic's;
"bfloat16" is mixed precision: float32 buffers (``dtype`` is then float32 and ``precision``
"bfloat16"), float32 activations, gradients and optimizer state, and every GEMM (dense and
conv, forward and backward) rounds its two inputs to bfloat16 and accumulates in float32,
the arithmetic of AVX512_BF16's vdpbf16ps (bfloat16 products are exact in float32). Where
this process can use Intel AMX (AMX-BF16, the tile state lent by Linux), AMX's tiles run the
GEMMs (tdpbf16ps: more precision inside an instruction, so results close to the others', not
equal; the same on every run for the same shapes). Else, where the CPU has AVX512_BF16 and
vdpbf16ps was measured there to do at least 1.2x the float32 FMA's flop, a vdpbf16ps
micro-kernel runs them; elsewhere the rounding is done while the GEMM packs its operands and
the float32 micro-kernel runs, a little under float32's speed. These two give the same bits,
except that vdpbf16ps reads denormals as 0, as AMX does (``_core.build_info()
["bfloat16_gemm"]`` names the path; ``_core.set_bf16_amx`` and ``_core.set_bf16_dot`` force one).

Losses: "softmax_xent" (integer class labels, OUT >= 2), "sigmoid_bce" (binary labels, OUT ==
1), "mse" (real targets (n, OUT); a sample's loss is the mean over its OUT outputs of the
squared error, so a batch's mean loss is PyTorch's ``MSELoss()``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from . import _core
from ._files import NpzArchive, memory_bytes, npz_path, savez, size_text, write_atomically
from .data.arrays import as_rows, as_targets

__all__ = [
    "Model",
    "Sequential",
    "LogisticRegression",
    "SoftmaxRegression",
    "MLP",
    "CNN",
    "PRECISIONS",
    "precision_name",
    "storage_dtype",
    "load_model",
    "build_model",
    "image_shape",
    "model_from_spec",
    "named_spec",
    "layers_spec",
    "LOSSES",
]

SAVE_FORMAT = 1
LOSSES = ("softmax_xent", "sigmoid_bce", "mse")
# one flat buffer's elements at most: the C core indexes it with a ptrdiff_t, NumPy with intp
_MAX_PARAMS = np.iinfo(np.intp).max // 8


# what a model's ``dtype`` may name: its buffers' dtype, or "bfloat16", mixed precision (float32
# buffers, every GEMM's inputs rounded to bfloat16, float32 accumulation)
PRECISIONS = ("float32", "float64", "bfloat16")
_EXPECTED = "float32, float64 or bfloat16"


def precision_name(dtype) -> str:
    """The name of a model's precision from what a user passes as ``dtype``: "float32",
    "float64" (also NumPy dtypes and types) or "bfloat16" (the string, or a bfloat16 dtype
    such as ml_dtypes'). TypeError for anything else, naming it."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype is {dtype!r}, expected {_EXPECTED}") from exc
    if dt.name not in PRECISIONS:
        raise TypeError(f"dtype is {dt.name}, expected {_EXPECTED}")
    return dt.name


def storage_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a model's buffers and data for a precision: float32 for bfloat16."""
    name = precision_name(dtype)
    return np.dtype(np.float32 if name == "bfloat16" else name)


def _flat_buffer(name: str, given, n: int, dtype: np.dtype) -> np.ndarray:
    """`given` validated as a writeable contiguous 1-D array of n elements, or a new zero one."""
    if given is None:
        return np.zeros(n, dtype=dtype)
    if not isinstance(given, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(given).__name__}")
    if given.dtype != dtype or given.shape != (n,):
        raise ValueError(
            f"{name} has dtype {given.dtype} and shape {given.shape}, "
            f"expected {dtype.name} and ({n},)"
        )
    if not given.flags.c_contiguous or not given.flags.writeable:
        raise ValueError(f"{name} must be C-contiguous and writeable")
    return given


def layer_specs(layers) -> list:
    """The C core's layer specs (('dense', 10), ('conv', 32, 3, 0), 'relu', ...) of a list of
    ``dptrain.nn`` layers or specs (both may be mixed)."""
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise TypeError(
            f"layers must be a list of layers (dptrain.nn.Dense(10), ...), got "
            f"{type(layers).__name__}"
        )
    out = []
    for i, layer in enumerate(layers):
        if isinstance(layer, type):
            raise TypeError(
                f"layers[{i}] is the class {layer.__name__}, not a layer: write "
                f"{layer.__name__}(...)"
            )
        if callable(getattr(layer, "specs", None)):  # several: a residual block's
            out += layer.specs()
            continue
        spec = layer.spec() if hasattr(layer, "spec") and callable(layer.spec) else layer
        if isinstance(spec, list):
            spec = tuple(spec)
        if not isinstance(spec, (str, tuple)):
            raise TypeError(
                f"layers[{i}] = {layer!r} is not a layer: expected a dptrain.nn "
                f"layer (Dense, Conv2d, MaxPool2, AvgPool2, GlobalAvgPool, Flatten, "
                f"ReLU, Tanh, Sigmoid, GELU, Dropout, BatchNorm, LayerNorm, Residual) "
                f"or its spec ('dense', 10), 'relu', ..."
            )
        out.append(spec)
    return out


class Model:
    """A list of layers on an input shape, with a loss: the interface every model shares
    (flat buffers, loss_grad, the backward sweep, evaluate, predict, save/load).

    Build one with ``Sequential`` (any layer list) or a named family (``MLP``, ``CNN``, ...).
    """

    kind = "model"
    _arch_keys: tuple = ()  # a family's own architecture keys, compared first on load

    def _build(
        self, layers, input_shape, loss, arch=None, *, seed, dtype, threads, params, grads, velocity
    ) -> None:
        self.plan = _plan(layers, input_shape, loss)
        self.loss = loss
        self._arch = dict(arch or {})  # a family's own architecture keys (the CNN's)
        self.precision = precision_name(dtype)
        self.dtype = storage_dtype(dtype)
        self.seed = int(seed)
        self.input_shape = tuple(self.plan["input_shape"])
        self.sizes = _sizes(self.plan)
        n = self.plan["n_params"]
        self.params = _flat_buffer("params", params, n, self.dtype)
        if params is None:
            self.reset_parameters()
        self.grads = _flat_buffer("grads", grads, n, self.dtype)
        self.velocity = _flat_buffer("velocity", velocity, n, self.dtype)
        # dropout's key (csrc/dp_layers.h): the training step, set by the engine each step; a
        # call without row0 (a loop of the user's own) moves it on by one
        self.step = 0
        self._dropout = any(spec[0] == "dropout" for spec in self.plan["layers"])
        self._net = _core.Model(
            self.plan["layers"],
            self.input_shape,
            loss,
            self.params,
            self.grads,
            threads=int(threads),
            gemm_inputs="bfloat16" if self.precision == "bfloat16" else None,
        )

    # ---- shapes and views
    @property
    def state(self) -> np.ndarray:
        """The batch norms' running means and variances (float64; per batch norm layer in
        list order, C means then C variances): updated by every training step, used by
        evaluate, logits and predict, saved with the model. Empty without batch norm."""
        return self._net.state

    @property
    def n_params(self) -> int:
        """Length of the flat parameter (and gradient, velocity) buffer."""
        return self.params.size

    @property
    def n_features(self) -> int:
        """Features per input row (``sizes[0]``: the flat width of ``input_shape``)."""
        return self.sizes[0]

    @property
    def n_outputs(self) -> int:
        """Outputs per row: the classes, 1 for a binary (sigmoid) model, the targets for mse."""
        return self.sizes[-1]

    @property
    def output_shape(self) -> tuple:
        """The shape of one row's output."""
        return tuple(self.plan["shapes"][-1])

    @property
    def threads(self) -> int:
        """Threads the C kernels split one batch over."""
        return self._net.threads

    @property
    def context(self):
        """The C engine object (a ``_core.Model``) whose threads compute the gradient: what
        ``_core.sgd_step`` and ``_core.zero_`` take as ctx, to share its thread team."""
        return self._net

    def _views(self, flat):
        return [
            (
                flat[p["weight"] : p["weight"] + math.prod(p["weight_shape"])].reshape(
                    p["weight_shape"]
                ),
                flat[p["bias"] : p["bias"] + p["bias_shape"][0]],
            )
            for p in self.plan["params"]
        ]

    def layers(self):
        """[(W, b), ...] views into ``params``, one per dense or conv layer: dense W (OUT, IN),
        conv W (OC, C, K, K)."""
        return self._views(self.params)

    def grad_layers(self):
        """[(dW, db), ...] views into ``grads``, shaped as ``layers()``."""
        return self._views(self.grads)

    def layer_slices(self):
        """[(start, stop), ...] of each dense or conv layer's W and b in the flat buffers,
        first layer first."""
        return [(p["weight"], p["bias"] + p["bias_shape"][0]) for p in self.plan["params"]]

    def summary(self) -> str:
        """A table of the layers: output shape and parameters of each, and the fused stages
        the C engine runs them as."""
        per_layer = {
            p["layer"]: math.prod(p["weight_shape"]) + p["bias_shape"][0]
            for p in self.plan["params"]
        }
        texts, depth = [], 0
        for spec in self.plan["layers"]:  # a residual block's layers indented
            depth -= spec[0] == "res_end"
            texts.append("  " * depth + _spec_text(spec))
            depth += spec[0] == "res_begin"
        width = max([26] + [len(t) for t in texts])
        lines = [
            f"{type(self).__name__} on input {self.input_shape}, loss {self.loss}, "
            f"{self._precision_text()}",
            f"{'#':>3}  {'layer':<{width}} {'output':<16} {'params':>10}",
        ]
        for i, (text, shape) in enumerate(zip(texts, self.plan["shapes"])):
            lines.append(
                f"{i:>3}  {text:<{width}} {str(tuple(shape)):<16} {per_layer.get(i, 0):>10,}"
            )
        lines.append(
            f"total {self.n_params:,} parameters; engine stages: "
            + ", ".join(s["ops"] for s in self.plan["stages"])
        )
        return "\n".join(lines)

    def _precision_text(self) -> str:
        if self.precision == "bfloat16":
            return "bfloat16 mixed precision (float32 params, bfloat16 GEMM inputs)"
        return self.dtype.name

    def reset_parameters(self) -> None:
        """Writes the seeded initial parameters (PyTorch's default init, see the module
        docstring) into ``params``, and batch norms' running statistics back to 0 and 1."""
        if getattr(self, "_net", None) is not None and self.state.size:
            shapes = [tuple(self.input_shape)] + [tuple(v) for v in self.plan["shapes"]]
            at = 0
            for i, spec in enumerate(self.plan["layers"]):
                if spec[0] == "batchnorm":
                    c = shapes[i][0]
                    self.state[at : at + c] = 0
                    self.state[at + c : at + 2 * c] = 1
                    at += 2 * c
        rng = np.random.default_rng(self.seed)
        for p, (w, b) in zip(self.plan["params"], self.layers()):
            if self.plan["layers"][p["layer"]][0] in ("layernorm", "batchnorm"):  # no draw
                w[...] = 1
                b[...] = 0
                continue
            bound = 1.0 / math.sqrt(math.prod(w.shape[1:]))
            w[...] = rng.uniform(-bound, bound, size=w.shape)
            b[...] = rng.uniform(-bound, bound, size=b.shape)

    # ---- compute
    def zero_grad(self) -> None:
        """Clears ``grads`` (backward accumulates into it): one memset, GIL released, on the
        model's threads."""
        _core.zero_(self.grads, ctx=self.context)

    def _scale(self) -> int:
        # mse: the C core sums the squared errors over a row's outputs; a sample's loss here
        # is their mean (PyTorch's MSELoss), so the scale and the sums are divided by OUT
        return self.n_outputs if self.loss == "mse" else 1

    def _rows(self, x):
        """x as the (B, features) rows the C core reads. A batch shaped like the input,
        (B, *input_shape) (images (B, C, H, W), as PyTorch passes them), is viewed flat, with no
        copy; any other array of more than 2 dimensions is an error that names both shapes.
        Rows of another dtype or layout (float64, integers, a list, non-contiguous) are
        converted as fit converts them (``data.as_rows``), with a note, once per process."""
        shape = x.shape if isinstance(x, np.ndarray) else _shape_of(x)
        if shape and (len(shape) < 2 or (len(shape) > 2 and shape[1:] != self.input_shape)):
            raise ValueError(self._rows_expected(shape))
        if not (isinstance(x, np.ndarray) and x.dtype == self.dtype and x.flags.c_contiguous):
            notes: list[str] = []
            x = as_rows(x, self.dtype, "x", notes, per_call=True)
            _say(notes)
        return x.reshape(len(x), -1) if x.ndim > 2 else x

    def _rows_expected(self, shape: tuple) -> str:
        """What _rows says of an x of this shape (of the wrong number of dimensions)."""
        rows = f"(B, {self.n_features}) rows"
        if len(self.input_shape) > 1:
            rows += f" or (B, {', '.join(map(str, self.input_shape))}) samples"
        one = len(shape) < 2 and math.prod(shape) == self.n_features
        return f"x has shape {shape}, expected {rows}" + (
            "; for one sample pass x.reshape(1, -1)" if one else ""
        )

    def _targets(self, y, n: int):
        """y as the C core reads it: int64 class labels (B,), or the (B, OUT) targets of an mse
        model in its dtype; any labels fit takes (integers of any width, whole-number floats,
        (B,) targets) are converted as fit converts them (``data.as_targets``), with a note
        once per process, and what fit refuses (NaN, fractions, a class beyond the outputs, a
        wrong shape) is refused naming it."""
        if self.loss == "mse":
            ready, n_classes = self.dtype, None
        else:
            ready, n_classes = np.dtype(np.int64), 2 if self.n_outputs == 1 else self.n_outputs
        if isinstance(y, np.ndarray) and y.dtype == ready and y.flags.c_contiguous:
            if y.ndim == (2 if n_classes is None else 1):
                return y  # the C core checks the rows and the classes
        notes: list[str] = []
        y = as_targets(y, n, self.dtype, n_classes, "y", "x", notes)
        _say(notes)
        return y

    def _grad_scale(self, x, grad_scale):
        if grad_scale is None:
            grad_scale = 1.0 / len(x) if len(x) else 0.0
        return grad_scale / self._scale()

    def loss_grad(
        self,
        x: np.ndarray,
        y: np.ndarray,
        grad_scale: float | None = None,
        grads: np.ndarray | None = None,
        *,
        row0: int | None = None,
    ):
        """Forward + backward on a batch; ACCUMULATES into grads. Returns (loss_sum, n_correct).

        grad_scale multiplies the per-sample losses' sum (default 1/B: the mean). A data-parallel
        worker holding b of a global batch of B passes 1/B so that the all-reduced sum of the
        workers' gradients is exactly the global batch's mean gradient. ``grads`` redirects the
        gradient into another buffer of the same layout (one per chunk, for a fixed-order sum).
        y: class labels (B,), or for mse the targets (B, OUT) or (B,): int64 labels and targets
        in the model's dtype are used as they are, others converted as fit converts them.

        Dropout (training: its masks drawn; ``evaluate`` and ``logits`` pass through): row i's
        mask is keyed on (``seed``, ``step``, row0 + i), the sample's index in the step's global
        batch, so that N workers draw what one does. The engine sets ``step`` and passes its
        shard's row0; without row0 (a loop of your own) rows count from 0 and ``step`` moves
        on by one after the call, so that each call draws new masks.
        """
        x = self._rows(x)
        y = self._targets(y, len(x))
        auto = self._keyed(row0)
        loss, correct = self._net.loss_grad(x, y, self._grad_scale(x, grad_scale), grads)
        self.step += auto
        return loss / self._scale(), correct

    def _keyed(self, row0) -> int:
        """Sets dropout's key for the next sweep; 1 where step then moves on (no row0)."""
        if not self._dropout:
            return 0
        self._net.set_rng(self.seed % 2**63, self.step, 0 if row0 is None else row0)
        return int(row0 is None)

    def forward_loss(
        self,
        x: np.ndarray,
        y: np.ndarray,
        grad_scale: float | None = None,
        *,
        row0: int | None = None,
    ):
        """The first half of loss_grad: forward and loss; returns (loss_sum, n_correct).
        Then ``backward_layer(L - 1)``, ..., ``backward_layer(0)`` (L: the dense and conv
        layers) finish the backward sweep, each layer's gradient final when it returns (to
        exchange it while the next layers are computed). The sweep belongs to the calling
        thread until it ends. Dropout's key as in ``loss_grad``."""
        x = self._rows(x)
        y = self._targets(y, len(x))
        auto = self._keyed(row0)
        loss, correct = self._net.forward_loss(x, y, self._grad_scale(x, grad_scale))
        self.step += auto
        return loss / self._scale(), correct

    def backward_layer(self, layer: int, grads: np.ndarray | None = None) -> None:
        """One step of the backward sweep started by ``forward_loss``, last layer first."""
        self._net.backward_layer(layer, grads)

    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """zero_grad, then the mean loss's gradient into grads; returns the mean loss."""
        self.zero_grad()
        loss_sum, _ = self.loss_grad(x, y)
        return loss_sum / max(len(x), 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The (B, n_outputs) outputs of a batch (forward only), as a new array: logits of a
        classifier, predictions of an mse model."""
        x = self._rows(x)
        out = np.empty((len(x), self.n_outputs), dtype=self.dtype)
        self._net.logits(x, out)
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted labels (int64): argmax of the logits, or logit > 0 for a binary model;
        for an mse model the (B, n_outputs) outputs."""
        z = self.logits(x)
        if self.loss == "mse":
            return z
        if self.n_outputs == 1:
            return (z[:, 0] > 0).astype(np.int64)
        out = np.empty(len(x), dtype=np.int64)
        _core.argmax(z, out)
        return out

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float | None]:
        """(mean loss, accuracy) on a data set, forward only; accuracy is None for mse."""
        if len(x) == 0:
            raise ValueError("evaluate needs at least one sample, x is empty")
        x = self._rows(x)
        loss_sum, correct = self._net.evaluate(x, self._targets(y, len(x)))
        accuracy = None if self.loss == "mse" else correct / len(x)
        return loss_sum / self._scale() / len(x), accuracy

    # ---- persistence (.npz, no pickle)
    def spec(self) -> dict:
        """``config()`` and the flat buffers' length: what a worker rebuilds the model from
        (``model_from_spec``)."""
        return {**self.config(), "n_params": self.n_params}

    def config(self) -> dict:
        """The architecture as plain values (what ``save`` writes and ``load_model`` reads):
        the layer list and input shape rebuild any model."""
        return {
            **_plan_config(self.kind, self.plan, self.loss, self.precision, self.seed),
            **self._arch,
        }

    def save(self, path, **extra_arrays) -> Path | None:
        """Writes params, velocity and the configuration to ``path`` (.npz, no pickle; ".npz"
        is appended when the name lacks it, as np.savez does, and ``load_model`` finds it
        the same way); returns the path written. Atomic and durable, as checkpoints are:
        a crash or a full disk leaves the previous file whole. A directory is refused. An
        open binary file is written as it is (returns None)."""
        arrays = dict(
            format=np.int64(SAVE_FORMAT),
            config=np.array(json.dumps(self.config())),
            params=self.params,
            velocity=self.velocity,
            **({"bn_state": self.state} if self.state.size else {}),
            **extra_arrays,
        )
        if hasattr(path, "write"):
            np.savez(path, **arrays)
            return None
        target = npz_path(path)
        for p in (Path(path).expanduser(), target):
            if p.is_dir():
                raise ValueError(
                    f"cannot save the model to {p}: it is a directory (name a file in it, "
                    f"e.g. {p / 'model.npz'})"
                )
        if not target.parent.is_dir():
            raise ValueError(
                f"cannot save the model to {target}: the directory {target.parent} does not exist"
            )
        write_atomically(target, lambda f: savez(f, **arrays))
        return target

    def load_state(self, path) -> dict:
        """Loads params/velocity saved by ``save`` into this model (the architecture, loss and
        dtype must match; the values finite); returns the other arrays of the file. Every
        problem is one ValueError naming the file, raised before this model is changed."""
        cfg, params, velocity, others = _read_model_file(path, self)
        state = _checked_state(
            others.pop("bn_state", None), self, f"model file {_model_path(path)}"
        )
        self.params[:] = params
        self.velocity[:] = velocity
        if state is not None:
            self.state[:] = state
        return others

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sizes={self.sizes}, loss={self.loss!r}, "
            f"dtype={self.precision}, params={self.n_params})"
        )


def _say(notes) -> None:
    """Prints what a model's call did to its arguments (a conversion) on stderr, each line
    once per process (as a run says its data's notes)."""
    from .engine.data import announce  # the engine builds on this module

    for line in notes:
        announce(line)


def _plain(v):
    """A saved list as the tuple the user wrote (sizes (784, 10), not [784, 10])."""
    if isinstance(v, list):
        return tuple(_plain(e) for e in v)
    return v


def _spec_text(spec) -> str:
    """How dptrain.nn writes the layer of a spec: Conv2d(32, 3), ReLU(), Dense(10); a
    residual block's ends as 'Residual([' and '])  + input'."""
    from .nn import from_spec  # nn builds on this module

    if spec[0] == "res_begin":
        return "Residual(["
    if spec[0] == "res_end":
        return "])  + input"
    return repr(from_spec(spec))


def _plan(layers, input_shape, loss: str) -> dict:
    """The C core's plan of a model (``_core.model_plan``: shapes, parameter offsets, fused
    stages), with the loss and the buffers' size checked."""
    if loss not in LOSSES:
        raise ValueError(f"loss is {loss!r}, expected one of {LOSSES}")
    if isinstance(input_shape, (int, np.integer)):
        input_shape = (int(input_shape),)
    plan = _core.model_plan(layer_specs(layers), tuple(input_shape), loss)
    if plan["n_params"] > _MAX_PARAMS:
        raise ValueError(
            f"the model has {plan['n_params']} parameters, more than one buffer can hold"
        )
    return plan


def _plan_config(kind: str, plan: dict, loss: str, precision: str, seed: int) -> dict:
    """A model's ``config()`` from its C plan (``_core.model_plan``): its class, flat widths,
    loss, precision, seed, layer list and input shape."""
    return {
        "kind": kind,
        "sizes": list(_sizes(plan)),
        "loss": loss,
        "dtype": precision,
        "seed": int(seed),
        "layers": [list(s) for s in plan["layers"]],
        "input_shape": list(plan["input_shape"]),
    }


def _sizes(plan) -> tuple:
    """Flat widths: of the input of each dense or conv layer, then of the output (for an MLP
    its layer widths (IN, H1, ..., OUT); for a CNN the input, each conv block's pooled map,
    the dense widths)."""
    widths = [math.prod(plan["input_shape"])] + [math.prod(s) for s in plan["shapes"]]
    return tuple(widths[p["layer"]] for p in plan["params"]) + (widths[-1],)


class Sequential(Model):
    """Any list of layers on an input shape: the model you write.

        from dptrain import nn
        model = nn.Sequential([nn.Conv2d(16, 5, padding=2), nn.ReLU(), nn.MaxPool2(),
                               nn.Flatten(), nn.Dense(64), nn.Tanh(), nn.Dense(10)],
                              input_shape=(1, 28, 28))

    layers: ``dptrain.nn`` layers (or their spec tuples, ('dense', 64), 'relu', ...); a Dense
    layer flattens its input. input_shape: one row's shape, (F,) or (C, H, W); rows arrive
    flat, (N, prod(input_shape)) in C, H, W order. loss: "softmax_xent", "sigmoid_bce" or
    "mse". seed, dtype, threads, params/grads/velocity: as every model (the module docstring).
    """

    kind = "sequential"

    def __init__(
        self,
        layers,
        input_shape,
        loss: str = "softmax_xent",
        *,
        seed: int = 0,
        dtype="float32",
        threads: int = 1,
        params=None,
        grads=None,
        velocity=None,
    ):
        self._build(
            layers,
            input_shape,
            loss,
            seed=seed,
            dtype=dtype,
            threads=threads,
            params=params,
            grads=grads,
            velocity=velocity,
        )

    @staticmethod
    def architecture(layers, input_shape, loss: str = "softmax_xent") -> tuple:
        """(layers, input_shape, loss) of the model, as every family's ``architecture``."""
        return layers, input_shape, loss

    def __repr__(self) -> str:
        layers = ", ".join(_spec_text(s) for s in self.plan["layers"])
        return (
            f"Sequential([{layers}], input_shape={self.input_shape}, loss={self.loss!r}, "
            f"dtype={self.precision}, params={self.n_params})"
        )


def _dense_stack(widths) -> list:
    """[('dense', w1), 'relu', ('dense', w2), ..., ('dense', wL)]."""
    out = []
    for i, w in enumerate(widths):
        if i:
            out.append("relu")
        out.append(("dense", int(w)))
    return out


def _check_widths(name, sizes):
    sizes = tuple(sizes)
    if len(sizes) < 2 or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in sizes):
        raise ValueError(f"{name} is {sizes}, expected (IN, ..., OUT): at least two positive ints")
    return tuple(int(s) for s in sizes)


class LogisticRegression(Model):
    """Binary logistic regression: one dense layer to a single logit, sigmoid + BCE loss."""

    kind = "logreg"

    def __init__(
        self,
        n_features: int,
        *,
        seed: int = 0,
        dtype="float32",
        threads: int = 1,
        params=None,
        grads=None,
        velocity=None,
    ):
        self._build(
            *self.architecture(n_features),
            seed=seed,
            dtype=dtype,
            threads=threads,
            params=params,
            grads=grads,
            velocity=velocity,
        )

    @staticmethod
    def architecture(n_features: int) -> tuple:
        """(layers, input_shape, loss) of the model."""
        n = _check_widths("(n_features, 1)", (n_features, 1))[0]
        return [("dense", 1)], (n,), "sigmoid_bce"


class SoftmaxRegression(Model):
    """Multinomial logistic regression: one dense layer, softmax + cross-entropy."""

    kind = "softmax"

    def __init__(
        self,
        n_inputs: int,
        n_classes: int,
        *,
        seed: int = 0,
        dtype="float32",
        threads: int = 1,
        params=None,
        grads=None,
        velocity=None,
    ):
        self._build(
            *self.architecture(n_inputs, n_classes),
            seed=seed,
            dtype=dtype,
            threads=threads,
            params=params,
            grads=grads,
            velocity=velocity,
        )

    @staticmethod
    def architecture(n_inputs: int, n_classes: int) -> tuple:
        """(layers, input_shape, loss) of the model."""
        n_in, n_out = _check_widths("(n_inputs, n_classes)", (n_inputs, n_classes))
        return [("dense", n_out)], (n_in,), "softmax_xent"


class MLP(Model):
    """Multi-layer perceptron: ``sizes = [784, 256, 128, 10]``, ReLU between the dense layers.

    loss: "softmax_xent" (the default: ``sizes[-1]`` classes), "sigmoid_bce" (``sizes[-1]``
    == 1) or "mse" (regression onto ``sizes[-1]`` targets)."""

    kind = "mlp"

    def __init__(
        self,
        sizes=(784, 256, 128, 10),
        loss: str = "softmax_xent",
        *,
        seed: int = 0,
        dtype="float32",
        threads: int = 1,
        params=None,
        grads=None,
        velocity=None,
    ):
        self._build(
            *self.architecture(sizes, loss),
            seed=seed,
            dtype=dtype,
            threads=threads,
            params=params,
            grads=grads,
            velocity=velocity,
        )

    @staticmethod
    def architecture(sizes, loss: str = "softmax_xent") -> tuple:
        """(layers, input_shape, loss) of the model."""
        sizes = _check_widths("MLP sizes", sizes)
        return _dense_stack(sizes[1:]), (sizes[0],), loss


def cnn_layers(
    channels=(32, 64), hidden=(128,), n_classes: int = 10, *, kernel: int = 3, padding: int = 0
) -> list:
    """The CNN's layer list: per channel count a conv(KxK) -> ReLU -> 2x2 max-pool block, then
    flatten and the dense layers ``hidden`` (ReLU between) and the ``n_classes`` logits."""
    out = []
    for c in channels:
        out += [("conv", int(c), int(kernel), int(padding)), "relu", "maxpool2"]
    return out + ["flatten"] + _dense_stack(tuple(hidden) + (int(n_classes),))


def check_conv_blocks(input_shape, channels, kernel: int, padding: int) -> None:
    """ValueError naming the first conv block (conv KxK, padding, then a 2x2 pool) whose
    input is too small to leave a 2x2 window to pool."""
    c, h, w = (int(v) for v in input_shape)
    for i, oc in enumerate(channels):
        oh, ow = h + 2 * padding - kernel + 1, w + 2 * padding - kernel + 1
        if oh < 2 or ow < 2:
            raise ValueError(
                f"conv layer {i} gets a {(c, h, w)} input: a {kernel}x{kernel} "
                f"kernel with padding {padding} leaves no 2x2 window to pool"
            )
        c, h, w = int(oc), oh // 2, ow // 2


class CNN(Model):
    """Convolutional network: ``len(channels)`` blocks conv(KxK, stride 1) -> ReLU -> 2x2
    max-pool, then dense layers ``hidden`` with ReLU, then the ``n_classes`` logits; softmax
    cross-entropy. The default is the studies' network,

        conv(C->32, 3x3) -> ReLU -> maxpool 2 -> conv(32->64, 3x3) -> ReLU -> maxpool 2
        -> fc(->128) -> ReLU -> fc(128->10),

    with fc(2304->128) for CIFAR-10's (3, 32, 32) and fc(1600->128) for MNIST's (1, 28, 28).
    Input rows arrive flat, (N, C*H*W) in C, H, W order (how the data sets store images);
    ``input_shape`` says how to read them. A C-contiguous (N, C, H, W) batch is taken too (as
    PyTorch passes images), viewed flat without a copy. ``sizes`` are the flat widths of the
    input and of every layer's output (the conv blocks' pooled maps), so ``sizes[0]`` is the
    feature count and ``sizes[-1]`` the class count, as for the dense models.
    """

    kind = "cnn"
    _arch_keys = ("channels", "hidden", "kernel", "padding")

    def __init__(
        self,
        input_shape=(1, 28, 28),
        n_classes: int = 10,
        *,
        channels=(32, 64),
        hidden=(128,),
        kernel: int = 3,
        padding: int = 0,
        seed: int = 0,
        dtype="float32",
        threads: int = 1,
        params=None,
        grads=None,
        velocity=None,
    ):
        layers, shape, loss, arch = self.architecture(
            input_shape, n_classes, channels=channels, hidden=hidden, kernel=kernel, padding=padding
        )
        self.channels, self.hidden = tuple(arch["channels"]), tuple(arch["hidden"])
        self.kernel, self.padding = arch["kernel"], arch["padding"]
        self._build(
            layers,
            shape,
            loss,
            arch,
            seed=seed,
            dtype=dtype,
            threads=threads,
            params=params,
            grads=grads,
            velocity=velocity,
        )

    @staticmethod
    def architecture(
        input_shape,
        n_classes: int,
        *,
        channels=(32, 64),
        hidden=(128,),
        kernel: int = 3,
        padding: int = 0,
    ) -> tuple:
        """(layers, input_shape, loss, the CNN's own architecture keys) of the model."""
        shape = tuple(input_shape)
        if len(shape) != 3:
            raise ValueError(f"input_shape is {shape}, expected (C, H, W)")
        channels = tuple(int(c) for c in channels)
        hidden = tuple(int(h) for h in hidden)
        kernel, padding = int(kernel), int(padding)
        if not channels:
            raise ValueError("channels is empty: a CNN has at least one conv block")
        if int(n_classes) < 2:
            raise ValueError(f"n_classes is {n_classes}: the CNN's softmax needs >= 2 classes")
        layers = cnn_layers(channels, hidden, n_classes, kernel=kernel, padding=padding)
        check_conv_blocks(shape, channels, kernel, padding)
        arch = {
            "channels": list(channels),
            "hidden": list(hidden),
            "kernel": kernel,
            "padding": padding,
        }
        return layers, shape, "softmax_xent", arch

    def __repr__(self) -> str:
        return (
            f"CNN(input_shape={self.input_shape}, channels={self.channels}, "
            f"hidden={self.hidden}, n_classes={self.sizes[-1]}, kernel={self.kernel}, "
            f"padding={self.padding}, dtype={self.precision}, params={self.n_params})"
        )


def image_shape(n_features: int) -> tuple[int, int, int]:
    """(C, H, W) of a flat square image row: (3, s, s) when n_features = 3 s^2 (RGB, e.g.
    CIFAR-10's 3072), else (1, s, s) when n_features = s^2 (e.g. MNIST's 784). No square
    number is 3 times a square, so the reading is unique."""
    n = int(n_features)
    for c in (3, 1):
        s = math.isqrt(n // c) if n % c == 0 else 0
        if s > 0 and c * s * s == n:
            return c, s, s
    raise ValueError(
        f"the CNN reads rows of square images with 1 or 3 channels, but the data "
        f"set has {n} features, neither s*s nor 3*s*s"
    )


MODEL_KINDS = ("logreg", "softmax", "mlp", "cnn")
CNN_CHANNELS = (32, 64)  # build_model's CNN: the studies' architecture (see CNN)
CNN_HIDDEN = (128,)


def _cnn_input(n_features: int, input_shape) -> tuple:
    if input_shape is None:
        return image_shape(n_features)
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or math.prod(shape) != n_features:
        raise ValueError(
            f"input_shape {shape} is not a (C, H, W) of the data set's {n_features} features"
        )
    return shape


def named_spec(
    kind: str,
    n_features: int,
    n_classes: int,
    *,
    hidden=(256, 128),
    input_shape=None,
    dtype="float32",
    seed: int = 0,
) -> dict:
    """The spec (``Model.spec()``) of the named model for these data, planned by the C core
    without allocating the model: 'logreg' (binary), 'softmax', 'mlp' (``hidden`` widths) or
    'cnn' (the studies' CNN on images of ``input_shape`` (C, H, W); when not given, read
    from n_features by ``image_shape``). What a run's workers build their models from."""
    if kind == "cnn":
        cls, args = CNN, (_cnn_input(n_features, input_shape), n_classes)
        kw = {"channels": CNN_CHANNELS, "hidden": CNN_HIDDEN}
    elif kind == "logreg":
        if n_classes != 2:
            raise ValueError(f"model 'logreg' is binary, but the data set has {n_classes} classes")
        cls, args, kw = LogisticRegression, (n_features,), {}
    elif kind == "softmax":
        cls, args, kw = SoftmaxRegression, (n_features, n_classes), {}
    elif kind == "mlp":
        cls, args, kw = MLP, ((n_features, *hidden, n_classes),), {}
    else:
        raise ValueError(f"model is {kind!r}, expected one of {MODEL_KINDS}")
    layers, shape, loss, *arch = cls.architecture(*args, **kw)
    return layers_spec(
        layers, shape, loss, dtype=dtype, seed=seed, kind=kind, arch=arch[0] if arch else None
    )


def layers_spec(
    layers,
    input_shape,
    loss: str = "softmax_xent",
    *,
    dtype="float32",
    seed: int = 0,
    kind: str = "sequential",
    arch: dict | None = None,
) -> dict:
    """The spec (``Model.spec()``) of the model of these layers on this input shape, planned
    by the C core without allocating the model (its buffers are made where a worker wants
    them: ``model_from_spec``)."""
    plan = _plan(layers, input_shape, loss)
    return {
        **_plan_config(kind, plan, loss, precision_name(dtype), seed),
        **(arch or {}),
        "n_params": plan["n_params"],
    }


def build_model(
    kind: str,
    n_features: int,
    n_classes: int,
    *,
    hidden=(256, 128),
    input_shape=None,
    seed: int = 0,
    dtype="float32",
    **kw,
) -> Model:
    """The named model for these data (``named_spec``), built: 'logreg', 'softmax', 'mlp' or
    'cnn'; ``kw``: threads, params, grads, velocity (as every model)."""
    return model_from_spec(
        named_spec(
            kind,
            n_features,
            n_classes,
            hidden=hidden,
            input_shape=input_shape,
            dtype=dtype,
            seed=seed,
        ),
        **kw,
    )


def _spec_arguments(spec: dict) -> tuple:
    """(class, args, kw) of the model a spec describes: what its constructor and its
    ``architecture`` take (one reading for building a model and for planning it)."""
    kind, sizes = spec["kind"], spec["sizes"]
    if kind == "cnn":
        kw = {k: spec[k] for k in CNN._arch_keys}
        return CNN, (spec["input_shape"], sizes[-1]), kw
    if kind == "logreg":
        return LogisticRegression, (sizes[0],), {}
    if kind == "softmax":
        return SoftmaxRegression, (sizes[0], sizes[1]), {}
    if kind in ("mlp", "model"):  # "model": a dense stack saved by dptrain 0.1
        return MLP, (sizes, spec["loss"]), {}
    if kind == "sequential":
        layers = [tuple(s) if isinstance(s, list) else s for s in spec["layers"]]
        return Sequential, (layers, tuple(spec["input_shape"]), spec["loss"]), {}
    raise ValueError(
        f"model kind {kind!r} is not one dptrain knows ({', '.join(MODEL_KINDS + ('sequential',))})"
    )


def model_from_spec(
    spec: dict, *, threads: int = 1, params=None, grads=None, velocity=None
) -> Model:
    """The model a spec describes (``Model.spec()`` / ``Model.config()``: its class, sizes,
    loss, dtype, seed, layers and input shape), on the given flat buffers (e.g. a worker's,
    in shared memory) or new ones. Given params are used as they are (not initialized)."""
    cls, args, kw = _spec_arguments(spec)
    return cls(
        *args,
        **kw,
        seed=spec["seed"],
        dtype=spec["dtype"],
        threads=threads,
        params=params,
        grads=grads,
        velocity=velocity,
    )


# a saved configuration's bound: a Sequential of thousands of layers is a few hundred kB
_CONFIG_BYTES = 1 << 20
_MODEL_BUFFERS = 3  # params, grads, velocity: what building the model allocates


def _model_path(path) -> Path:
    """The file ``load_model(path)`` reads: path, or path + ".npz" when only that exists
    (what ``save(path)`` wrote, as np.savez names it)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"model file {path} is a directory, not a model file (.npz)")
    if not p.exists() and npz_path(p).is_file():
        return npz_path(p)
    return p


def _read_model_file(path, model: Model | None = None) -> tuple:
    """(config, params, velocity, other arrays) of a model file, every size checked before
    anything is allocated: the configuration (bounded) first; the model it names planned
    without building it (its parameter count, against this machine's memory and, given
    ``model``, against that model's architecture); the stored arrays' .npy headers against
    that plan; only then their data, which must be finite. One ValueError naming the file
    for any problem (a damaged, truncated or foreign file, a zip bomb)."""
    path = _model_path(path)
    where = f"model file {path}"
    with NpzArchive(path, where, advice="load_model reads the .npz files Model.save writes") as f:
        if "config" not in f.files and {"params", "position"} <= set(f.files):
            # a checkpoint (dptrain.engine.checkpoint) holds the weights but no configuration
            raise ValueError(
                f"{where} is a training checkpoint (what --resume, or train(resume=...), "
                f"continues), not a model file: to get a model, save it with --save-weights "
                f"FILE (train(save_weights=FILE)) or model.save(FILE) after fit, and load that"
            )
        if "config" not in f.files or "params" not in f.files:
            raise ValueError(f"{where} is not a dptrain model file (no 'config'/'params' arrays)")
        text = f.array("config", max_bytes=_CONFIG_BYTES)
        try:
            cfg = json.loads(str(text[()]))
            for key in ("kind", "sizes", "loss", "dtype", "seed"):
                cfg[key]
            cls, args, kw = _spec_arguments(cfg)
            layers, shape, loss, *_ = cls.architecture(*args, **kw)
            n_params = _plan(layers, shape, loss)["n_params"]
            dtype = storage_dtype(cfg["dtype"])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{where}: the model configuration is damaged ({exc!r})") from None
        if model is not None:
            mine = model.config()
            for key in model._arch_keys + ("sizes", "loss", "input_shape", "layers"):
                if key in cfg and cfg[key] != mine[key]:
                    raise ValueError(
                        f"{where}: saved model has {key} {_plain(cfg[key])!r}, "
                        f"this model has {_plain(mine[key])!r}"
                    )
        need, memory = _MODEL_BUFFERS * n_params * dtype.itemsize, memory_bytes()
        if memory is not None and need > memory:
            raise ValueError(
                f"{where} names a model of {n_params:,} parameters, whose buffers need "
                f"{size_text(need)}, more than this machine's {size_text(memory)} of memory"
            )
        arrays = {}
        for name in ("params", "velocity"):
            arrays[name] = f.array(
                name, max_bytes=n_params * dtype.itemsize, shape=(n_params,), dtype=dtype
            )
            if not np.isfinite(arrays[name]).all():
                raise ValueError(
                    f"{where}: {name} holds non-finite values (NaN or infinity): the model "
                    f"that was saved had diverged"
                )
        own = ("params", "velocity", "config", "format")
        others = {k: f.array(k, max_bytes=memory) for k in f.files if k not in own}
    return cfg, arrays["params"], arrays["velocity"], others


def _shape_of(x) -> tuple:
    """x's shape as NumPy reads it; () for what it cannot (a ragged list: as_rows says why)."""
    try:
        return np.shape(x)
    except ValueError:
        return ()


def load_model(path, *, threads: int = 1) -> Model:
    """Rebuilds a model saved with ``Model.save`` (its class, sizes, dtype, params, velocity).
    ``path`` may omit the ".npz" that ``save`` appended. Every problem with the file is one
    ValueError naming it, found before the model is built."""
    cfg, params, velocity, others = _read_model_file(path)
    model = model_from_spec(cfg, threads=threads, params=params, velocity=velocity)
    state = _checked_state(others.get("bn_state"), model, f"model file {_model_path(path)}")
    if state is not None:
        model.state[:] = state
    return model


def _checked_state(state, model: Model, where: str):
    """A saved batch norm state (running means, variances; None: none saved) checked against
    the model; a ValueError names `where` (the model file or checkpoint)."""
    if state is None:
        return None
    state = np.asarray(state)
    if (
        state.shape != model.state.shape
        or state.dtype != np.float64
        or not np.isfinite(state).all()
    ):
        raise ValueError(
            f"{where}: its batch norm statistics (bn_state, "
            f"{state.dtype}{list(state.shape)}) do not fit this model's "
            f"(float64[{model.state.size}]) or are not finite"
        )
    return state
