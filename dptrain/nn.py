"""Layers, and models built from them: write your own network.

    from dptrain import nn
    model = nn.Sequential([
        nn.Conv2d(32, 3), nn.ReLU(), nn.MaxPool2(),
        nn.Conv2d(64, 3), nn.ReLU(), nn.MaxPool2(),
        nn.Flatten(), nn.Dense(128), nn.ReLU(), nn.Dense(10),
    ], input_shape=(1, 28, 28))
    print(model.summary())
    dptrain.fit(model, X, y, workers=2)

A layer names its output size only (``Dense(128)``, ``Conv2d(32, 3)``): the input sizes follow
from ``input_shape``, as in Keras. The whole list runs in the C core's one engine, one call
per batch, with conv -> activation -> pool fused; the parameters are one flat buffer per role
(``dptrain.models``), so the data-parallel exchange is one collective whatever the model.

What the engine has: Dense (PyTorch's nn.Linear), Conv2d (square kernel, zero padding, a
stride; nn.Conv2d), MaxPool2 and AvgPool2 (2x2, stride 2; nn.MaxPool2d(2), nn.AvgPool2d(2)),
GlobalAvgPool (nn.AdaptiveAvgPool2d(1) then a flatten), Flatten, Dropout (nn.Dropout: its
masks keyed on the sample, not the worker), LayerNorm (over all of a sample's features,
nn.LayerNorm(shape)), and the activations ReLU, Tanh, Sigmoid and GELU (erf form,
nn.GELU()). Losses: softmax cross-entropy, sigmoid BCE, mean squared error. What it does not
have (yet): batch norm and residual connections (a list has no branches).

Dropout draws its masks where a model trains (``loss_grad``; dptrain.fit) and passes its
input on where it evaluates (``evaluate``, ``logits``, ``predict``), as PyTorch's train() and
eval() modes do. A sample's mask is a function of the model's seed, the training step, the
sample's index in the step's global batch and the layer: the same on 1 worker and on N, in
every transport.
"""

from __future__ import annotations

from .models import Sequential, cnn_layers

__all__ = [
    "Layer",
    "Dense",
    "Conv2d",
    "MaxPool2",
    "Flatten",
    "AvgPool2",
    "GlobalAvgPool",
    "Dropout",
    "LayerNorm",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "GELU",
    "Sequential",
    "mlp",
    "lenet5",
    "cnn",
    "from_spec",
]


def _positive(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    v = int(v.__index__())
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


class Layer:
    """A layer of a ``Sequential`` model; ``spec()`` is what the C core runs."""

    name = ""

    def spec(self):
        return self.name

    def __eq__(self, other):
        return isinstance(other, Layer) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.spec())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Dense(Layer):
    """y = x W^T + b onto ``out_features`` (PyTorch's nn.Linear; its input is flattened)."""

    name = "dense"

    def __init__(self, out_features: int):
        self.out_features = _positive("Dense out_features", out_features)

    def spec(self):
        return ("dense", self.out_features)

    def __repr__(self) -> str:
        return f"Dense({self.out_features})"


class Conv2d(Layer):
    """2-D convolution onto ``out_channels`` maps: a ``kernel_size`` x ``kernel_size`` kernel,
    ``padding`` zeros on each side, ``stride`` (PyTorch's nn.Conv2d with those arguments: the
    output is (H + 2 padding - kernel_size) // stride + 1 high, likewise wide)."""

    name = "conv"

    def __init__(self, out_channels: int, kernel_size: int, padding: int = 0, stride: int = 1):
        self.out_channels = _positive("Conv2d out_channels", out_channels)
        self.kernel_size = _positive("Conv2d kernel_size", kernel_size)
        self.padding = _positive("Conv2d padding", padding, 0)
        self.stride = _positive("Conv2d stride", stride)

    def spec(self):
        base = ("conv", self.out_channels, self.kernel_size, self.padding)
        return base + (self.stride,) if self.stride != 1 else base

    def __repr__(self) -> str:
        pad = f", padding={self.padding}" if self.padding else ""
        stride = f", stride={self.stride}" if self.stride != 1 else ""
        return f"Conv2d({self.out_channels}, {self.kernel_size}{pad}{stride})"


class MaxPool2(Layer):
    """2x2 max-pooling, stride 2 (nn.MaxPool2d(2); an odd last row or column is dropped)."""

    name = "maxpool2"


class AvgPool2(Layer):
    """2x2 average pooling, stride 2 (nn.AvgPool2d(2); an odd last row or column is dropped)."""

    name = "avgpool2"


class GlobalAvgPool(Layer):
    """Each map's mean: (C, H, W) to (C,) (nn.AdaptiveAvgPool2d(1) then a flatten; Keras's
    GlobalAveragePooling2D)."""

    name = "globalavgpool"


