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
nn.LayerNorm(shape)), BatchNorm (statistics over the global batch, exchanged between the
workers: nn.SyncBatchNorm), and the activations ReLU, Tanh, Sigmoid and GELU (erf form,
nn.GELU()), and Residual([...]) around any block (the input added to the block's output,
through a strided 1x1 conv where the shape changes; ``resnet(depth)`` builds He et al.'s CIFAR
ResNet from it). Losses: softmax cross-entropy, sigmoid BCE, mean squared error. Under local
SGD a replica's batch norm uses its own shard's statistics.

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
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "Residual",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "GELU",
    "Sequential",
    "mlp",
    "lenet5",
    "cnn",
    "resnet",
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
        return f"Dropout({self.p!r})"


class LayerNorm(Layer):
    """Normalizes each sample over all its features (mean 0, variance 1, eps 1e-5), then
    scales and shifts each feature by a parameter of its own (nn.LayerNorm(input shape);
    initialized to 1 and 0)."""

    name = "layernorm"


class BatchNorm(Layer):
    """Batch normalization (Ioffe and Szegedy 2015): each channel of a (C, H, W) input
    (nn.BatchNorm2d), or each feature of an (F,) one (nn.BatchNorm1d), normalized by the
    mean and variance of the GLOBAL batch while training (the workers' sums exchanged inside
    the forward and backward pass: PyTorch's SyncBatchNorm, always on), then scaled and
    shifted by parameters of its own (1 and 0 at first). Running statistics (momentum 0.1,
    the unbiased variance, as PyTorch) are updated every step and used by evaluate, logits
    and predict; they are the model's ``state``, saved with it. eps 1e-5."""

    name = "batchnorm"


BatchNorm1d = BatchNorm2d = BatchNorm  # PyTorch's names: the input's shape decides


class Residual(Layer):
    """A skip connection around a list of layers: the block's output plus its input (He et
    al. 2016). Where the block changes the shape of an image, the input goes through a 1x1
    convolution first (its stride and bias the engine's choice: the stride that takes the
    input's size to the output's), as ResNet's projection shortcut. Blocks nest. On flat
    features the block must keep their number. Runs as 'res_begin', the block, 'res_end' in
    the engine's layer list."""

    name = "residual"

    def __init__(self, block):
        from .models import layer_specs

        if isinstance(block, (Layer, type)) or not hasattr(block, "__iter__"):
            one = f"{block.__name__}()" if isinstance(block, type) else repr(block)
            raise TypeError(
                f"Residual takes a list of layers, e.g. Residual([Conv2d(16, 3, padding=1), "
                f"ReLU()]), got {block!r}: for a block of one layer pass [{one}]"
            )
        self.block = list(block)
        if not self.block:
            raise ValueError("Residual needs at least one layer in its block")
        self._specs = ["res_begin", *layer_specs(self.block), "res_end"]

    def specs(self) -> list:
        return list(self._specs)

    def spec(self):
        return ("residual", tuple(self._specs[1:-1]))

    def __repr__(self) -> str:
        return f"Residual({self.block!r})"


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
        BatchNorm,
        Flatten,
        ReLU,
        Tanh,
        Sigmoid,
        GELU,
    )
}


def from_spec(spec) -> Layer:
    """The layer of a spec: 'relu', ('dense', 10), ('conv', 32, 3, 1), ('dropout', 0.5), ...;
    ('residual', (specs...)) for a residual block."""
    if isinstance(spec, str):
        spec = (spec,)
    spec = tuple(spec)
    if spec and spec[0] == "residual" and len(spec) == 2:
        return Residual([from_spec(s) for s in spec[1]])
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


def resnet(
    depth: int = 8,
    input_shape=(3, 32, 32),
    n_classes: int = 10,
    *,
    width: int = 16,
    norm: str | None = "batch",
    **kw,
) -> Sequential:
    """The CIFAR ResNet of He et al. (2016), depth = 6 n + 2 (8, 14, 20, 32, ...): a 3x3 conv
    of ``width`` maps, then three stages of n residual blocks each (width, 2 width, 4 width
    maps; the first block of the second and third stages halves the map by a stride-2 conv,
    its skip a strided 1x1 projection), each block conv3x3 -> norm -> ReLU -> conv3x3 -> norm,
    plus its input, then ReLU; global average pooling and the ``n_classes`` logits.

    norm: "batch" (BatchNorm over the global batch, the paper's), "layer" (LayerNorm over
    each sample's maps) or None (no normalization). ``nn.resnet(8, (1, 28, 28))`` is
    ResNet-8 for MNIST."""
    depth = _positive("resnet depth", depth, 8)
    if (depth - 2) % 6:
        raise ValueError(f"resnet depth is 6 n + 2 (8, 14, 20, 32, ...), got {depth}")
    if norm not in ("batch", "layer", None):
        raise ValueError(f"resnet norm is 'batch', 'layer' or None, got {norm!r}")
    width = _positive("resnet width", width)

    def normed():
        return {"batch": [BatchNorm()], "layer": [LayerNorm()], None: []}[norm]

    n = (depth - 2) // 6
    layers = [Conv2d(width, 3, padding=1), *normed(), ReLU()]
    for stage in range(3):
        maps = width << stage
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            block = [
                Conv2d(maps, 3, padding=1, stride=stride),
                *normed(),
                ReLU(),
                Conv2d(maps, 3, padding=1),
                *normed(),
            ]
            layers += [Residual(block), ReLU()]
    layers += [GlobalAvgPool(), Dense(n_classes)]
    return Sequential(layers, tuple(input_shape), "softmax_xent", **kw)
