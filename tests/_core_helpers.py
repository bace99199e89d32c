"""Helpers the C core's test files share (imported as ``_core_helpers``: conftest.py puts
this folder on sys.path; tests/fuzz_core.py, run as a script, finds it beside itself).

The layer lists of two model shapes the tests build again and again on ``_core.Model``:
a stack of dense layers with ReLU between them (an MLP) and conv -> ReLU -> 2x2 max-pool
blocks followed by such a stack (a CNN).
"""


def dense_stack(sizes):
    """The layer list of dense layers of widths sizes[1:] on sizes[0] inputs, ReLU between
    them and none after the last: [('dense', sizes[1]), 'relu', ..., ('dense', sizes[-1])]."""
    out = []
    for i, width in enumerate(sizes[1:]):
        out += (["relu"] if i else []) + [("dense", width)]
    return out


def conv_blocks(channels, dense, kernel=3, padding=0):
    """The layer list of len(channels) blocks conv(kernel x kernel, padding) -> ReLU -> 2x2
    max-pool, then flatten and dense layers of widths `dense` with ReLU between them (the
    last width is the class count)."""
    out = []
    for oc in channels:
        out += [("conv", oc, kernel, padding), "relu", "maxpool2"]
    return out + ["flatten"] + dense_stack((None, *dense))


def mlp_spec(sizes, loss="softmax_xent"):
    """(layers, input_shape, loss) of the dense stack `sizes` = (IN, H1, ..., OUT): the leading
    arguments of _core.Model, _core.model_plan and the reference's model_* twins."""
    return dense_stack(sizes), (sizes[0],), loss


def cnn_spec(input_shape, channels, dense, kernel=3, padding=0):
    """(layers, input_shape, loss) of conv_blocks on a (C, H, W) input, softmax
    cross-entropy, as mlp_spec."""
    return conv_blocks(channels, dense, kernel, padding), tuple(input_shape), "softmax_xent"