class Dropout(Layer):
    """Zeroes each value with probability ``p`` while the model trains and scales the others
    by 1 / (1 - p) (nn.Dropout(p)); passes its input on where the model evaluates. The masks
    are keyed on (seed, step, the sample's index in the global batch, the layer): N workers
    draw what one does."""

    name = "dropout"

    def __init__(self, p: float = 0.5):
        if isinstance(p, bool) or not isinstance(p, (int, float)) and not hasattr(p, "__float__"):
            raise TypeError(f"Dropout p must be a number, got {type(p).__name__}")
        p = float(p)
        if not 0 <= p < 1:
            raise ValueError(f"Dropout p must be in [0, 1), got {p}")
        self.p = p

    def spec(self):
        return ("dropout", self.p)

    def __repr__(self) -> str:
        return f"Dropout({self.p:g})"


class LayerNorm(Layer):
    """Normalizes each sample over all its features (mean 0, variance 1, eps 1e-5), then
    scales and shifts each feature by a parameter of its own (nn.LayerNorm(input shape);
    initialized to 1 and 0)."""

    name = "layernorm"


class Flatten(Layer):
    """(C, H, W) to (C H W,) in that order (torch.flatten); a Dense layer does it anyway."""

    name = "flatten"


class ReLU(Layer):
    """max(x, 0) elementwise (PyTorch's nn.ReLU); fused into the layer before it."""

    name = "relu"


class Tanh(Layer):
    """tanh(x) elementwise (PyTorch's nn.Tanh); fused into the layer before it."""

    name = "tanh"


class Sigmoid(Layer):
    """1 / (1 + exp(-x)) elementwise (PyTorch's nn.Sigmoid); fused into the layer before it."""

    name = "sigmoid"


class GELU(Layer):
    """x Phi(x) elementwise, the erf form (PyTorch's nn.GELU() default); a stage of its own."""

    name = "gelu"


_BY_NAME = {
    cls.name: cls
    for cls in (
        Dense,
        Conv2d,
        MaxPool2,
        AvgPool2,
        GlobalAvgPool,
        Dropout,
        LayerNorm,
        Flatten,
        ReLU,
        Tanh,
        Sigmoid,
        GELU,
    )
}


def from_spec(spec) -> Layer:
    """The layer of a spec: 'relu', ('dense', 10), ('conv', 32, 3, 1), ('dropout', 0.5), ..."""
    if isinstance(spec, str):
        spec = (spec,)
    spec = tuple(spec)
    if not spec or spec[0] not in _BY_NAME:
        raise ValueError(f"{spec!r} is not a layer spec (known: {', '.join(_BY_NAME)})")
    return _BY_NAME[spec[0]](*spec[1:])


def mlp(
    n_features: int,
    hidden,
    n_outputs: int,
    *,
    activation: str = "relu",
    loss: str = "softmax_xent",
    dropout: float = 0.0,
    **kw,
) -> Sequential:
    """Dense layers ``hidden`` with ``activation`` between them, then ``n_outputs``:
    ``nn.mlp(784, [256, 128], 10)``. loss: softmax_xent, sigmoid_bce (n_outputs 1) or mse.
    dropout > 0: a Dropout(dropout) after each hidden layer's activation."""
    act = from_spec(activation)
    drop = [Dropout(dropout)] if dropout else []
    layers = []
    for width in tuple(hidden):
        layers += [Dense(width), act, *drop]
    return Sequential(layers + [Dense(n_outputs)], (int(n_features),), loss, **kw)


def lenet5(
    input_shape=(1, 28, 28),
    n_classes: int = 10,
    *,
    activation: str = "relu",
    pooling: str = "max",
    **kw,
) -> Sequential:
    """LeNet-5 (LeCun et al. 1998) as it is usually written today: conv(6, 5x5, padding 2) ->
    act -> max-pool -> conv(16, 5x5) -> act -> max-pool -> dense 120 -> act -> dense 84 ->
    act -> dense ``n_classes``. The original's: ``activation="tanh", pooling="avg"``."""
    act = from_spec(activation)
    if pooling not in ("max", "avg"):
        raise ValueError(f"pooling is {pooling!r}, expected 'max' or 'avg'")
    pool = MaxPool2 if pooling == "max" else AvgPool2
    return Sequential(
        [
            Conv2d(6, 5, padding=2),
            act,
            pool(),
            Conv2d(16, 5),
            act,
            pool(),
            Flatten(),
            Dense(120),
            act,
            Dense(84),
            act,
            Dense(n_classes),
        ],
        tuple(input_shape),
        "softmax_xent",
        **kw,
    )


def cnn(
    input_shape,
    n_classes: int = 10,
    *,
    channels=(32, 64),
    hidden=(128,),
    kernel: int = 3,
    padding: int = 0,
    **kw,
) -> Sequential:
    """The CNN family as a ``Sequential``: per entry of ``channels`` a conv -> ReLU -> 2x2
    max-pool block, then ``hidden`` dense layers and the logits (``dptrain.CNN``'s layers)."""
    return Sequential(
        cnn_layers(channels, hidden, n_classes, kernel=kernel, padding=padding),
        tuple(input_shape),
        "softmax_xent",
        **kw,
    )
