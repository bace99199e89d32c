"""What a run trains: the spec of the model (``Model.spec()``), made once in the launching
process and checked against the data before any worker starts: the user's model, a model of
the config's layers, or the named model planned for the data (neither allocated: the
workers build theirs on the buffers their exchange wants)."""

from __future__ import annotations

from ..data.arrays import channels_last
from ..models import MODEL_KINDS, layers_spec, named_spec


def model_spec(cfg, ds, model_obj) -> dict:
    """The spec of the model the run trains: the user's model (checked against the data), or
    the named model built for the data."""
    if model_obj is not None:
        spec = model_obj.spec()
        if spec["sizes"][0] != ds.n_features:
            raise ValueError(
                f"the model takes {spec['sizes'][0]} features, but X has {ds.n_features} per row"
            )
        _check_sample_shape(tuple(spec["input_shape"]), tuple(ds.input_shape))
        if spec["loss"] == "mse":
            if ds.task != "regression" or ds.n_outputs != spec["sizes"][-1]:
                got = (
                    f"{ds.n_outputs} target(s) per row"
                    if ds.task == "regression"
                    else "class labels"
                )
                raise ValueError(
                    f"the model regresses onto {spec['sizes'][-1]} output(s) "
                    f"(loss 'mse'), but y has {got}"
                )
            return spec
        if ds.task != "classification":
            raise ValueError(
                f"the model is a classifier (loss {spec['loss']!r}), but the data "
                f"set is a regression: use a model with loss='mse'"
            )
        classes = model_classes(spec)
        if ds.n_classes > classes:
            raise ValueError(
                f"the labels name {ds.n_classes} classes, but the model has {classes} outputs"
            )
        return spec
    if cfg.layers is not None:
        binary = ds.n_classes == 2 and cfg.layers[-1] in (("dense", 1), ["dense", 1])
        spec = layers_spec(
            cfg.layers,
            ds.input_shape,
            "sigmoid_bce" if binary else "softmax_xent",
            dtype=cfg.dtype,
            seed=cfg.seed,
        )
        outputs = spec["sizes"][-1]
        if not binary and outputs != ds.n_classes:
            raise ValueError(
                f"layers: the model has {outputs} outputs, but the data "
                f"set has {ds.n_classes} classes: end with dense:{ds.n_classes}"
                + (" (or dense:1 for two classes)" if ds.n_classes == 2 else "")
            )
        return spec
    if cfg.model not in MODEL_KINDS:
        raise ValueError(
            f"model={cfg.model!r} is a model you build (dptrain.nn.Sequential): "
            f"train it with dptrain.fit(model, X, y); dptrain.train names one of "
            f"{MODEL_KINDS}"
        )
    shape = ds.input_shape if len(ds.input_shape) == 3 else None
    return named_spec(
        cfg.model,
        ds.n_features,
        ds.n_classes,
        hidden=cfg.hidden,
        input_shape=shape,
        dtype=cfg.dtype,
        seed=cfg.seed,
    )


def _check_sample_shape(model: tuple, data: tuple) -> None:
    """An image model takes samples of its own shape (rows of as many features are flat
    samples, reshaped as logits reshapes them); one of another shape is an error, not the same
    values read another way (channels-last images as channels first)."""
    if len(model) < 2 or len(data) < 2 or model == data:
        return
    hint = ""
    if channels_last(data) == model:
        hint = "; X looks channels last: pass X.transpose(0, 3, 1, 2)"
    raise ValueError(f"the model takes samples of shape {model}, but X's are {data}{hint}")


def model_classes(spec) -> int:
    """The classes a model's outputs name: 2 for a binary (sigmoid) model, else one per logit."""
    return 2 if spec["loss"] == "sigmoid_bce" else spec["sizes"][-1]
