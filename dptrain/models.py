"""The model families: LogisticRegression, SoftmaxRegression, MLP, and the convolutional CNN.

The first three are stacks of dense layers (ReLU between them) run by the C core's fused
``_core.Network``; the CNN is run by ``_core.ConvNet``. Either way one call per batch does
forward, loss and backward with the GIL released. A model owns three flat, contiguous
buffers, one per role:

- ``params``: every layer's W (OUT, IN) row-major (a conv layer's W (OC, C, K, K)) then
  b (OUT,), layer by layer;
- ``grads``: the same layout; backward ACCUMULATES into it, ``zero_grad`` clears it;
- ``velocity``: SGD's momentum buffer (optimizer state), same layout.

Because each role is one buffer, a data-parallel engine all-reduces ``grads`` in one
collective and updates ``params`` with one kernel. ``params``/``grads`` may also be passed in
(for example views into shared memory), and are then used in place, never copied.

Initialization is PyTorch's default for nn.Linear and nn.Conv2d (``reference.init_params``,
``reference.cnn_init_params``), drawn from a seed, so the same seed gives the same model on
every worker and every run.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from . import _core, reference

__all__ = ["Model", "LogisticRegression", "SoftmaxRegression", "MLP", "CNN", "load_model",
           "build_model", "image_shape", "model_from_spec", "model_sizes", "model_n_params"]

_DTYPES = {"float32": np.float32, "float64": np.float64}
SAVE_FORMAT = 1


def _as_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in _DTYPES:
        raise TypeError(f"dtype is {dt.name}, expected float32 or float64")
    return dt


def _flat_buffer(name: str, given, n: int, dtype: np.dtype) -> np.ndarray:
    """`given` validated as a writeable contiguous 1-D array of n elements, or a new zero one."""
    if given is None:
        return np.zeros(n, dtype=dtype)
    if not isinstance(given, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(given).__name__}")
    if given.dtype != dtype or given.shape != (n,):
        raise ValueError(f"{name} has dtype {given.dtype} and shape {given.shape}, "
                         f"expected {dtype.name} and ({n},)")
    if not given.flags.c_contiguous or not given.flags.writeable:
        raise ValueError(f"{name} must be C-contiguous and writeable")
    return given


class Model:
    """Dense layers ``sizes = (IN, H1, ..., OUT)`` with ReLU between them and a fused loss.

    loss: "softmax_xent" (OUT >= 2 classes) or "sigmoid_bce" (OUT == 1, binary labels).
    threads: threads the kernels may split one batch over (intra-worker parallelism).
    params/grads/velocity: optional caller-owned flat buffers (see the module docstring);
    given params are kept as they are (not re-initialized).
    """

    kind = "model"

    def __init__(self, sizes, loss="softmax_xent", *, seed: int = 0, dtype="float32",
                 threads: int = 1, params=None, grads=None, velocity=None):
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"sizes is {tuple(sizes)}, expected (IN, ..., OUT) with at least "
                             f"two positive entries")
        if loss not in reference.LOSSES:
            raise ValueError(f"loss is {loss!r}, expected one of {reference.LOSSES}")
        self.loss = loss
        self.dtype = _as_dtype(dtype)
        self.seed = int(seed)
        n = reference.n_params(self.sizes)
        self.params = _flat_buffer("params", params, n, self.dtype)
        if params is None:
            self.reset_parameters()
        self.grads = _flat_buffer("grads", grads, n, self.dtype)
        self.velocity = _flat_buffer("velocity", velocity, n, self.dtype)
        self._net = _core.Network(self.sizes, loss, self.params, self.grads, threads=int(threads))

    # ---- shapes and views
    @property
    def n_params(self) -> int:
        """Length of the flat parameter (and gradient, velocity) buffer."""
        return self.params.size

    @property
    def n_features(self) -> int:
        """Features per input row (``sizes[0]``)."""
        return self.sizes[0]

    @property
    def n_outputs(self) -> int:
        """Logits per row: the classes, or 1 for a binary (sigmoid) model."""
        return self.sizes[-1]

    @property
    def threads(self) -> int:
        """Threads the C kernels split one batch over."""
        return self._net.threads

    def layers(self):
        """[(W, b), ...] views into ``params``."""
        return reference.unflatten(self.sizes, self.params)

    def grad_layers(self):
        """[(dW, db), ...] views into ``grads``."""
        return reference.unflatten(self.sizes, self.grads)

    def layer_slices(self):
        """[(start, stop), ...] of each layer's W and b in the flat buffers, first layer first."""
        out, off = [], 0
        for n_in, n_out in zip(self.sizes[:-1], self.sizes[1:]):
            out.append((off, off + n_out * (n_in + 1)))
            off += n_out * (n_in + 1)
        return out

    def reset_parameters(self) -> None:
        """Writes the seeded initial parameters (PyTorch's default init) into ``params``."""
        self.params[:] = reference.init_params(self.sizes, self.seed, self.dtype)

    # ---- compute
    def zero_grad(self) -> None:
        """Clears ``grads`` (backward accumulates into it): one memset, GIL released."""
        _core.zero_(self.grads)           # a memset with the GIL released

    def loss_grad(self, x: np.ndarray, y: np.ndarray, grad_scale: float | None = None,
                  grads: np.ndarray | None = None):
        """Forward + backward on a batch; ACCUMULATES into grads. Returns (loss_sum, n_correct).

        grad_scale multiplies the per-sample losses' sum (default 1/B: the mean). A data-parallel
        worker holding b of a global batch of B passes 1/B so that the all-reduced sum of the
        workers' gradients is exactly the global batch's mean gradient. ``grads`` redirects the
        gradient into another buffer of the same layout (one per chunk, for a fixed-order sum).
        """
        return self._net.loss_grad(x, y, grad_scale, grads)

    def forward_loss(self, x: np.ndarray, y: np.ndarray, grad_scale: float | None = None):
        """The first half of loss_grad: forward and loss; returns (loss_sum, n_correct).
        Then ``backward_layer(L - 1)``, ..., ``backward_layer(0)`` finish the backward sweep,
        each layer's gradient final when it returns (to exchange it while the next layers are
        computed). The sweep belongs to the calling thread until it ends."""
        return self._net.forward_loss(x, y, grad_scale)

    def backward_layer(self, layer: int, grads: np.ndarray | None = None) -> None:
        """One step of the backward sweep started by ``forward_loss``, last layer first."""
        self._net.backward_layer(layer, grads)

    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """zero_grad, then the mean loss's gradient into grads; returns the mean loss."""
        self.zero_grad()
        loss_sum, _ = self._net.loss_grad(x, y)
        return loss_sum / max(len(x), 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The (B, n_outputs) logits of a batch (forward only), as a new array."""
        out = np.empty((len(x), self.n_outputs), dtype=self.dtype)
        self._net.logits(x, out)
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted labels (int64): argmax of the logits, or logit > 0 for a binary model."""
        z = self.logits(x)
        if self.n_outputs == 1:
            return (z[:, 0] > 0).astype(np.int64)
        out = np.empty(len(x), dtype=np.int64)
        _core.argmax(z, out)
        return out

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(mean loss, accuracy) on a data set, forward only."""
        if len(x) == 0:
            raise ValueError("evaluate needs at least one sample, x is empty")
        loss_sum, correct = self._net.evaluate(x, y)
        return loss_sum / len(x), correct / len(x)

    # ---- persistence (.npz, no pickle)
    def spec(self) -> dict:
        """``config()`` and the flat buffers' length: what a worker rebuilds the model from
        (``model_from_spec``)."""
        return {**self.config(), "n_params": self.n_params}

    def config(self) -> dict:
        """The architecture as plain values (what ``save`` writes and ``load_model`` reads)."""
        return {"kind": self.kind, "sizes": list(self.sizes), "loss": self.loss,
                "dtype": self.dtype.name, "seed": self.seed}

    def save(self, path, **extra_arrays) -> None:
        """Writes params, velocity and the configuration to ``path`` (.npz, no pickle)."""
        np.savez(path, format=np.int64(SAVE_FORMAT), config=np.array(json.dumps(self.config())),
                 params=self.params, velocity=self.velocity, **extra_arrays)

    def load_state(self, path) -> dict:
        """Loads params/velocity saved by ``save`` into this model (sizes, loss and dtype must
        match); returns the other arrays of the file."""
        with _open_model_file(path) as f:
            cfg = _read_config(path, f)
            if tuple(cfg["sizes"]) != self.sizes or cfg["loss"] != self.loss:
                raise ValueError(f"{path}: saved model has sizes {tuple(cfg['sizes'])} and loss "
                                 f"{cfg['loss']!r}, this model has {self.sizes} and {self.loss!r}")
            for name in ("params", "velocity"):
                arr = f[name] if name in f.files else None
                if arr is None:
                    raise ValueError(f"{path}: no {name!r} array in the file")
                if arr.shape != (self.n_params,) or arr.dtype != self.dtype:
                    raise ValueError(f"{path}: {name} has dtype {arr.dtype} and shape "
                                     f"{arr.shape}, expected {self.dtype.name} and "
                                     f"({self.n_params},)")
            self.params[:] = f["params"]
            self.velocity[:] = f["velocity"]
            return {k: f[k] for k in f.files if k not in ("params", "velocity", "config", "format")}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(sizes={self.sizes}, loss={self.loss!r}, "
                f"dtype={self.dtype.name}, params={self.n_params})")


class LogisticRegression(Model):
    """Binary logistic regression: one dense layer to a single logit, sigmoid + BCE loss."""

    kind = "logreg"

    def __init__(self, n_features: int, **kw):
        super().__init__((n_features, 1), "sigmoid_bce", **kw)


class SoftmaxRegression(Model):
    """Multinomial logistic regression: one dense layer, softmax + cross-entropy."""

    kind = "softmax"

    def __init__(self, n_inputs: int, n_classes: int, **kw):
        super().__init__((n_inputs, n_classes), "softmax_xent", **kw)


class MLP(Model):
    """Multi-layer perceptron: ``sizes = [784, 256, 128, 10]``, ReLU hidden layers."""

    kind = "mlp"

    def __init__(self, sizes=(784, 256, 128, 10), **kw):
        if len(tuple(sizes)) < 2:
            raise ValueError(f"MLP sizes is {tuple(sizes)}, expected at least (IN, OUT)")
        super().__init__(sizes, "softmax_xent", **kw)


class CNN(Model):
    """Convolutional network: ``len(channels)`` blocks conv(KxK, stride 1) -> ReLU -> 2x2
    max-pool, then dense layers ``hidden`` with ReLU, then the ``n_classes`` logits; softmax
    cross-entropy. The default is the studies' network,

        conv(C->32, 3x3) -> ReLU -> maxpool 2 -> conv(32->64, 3x3) -> ReLU -> maxpool 2
        -> fc(->128) -> ReLU -> fc(128->10),

    with fc(2304->128) for CIFAR-10's (3, 32, 32) and fc(1600->128) for MNIST's (1, 28, 28).
    Input rows arrive flat, (N, C*H*W) in C, H, W order (how the data sets store images);
    ``input_shape`` says how to read them. ``sizes`` are the flat widths of the input and of
    every layer's output (the conv blocks' pooled maps), so ``sizes[0]`` is the feature count
    and ``sizes[-1]`` the class count, as for the dense models. Everything else (the flat
    buffers, loss_grad, evaluate, save/load, threads) is the Model interface.
    """

    kind = "cnn"

    def __init__(self, input_shape=(1, 28, 28), n_classes: int = 10, *, channels=(32, 64),
                 hidden=(128,), kernel: int = 3, padding: int = 0, seed: int = 0,
                 dtype="float32", threads: int = 1, params=None, grads=None, velocity=None):
        self.input_shape = tuple(int(v) for v in input_shape)
        self.channels = tuple(int(c) for c in channels)
        self.hidden = tuple(int(h) for h in hidden)
        self.kernel, self.padding = int(kernel), int(padding)
        if len(self.input_shape) != 3:
            raise ValueError(f"input_shape is {tuple(input_shape)}, expected (C, H, W)")
        self._dense = self.hidden + (int(n_classes),)
        self.sizes = reference.cnn_sizes(self.input_shape, self.channels, self._dense,
                                         self.kernel, self.padding)
        self.loss = "softmax_xent"
        self.dtype = _as_dtype(dtype)
        self.seed = int(seed)
        n = reference.cnn_n_params(self.input_shape, self.channels, self._dense, self.kernel,
                                   self.padding)
        self.params = _flat_buffer("params", params, n, self.dtype)
        if params is None:
            self.reset_parameters()
        self.grads = _flat_buffer("grads", grads, n, self.dtype)
        self.velocity = _flat_buffer("velocity", velocity, n, self.dtype)
        self._net = _core.ConvNet(self.input_shape, self.channels, self._dense, self.params,
                                  self.grads, kernel=self.kernel, padding=self.padding,
                                  threads=int(threads))

    def _arch(self):
        return self.input_shape, self.channels, self._dense

    def reset_parameters(self) -> None:
        """Writes the seeded initial parameters (PyTorch's Conv2d/Linear init) into ``params``."""
        self.params[:] = reference.cnn_init_params(*self._arch(), self.seed, self.dtype,
                                                   self.kernel, self.padding)

    def layers(self):
        """[(W, b), ...] views into ``params``; a conv layer's W is (OC, C, K, K)."""
        return reference.cnn_unflatten(*self._arch(), self.params, self.kernel, self.padding)

    def grad_layers(self):
        """[(dW, db), ...] views into ``grads``, shaped as ``layers()``."""
        return reference.cnn_unflatten(*self._arch(), self.grads, self.kernel, self.padding)

    def layer_slices(self):
        """[(start, stop), ...] of each layer's W and b in the flat buffers, first layer first."""
        out, off = [], 0
        for w, b in self.layers():
            out.append((off, off + w.size + b.size))
            off += w.size + b.size
        return out

    def config(self) -> dict:
        """The architecture as plain values, with the CNN's shape, channels and kernel."""
        return {**super().config(), "input_shape": list(self.input_shape),
                "channels": list(self.channels), "hidden": list(self.hidden),
                "kernel": self.kernel, "padding": self.padding}

    def load_state(self, path) -> dict:
        """As ``Model.load_state``, after checking the saved CNN architecture is this one."""
        with _open_model_file(path) as f:
            cfg = _read_config(path, f)
        mine = self.config()
        for key in ("kind", "input_shape", "channels", "hidden", "kernel", "padding"):
            if cfg.get(key) != mine[key]:
                raise ValueError(f"{path}: saved model has {key} {cfg.get(key)!r}, this model "
                                 f"has {mine[key]!r}")
        return super().load_state(path)

    def __repr__(self) -> str:
        return (f"CNN(input_shape={self.input_shape}, channels={self.channels}, "
                f"hidden={self.hidden}, n_classes={self.sizes[-1]}, kernel={self.kernel}, "
                f"padding={self.padding}, dtype={self.dtype.name}, params={self.n_params})")


def image_shape(n_features: int) -> tuple[int, int, int]:
    """(C, H, W) of a flat square image row: (3, s, s) when n_features = 3 s^2 (RGB, e.g.
    CIFAR-10's 3072), else (1, s, s) when n_features = s^2 (e.g. MNIST's 784). No square
    number is 3 times a square, so the reading is unique."""
    n = int(n_features)
    for c in (3, 1):
        s = math.isqrt(n // c) if n % c == 0 else 0
        if s > 0 and c * s * s == n:
            return c, s, s
    raise ValueError(f"the CNN reads rows of square images with 1 or 3 channels, but the data "
                     f"set has {n} features, neither s*s nor 3*s*s")


def model_sizes(kind: str, n_features: int, n_classes: int, hidden=(256, 128), *,
                input_shape=None) -> tuple:
    """The ``sizes`` of the model ``build_model`` makes for these data (hidden: the MLP's;
    input_shape: the CNN's (C, H, W), else read from n_features by ``image_shape``)."""
    if kind == "logreg":
        return (n_features, 1)
    if kind == "softmax":
        return (n_features, n_classes)
    if kind == "mlp":
        return (n_features, *hidden, n_classes)
    if kind == "cnn":
        return reference.cnn_sizes(_cnn_input(n_features, input_shape), CNN_CHANNELS,
                                   CNN_HIDDEN + (n_classes,))
    raise ValueError(f"model is {kind!r}, expected one of {MODEL_KINDS}")


def model_n_params(kind: str, sizes, *, input_shape=None) -> int:
    """Length of the flat buffers of a model of this kind and these ``model_sizes`` (the
    CNN's input_shape as given to model_sizes)."""
    if kind == "cnn":
        shape = _cnn_input(sizes[0], input_shape)
        return reference.cnn_n_params(shape, CNN_CHANNELS, CNN_HIDDEN + (sizes[-1],))
    return reference.n_params(sizes)


MODEL_KINDS = ("logreg", "softmax", "mlp", "cnn")
CNN_CHANNELS = (32, 64)    # build_model's CNN: the studies' architecture (see CNN)
CNN_HIDDEN = (128,)


def _cnn_input(n_features: int, input_shape) -> tuple:
    if input_shape is None:
        return image_shape(n_features)
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or math.prod(shape) != n_features:
        raise ValueError(f"input_shape {shape} is not a (C, H, W) of the data set's "
                         f"{n_features} features")
    return shape


def build_model(kind: str, n_features: int, n_classes: int, *, hidden=(256, 128),
                input_shape=None, **kw) -> Model:
    """The model the CLI names: 'logreg', 'softmax', 'mlp' (``hidden`` widths) or 'cnn' (the
    default CNN on images of ``input_shape`` (C, H, W); when not given, read from n_features
    by ``image_shape``)."""
    if kind == "cnn":
        return CNN(_cnn_input(n_features, input_shape), n_classes, channels=CNN_CHANNELS,
                   hidden=CNN_HIDDEN, **kw)
    if kind == "logreg":
        if n_classes != 2:
            raise ValueError(f"model 'logreg' is binary, but the data set has {n_classes} classes")
        return LogisticRegression(n_features, **kw)
    if kind == "softmax":
        return SoftmaxRegression(n_features, n_classes, **kw)
    if kind == "mlp":
        return MLP((n_features, *hidden, n_classes), **kw)
    raise ValueError(f"model is {kind!r}, expected one of {MODEL_KINDS}")


def _open_model_file(path):
    """np.load of a .npz model file (never pickle), with errors that name the file."""
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable .npz model file: {exc}") from exc
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is a single .npy array, not a dptrain .npz model file")
    return f


def _read_config(path, f) -> dict:
    if "config" not in f.files or "params" not in f.files:
        raise ValueError(f"{path} is not a dptrain model file (no 'config'/'params' arrays)")
    try:
        cfg = json.loads(str(f["config"]))
        for key in ("kind", "sizes", "loss", "dtype", "seed"):
            cfg[key]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: the model configuration is damaged ({exc!r})") from exc
    return cfg


def model_from_spec(spec: dict, *, threads: int = 1, params=None, grads=None,
                    velocity=None) -> Model:
    """The model a spec describes (``Model.spec()`` / ``Model.config()``: its class, sizes,
    loss, dtype, seed, and the CNN's shape), on the given flat buffers (e.g. a worker's, in
    shared memory) or new ones. Given params are used as they are (not initialized)."""
    cls = {"logreg": LogisticRegression, "softmax": SoftmaxRegression, "mlp": MLP,
           "cnn": CNN}.get(spec["kind"])
    sizes = spec["sizes"]
    kw = dict(seed=spec["seed"], dtype=spec["dtype"], threads=threads, params=params,
              grads=grads, velocity=velocity)
    if cls is CNN:
        return CNN(spec["input_shape"], sizes[-1], channels=spec["channels"],
                   hidden=spec["hidden"], kernel=spec["kernel"], padding=spec["padding"], **kw)
    if cls is LogisticRegression:
        return cls(sizes[0], **kw)
    if cls is SoftmaxRegression:
        return cls(sizes[0], sizes[1], **kw)
    if cls is MLP:
        return cls(sizes, **kw)
    return Model(sizes, spec["loss"], **kw)


def load_model(path, *, threads: int = 1) -> Model:
    """Rebuilds a model saved with ``Model.save`` (its class, sizes, dtype, params, velocity)."""
    with _open_model_file(path) as f:
        cfg = _read_config(path, f)
    try:
        model = model_from_spec(cfg, threads=threads)
    except KeyError as exc:
        raise ValueError(f"{path}: the {cfg['kind']} configuration lacks {exc}") from exc
    model.load_state(path)
    return model
