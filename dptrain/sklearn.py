"""scikit-learn estimators on dptrain's one engine: ``MLPClassifier``, ``LogisticRegression``,
``SoftmaxRegression``, ``CNNClassifier`` and ``MLPRegressor``.

Every ``fit`` is one ``dptrain.fit`` run (the same updates on 1..N workers: threads,
processes or MPI ranks; they do not depend on N), so ``workers=`` and ``backend=`` are
ordinary parameters, and ``clone``, ``GridSearchCV``, ``Pipeline`` and pickle work as for
scikit-learn's own estimators. What this layer adds to the engine:

- input validation by scikit-learn's helpers (``validate_data``): its errors for NaN,
  infinity, complex, object and sparse input (refused: dptrain's kernels are dense), and
  ``n_features_in_`` / ``feature_names_in_``;
- label encoding: any labels (strings, ids) become ``classes_``; the engine sees 0..C-1;
- ``predict_proba`` / ``predict_log_proba`` (softmax of the logits; the sigmoid for the
  binary logistic model; in float64), ``decision_function``, ``score`` (the mixins');
- ``partial_fit``: one epoch more from the current parameters (``classes=`` on the first
  call, as scikit-learn's SGDClassifier wants);
- pickling through the flat parameters (the C object is rebuilt on load).

Parameters take the names scikit-learn users know (``hidden_layer_sizes``,
``learning_rate_init``, ``max_iter``, ``batch_size``, ``momentum``, ``alpha``, ...) and map
to dptrain's TrainConfig options (``lr``, ``epochs``, ``weight_decay``, ...); the mapping is
``_Estimator._engine_options``. ``engine_options`` passes any other option (``allreduce``,
``deterministic``, ``timeout``, ...) as it is.

The defaults are scikit-learn's MLP ones: Adam at learning rate 0.001, stopping when the
training loss stops improving by ``tol`` (a ConvergenceWarning when ``max_iter`` epochs ran
first), so that models train on data as users bring it. LogisticRegression and
SoftmaxRegression (scikit-learn's LogisticRegression is a full-batch solver with no rate)
take Adam at 0.01 for up to 1000 epochs: a one-layer model needs more epochs than an MLP.
When training goes wrong on unscaled data (a first epoch whose loss explodes, every row
predicted as one class, no better than the majority class, a diverged loss) the warning or
error names the features' span and the fix (StandardScaler).

Left out on purpose: scikit-learn's ``early_stopping`` on a held-out fraction (dptrain's
``validation`` option holds one out and reports it, but does not stop on it), sample
weights, class weights, the "lbfgs" solver, sparse input. As in scikit-learn, each ``fit``
(warm-started or not) starts a new optimizer and ``partial_fit`` continues the one before
it (Adam's moments and step count); the learning-rate schedule restarts with each call.

scikit-learn is no requirement of dptrain: ``import dptrain`` does not import this module,
which needs scikit-learn >= 1.6 (``pip install scikit-learn``).
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets, unique_labels
    from sklearn.utils.validation import check_array, check_is_fitted, validate_data
except ImportError as exc:  # no scikit-learn, or one older than 1.6 (validate_data)
    raise ImportError(
        f"dptrain.sklearn needs scikit-learn >= 1.6 (pip install scikit-learn): {exc}"
    ) from exc

from . import models, nn
from .comm import BACKENDS, resolve_backend
from .comm.mpi import world as mpi_world
from .config import DTYPES
from .data.arrays import channels_last_note
from .engine import fit as engine_fit
from .optim import SCHEDULES  # learning_rate: TrainConfig's lr_schedule

__all__ = [
    "CNNClassifier",
    "LogisticRegression",
    "MLPClassifier",
    "MLPRegressor",
    "SoftmaxRegression",
]

SOLVERS = ("adam", "adamw", "sgd", "rmsprop")  # solver: TrainConfig's optimizer
AUTO_BATCH = 200  # batch_size="auto": min(200, n_samples), as sklearn's MLP
# dptrain.fit options an estimator sets from its own parameters and data (or that make no
# sense for an estimator): engine_options may not give them
_OWN_OPTIONS = (
    "model",
    "dataset",
    "hidden",
    "dtype",
    "seed",
    "epochs",
    "batch_size",
    "batch_per_worker",
    "lr",
    "lr_schedule",
    "momentum",
    "nesterov",
    "optimizer",
    "betas",
    "eps",
    "tol",
    "n_iter_no_change",
    "weight_decay",
    "shuffle",
    "workers",
    "backend",
    "threads",
    "quiet",
    "progress",
    "limit",
    "data_dir",
    "n_samples",
    "n_features",
    "upscale",
    "allow_download",
    "resume",
    "X_test",
    "y_test",
    "log",
)


NO_Y = "no_validation"  # validate_data's "no y given" (None is a y, and refused)


def _no_y(y) -> bool:
    return isinstance(y, str) and y == NO_Y


# ---------------------------------------------------------------- parameter checks
def _bad(est, name, expected):
    return ValueError(
        f"{type(est).__name__}: {name} must be {expected}, got {getattr(est, name)!r}"
    )


def _int_param(est, name, minimum=1):
    v = getattr(est, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise _bad(est, name, f"an integer >= {minimum}")
    return int(v)


def _real_param(est, name, low, high=math.inf, *, low_open=False, high_open=False):
    v = getattr(est, name)
    ok = (
        not isinstance(v, bool)
        and isinstance(v, numbers.Real)
        and math.isfinite(v)
        and (v > low if low_open else v >= low)
        and (v < high if high_open else v <= high)
    )
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise _bad(est, name, f"a finite number in {lo}{low}, {high}{hi}")
    return float(v)


def _choice_param(est, name, choices):
    v = getattr(est, name)
    if not isinstance(v, str) or v not in choices:
        raise _bad(est, name, f"one of {', '.join(map(repr, choices))}")
    return v


def _widths_param(est, name, allow_empty=True):
    """A tuple of positive ints from an int or a sequence of ints."""
    v = getattr(est, name)
    seq = (v,) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
    try:
        widths = tuple(seq)
    except TypeError:
        raise _bad(est, name, "a sequence of positive integers") from None
    if any(isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1 for w in widths) or (
        not widths and not allow_empty
    ):
        raise _bad(est, name, "a sequence of positive integers")
    return tuple(int(w) for w in widths)


def _keep_params(est, params: dict) -> None:
    """An __init__'s parameters kept as they are, under their names (scikit-learn's rule:
    no validation or conversion in __init__; ``get_params`` reads them back)."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(est, name, value)


def _seed_of(random_state) -> int:
    """The engine's seed: an int >= 0 as it is (the seed of dptrain.MLP(seed=...)), else one
    drawn from the RandomState (None: NumPy's global one)."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(
                f"random_state must be an int >= 0, a RandomState or None, got {random_state!r}"
            )
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


# ---------------------------------------------------------------- the shared machinery
class _Estimator(BaseEstimator):
    """What every estimator shares: the parameters that map to TrainConfig, the engine run,
    pickling. A subclass's __init__ lists its parameters (scikit-learn reads them from its
    signature) and says how to build its dptrain model (``_build_model``)."""

    # ---- checks and the engine's options
    def _check_params(self) -> None:
        """Refuses a bad parameter, naming it, before any data is read."""
        if self.solver == "lbfgs":
            raise ValueError(
                f"{type(self).__name__}: solver='lbfgs' is scikit-learn's full-batch "
                f"solver; dptrain trains by minibatch gradients: use 'adam' (the default), "
                f"'adamw', 'sgd' or 'rmsprop'"
            )
        _choice_param(self, "solver", SOLVERS)
        _real_param(self, "learning_rate_init", 0, low_open=True)
        _choice_param(self, "learning_rate", SCHEDULES)
        _int_param(self, "max_iter")
        if not (isinstance(self.batch_size, str) and self.batch_size == "auto"):
            _int_param(self, "batch_size")
        _real_param(self, "momentum", 0, 1, high_open=True)
        _real_param(self, "alpha", 0)
        _real_param(self, "beta_1", 0, 1, high_open=True)
        _real_param(self, "beta_2", 0, 1, high_open=True)
        _real_param(self, "epsilon", 0, low_open=True)
        _real_param(self, "tol", 0)
        _int_param(self, "n_iter_no_change")
        for name in ("nesterovs_momentum", "shuffle", "warm_start"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise _bad(self, name, "True or False")
        if self.random_state is not None and not isinstance(
            self.random_state, (numbers.Integral, np.random.RandomState)
        ):
            raise _bad(self, "random_state", "an int >= 0, a numpy RandomState or None")
        if self._dtype() not in DTYPES:
            raise _bad(self, "dtype", f"one of {', '.join(DTYPES)}")
        _int_param(self, "workers")
        _int_param(self, "threads")
        if self.backend is not None and self.backend not in BACKENDS:
            raise _bad(self, "backend", f"one of {', '.join(BACKENDS)} or None")
        if not isinstance(self.verbose, (bool, np.bool_)):
            _int_param(self, "verbose", minimum=0)
        if self.engine_options is not None:
            if not isinstance(self.engine_options, dict):
                raise _bad(self, "engine_options", "a dict of dptrain.fit options or None")
            own = sorted(set(self.engine_options) & set(_OWN_OPTIONS))
            if own:
                raise ValueError(
                    f"{type(self).__name__}: engine_options may not set "
                    f"{', '.join(own)}: the estimator's own parameters do "
                    f"(learning_rate_init is lr, max_iter epochs, alpha "
                    f"weight_decay, ...)"
                )

    def _dtype(self) -> str:
        try:
            return models.precision_name(self.dtype)
        except TypeError:
            return repr(self.dtype)

    def _batch(self, n: int) -> int:
        """The global batch for n samples: "auto" is min(200, n); larger than n is clipped."""
        if isinstance(self.batch_size, str):
            return min(AUTO_BATCH, n)
        if self.batch_size > n:
            warnings.warn(
                f"{type(self).__name__}: batch_size={self.batch_size} is larger than "
                f"the {n} samples; it is clipped to {n}",
                UserWarning,
                stacklevel=6,
            )
        return min(self.batch_size, n)

    def _engine_options(self, n: int, epochs: int, schedule: str, seed: int, tol) -> dict:
        """The estimator's parameters as dptrain.fit options (TrainConfig names); tol None:
        every epoch is run."""
        verbose = int(self.verbose)
        if self.solver == "sgd":
            rule = {"momentum": self.momentum, "nesterov": bool(self.nesterovs_momentum)}
        elif self.solver == "rmsprop":  # PyTorch's default momentum 0 (engine_options
            rule = {"eps": self.epsilon}  # may set centered and rms_alpha)
        else:
            rule = {"betas": (self.beta_1, self.beta_2), "eps": self.epsilon}
        return {
            **(self.engine_options or {}),
            **rule,
            "optimizer": self.solver,
            "epochs": epochs,
            "batch_size": self._batch(n),
            "lr": self.learning_rate_init,
            "lr_schedule": schedule,
            "tol": tol,
            "n_iter_no_change": None if tol is None else self.n_iter_no_change,
            "weight_decay": self.alpha,
            "shuffle": bool(self.shuffle),
            "workers": self.workers,
            "backend": self.backend,
            "threads": self.threads,
            "sync_every": self.sync_every,
            "seed": seed,
            "quiet": verbose == 0,
            "progress": verbose >= 2,
        }

    # ---- training
    def _is_trained(self) -> bool:
        return hasattr(self, "model_")

    def __sklearn_is_fitted__(self) -> bool:
        return self._is_trained()

    def _train(self, model, X, targets, *, partial: bool, seed: int | None = None) -> list:
        """Trains ``model`` on (X, targets) through dptrain.fit: ``max_iter`` epochs (one
        for partial_fit), then records the run. seed: that of a new model, which becomes
        self.model_ only when the run succeeds; None: model is self.model_, continued (the
        engine changes its parameters only when the run succeeds). A failed fit thus leaves
        the model as it was."""
        new = seed is not None
        seed = seed if new else self._seed
        done = 0 if new else self.n_iter_
        epochs = 1 if partial else self.max_iter
        schedule = "constant" if partial else self.learning_rate
        backend, _ = resolve_backend(self.backend)
        tol = None if partial else self.tol  # partial_fit runs its one epoch
        # partial_fit continues the optimizer of the fit before it (Adam's moments and step
        # count), as scikit-learn's does; fit, warm-started or not, starts a new one
        solver, state = getattr(self, "_optimizer", (None, None))
        state = state if partial and not new and solver == self.solver else None
        # each run's epochs get their own sample orders: the seed moves on by the epochs done
        try:
            result = engine_fit(
                model,
                X,
                targets,
                log=print,
                optimizer_state=state,
                **self._engine_options(len(X), epochs, schedule, seed + done, tol),
            )
        except FloatingPointError as exc:
            raise FloatingPointError(f"{type(self).__name__}: {exc}{_scale_advice(X)}") from None
        history, state = result.history, result.optimizer_state
        if backend == "mpi":  # rank 0 holds the result: every rank gets the model
            history, state = _from_rank0(model, history, state)
        self._optimizer = (self.solver, state)
        if new:
            self._seed, self.model_ = seed, model
            self.n_iter_, self.loss_curve_, self.history_ = 0, [], []
            self.recoveries_ = []
        self.recoveries_ += (result.get("elastic") or []) if backend != "mpi" else []
        self.history_ += [dict(rec, epoch=done + rec["epoch"]) for rec in history]
        self.loss_curve_ += [rec["train_loss"] for rec in history]
        self.n_iter_ = done + len(history)
        if not partial and len(history) == epochs and "stopped" not in history[-1]:
            warnings.warn(
                f"{type(self).__name__}: max_iter={epochs} epochs ran and the training loss "
                f"still fell by more than tol={self.tol:g} within the last "
                f"{self.n_iter_no_change + 1}: it has not converged (raise max_iter)",
                ConvergenceWarning,
                stacklevel=4,
            )
        return history

    def _check_training(self, X, targets, history, *, partial: bool) -> None:
        """Warns, naming the cause and the fix, when the first epoch's loss exploded (ten
        times that of the constant prediction: the class frequencies' cross-entropy, or the
        targets' variance) or when a classifier ended predicting one class for every row, or
        no better than always predicting the majority class."""
        if partial or not history:
            return
        first = history[0]["train_loss"]
        if self.model_.loss == "mse":
            baseline = float(np.mean(np.var(targets, axis=0, dtype=np.float64)))
        else:
            freq = np.bincount(targets) / len(targets)
            baseline = float(-np.sum(freq[freq > 0] * np.log(freq[freq > 0])))
        if first > 10 * max(baseline, 1e-12):
            warnings.warn(
                f"{type(self).__name__}: the first epoch's training loss was {first:,.4g}, "
                f"{first / max(baseline, 1e-12):,.0f} times that of a constant prediction "
                f"({baseline:.4g}): the steps were too large for the data"
                f"{_scale_advice(X) or ': lower learning_rate_init'}",
                UserWarning,
                stacklevel=5,
            )
        if self.model_.loss != "mse":
            rows, labels = X[:10000], targets[:10000]
            predicted = _codes(self._logits(rows))
            majority = np.bincount(labels).argmax()
            share = np.mean(labels == majority)
            accuracy = np.mean(predicted == labels)
            if len(np.unique(predicted)) == 1:
                what = (
                    f"training stalled: every training row is predicted as class "
                    f"{_label(self.classes_[predicted[0]])} ({100 * share:.0f}% of the rows)"
                )
            elif accuracy <= share:
                what = (
                    f"training has not beaten the majority class: training accuracy "
                    f"{accuracy:.3f}, where always predicting class "
                    f"{_label(self.classes_[majority])} scores {share:.3f}"
                )
            else:
                return
            # the features' span is read only for a warning (a pass over all of X)
            advice = _scale_advice(X) or ": try solver='adam' or a smaller learning_rate_init"
            warnings.warn(f"{type(self).__name__}: {what}{advice}", UserWarning, stacklevel=5)

    # ---- pickling: the model as its architecture and flat buffers, not the C object
    def __getstate__(self):
        state = dict(super().__getstate__())
        model = state.get("model_")
        if isinstance(model, models.Model):
            state["model_"] = {
                "dptrain_model": model.config(),
                "params": model.params.copy(),
                "velocity": model.velocity.copy(),
            }
        return state

    def __setstate__(self, state):
        saved = state.get("model_")
        if isinstance(saved, dict) and "dptrain_model" in saved:
            dt = models.storage_dtype(saved["dptrain_model"]["dtype"])
            state = dict(
                state,
                model_=models.model_from_spec(
                    saved["dptrain_model"],
                    threads=state.get("threads", 1),
                    params=np.array(saved["params"], dtype=dt),
                    velocity=np.array(saved["velocity"], dtype=dt),
                ),
            )
        super().__setstate__(state)

    def _logits(self, X) -> np.ndarray:
        """The model's outputs for validated rows, as float64."""
        return self.model_.logits(X).astype(np.float64)


def _label(label) -> str:
    """A class label as a user wrote it: 2 or 'cat', not np.int64(2)."""
    return repr(label.item() if isinstance(label, np.generic) else label)


def _codes(scores) -> np.ndarray:
    """The predicted class indices from decision scores: (n,) (positive: class 1) or one
    column per class (the largest)."""
    if scores.ndim == 1 or scores.shape[1] == 1:
        return (scores.reshape(len(scores)) > 0).astype(np.intp)
    return np.argmax(scores, axis=1)


def _scale_advice(X) -> str:
    """ "; features span lo..hi: scale them ..." when X's columns are far from unit scale (a
    value beyond 10 in magnitude, or columns whose spreads differ by 100 times), else ""."""
    if X.size == 0:
        return ""
    lo, hi = float(X.min()), float(X.max())
    spread = np.ptp(X, axis=0)
    spread = spread[spread > 0]
    uneven = spread.size > 0 and spread.max() > 100 * spread.min()
    if max(abs(lo), abs(hi)) <= 10 and not uneven:
        return ""
    return (
        f"; the features span {lo:,.6g}..{hi:,.6g}: scale them, e.g. "
        f"make_pipeline(StandardScaler(), estimator) with sklearn.preprocessing.StandardScaler"
    )


def _from_rank0(model, history, optimizer_state):
    """Under MPI only rank 0 holds the trained model, the history and the optimizer's state:
    broadcast them, so that the estimator on every rank is fitted (once per fit, outside the
    training loop)."""
    comm = mpi_world()
    if comm.Get_size() == 1:
        return history, optimizer_state
    comm.Bcast(model.params, root=0)
    comm.Bcast(model.velocity, root=0)
    return comm.bcast((history, optimizer_state) if comm.Get_rank() == 0 else None, root=0)


class _Classifier(ClassifierMixin, _Estimator):
    """fit / partial_fit / predict / predict_proba of a classifier: labels encoded as
    0..C-1 through ``classes_``; a subclass builds the model (``_build_model``) and may
    read the rows its own way (``_rows``)."""

    def fit(self, X, y):
        """Trains on X (n_samples, n_features) and the labels y (any hashable labels) for
        ``max_iter`` epochs, from a new model (or, with ``warm_start``, from the current one)
        on ``workers`` workers. Returns self."""
        return self._fit(X, y, classes=None, partial=False)

    def partial_fit(self, X, y, classes=None):
        """One epoch more on (X, y) from the current parameters (at the constant rate
        ``learning_rate_init``). The first call builds the model and needs ``classes``:
        every label that will ever be seen (e.g. np.unique(y_all)). Returns self."""
        return self._fit(X, y, classes=classes, partial=True)

    def _fit(self, X, y, *, classes, partial):
        self._check_params()
        fresh = not (self._is_trained() and (partial or self.warm_start))
        X, y = self._rows(X, y, reset=fresh)
        check_classification_targets(y)
        if fresh:
            if partial and classes is None:
                raise ValueError(
                    f"{type(self).__name__}: classes must be given to the first "
                    f"partial_fit call: every label to be seen, e.g. "
                    f"classes=np.unique(y_all)"
                )
            labels = unique_labels(y if classes is None else classes)
            if len(labels) < 2:
                raise ValueError(
                    f"{type(self).__name__} needs samples of 2 classes at least; "
                    f"y holds 1 class ({labels[0].item()!r})"
                )
        else:
            labels = self.classes_
            if classes is not None and not np.array_equal(unique_labels(classes), labels):
                raise ValueError(
                    f"classes={classes!r} differs from classes_="
                    f"{labels.tolist()!r} of the first partial_fit call"
                )
        codes = _encode(y, labels)
        if fresh:
            seed = _seed_of(self.random_state)
            model = self._build_model(X.shape[1], len(labels), seed)
            history = self._train(model, X, codes, partial=partial, seed=seed)
        else:
            history = self._train(self.model_, X, codes, partial=partial)
        self.classes_ = labels
        self._check_training(X, codes, history, partial=partial)
        return self

    def _rows(self, X, y=NO_Y, *, reset: bool):
        """X as C-contiguous rows of the model's dtype (and y as 1-D labels when given),
        validated by scikit-learn's helpers (n_features_in_ and feature_names_in_ set when
        reset)."""
        kw = dict(
            dtype=models.storage_dtype(self._dtype()), order="C", accept_sparse=False, reset=reset
        )
        if _no_y(y):
            return validate_data(self, X, **kw)
        return validate_data(self, X, y, **kw)

    def decision_function(self, X) -> np.ndarray:
        """The logits (float64): (n_samples,) for two classes (positive: classes_[1]), else
        (n_samples, n_classes)."""
        check_is_fitted(self)
        z = self._logits(self._rows(X, reset=False))
        if z.shape[1] == 1:  # one sigmoid logit
            return z[:, 0]
        if z.shape[1] == 2:  # two softmax logits: their difference
            return z[:, 1] - z[:, 0]
        return z

    def predict(self, X) -> np.ndarray:
        """The predicted labels (from classes_): the class of the largest logit."""
        d = self.decision_function(X)
        return self.classes_[_codes(d)]

    def predict_log_proba(self, X) -> np.ndarray:
        """log of predict_proba, computed stably in float64: (n_samples, n_classes)."""
        check_is_fitted(self)
        z = self._logits(self._rows(X, reset=False))
        if z.shape[1] == 1:  # log sigmoid(-z), log sigmoid(z)
            return np.column_stack([-np.logaddexp(0.0, z[:, 0]), -np.logaddexp(0.0, -z[:, 0])])
        top = z.max(axis=1, keepdims=True)
        return z - (top + np.log(np.exp(z - top).sum(axis=1, keepdims=True)))

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities in float64, (n_samples, n_classes), columns in classes_
        order: the softmax of the logits (the sigmoid for a binary logistic model)."""
        return np.exp(self.predict_log_proba(X))


def _encode(y, labels) -> np.ndarray:
    """y's labels as indices 0..C-1 into the sorted labels; ValueError naming an unknown one."""
    y = np.asarray(y)
    codes = np.clip(np.searchsorted(labels, y), 0, len(labels) - 1)
    unknown = labels[codes] != y
    if unknown.any():
        raise ValueError(
            f"y holds the label {y[np.argmax(unknown)].item()!r}, which is not "
            f"one of classes_ {labels.tolist()!r}"
        )
    return codes.astype(np.int64)


# ---------------------------------------------------------------- the documentation
_PARAM_DOCS = {
    "hidden_layer_sizes": """hidden_layer_sizes : int or tuple of int, default={default}
    Widths of the hidden layers (ReLU between them).""",
    "solver": """solver : {{"adam", "adamw", "sgd", "rmsprop"}}, default={default}
    The optimizer (dptrain's ``optimizer``): Adam, as scikit-learn's default solver and
    PyTorch's ``torch.optim.Adam``; AdamW (decoupled weight decay: ``alpha`` shrinks the
    weights instead of entering the gradient); SGD with momentum; or PyTorch's RMSprop
    (``epsilon`` its eps, no momentum, as PyTorch's default; ``centered`` and ``rms_alpha``
    through ``engine_options``). scikit-learn's full-batch "lbfgs" is refused: dptrain trains by
    minibatches.""",
    "learning_rate_init": """learning_rate_init : float > 0, default={default}
    The learning rate (dptrain's ``lr``); scikit-learn's default.""",
    "learning_rate": """learning_rate : {{"constant", "cosine", "step", "exponential", \
"onecycle"}}, default={default}
    The rate over one ``fit`` (``lr_schedule``): constant, a cosine decay to 0 over its
    ``max_iter`` epochs, torch's StepLR or ExponentialLR stepped every epoch (their
    ``lr_gamma``, ``lr_step_epochs`` through ``engine_options``), or torch's OneCycleLR
    over the fit. ``partial_fit`` runs at the constant rate.""",
    "max_iter": """max_iter : int, default={default}
    The most epochs (passes over the training set) of one ``fit`` (``epochs``); fewer run
    when the loss stops improving (``tol``). A ConvergenceWarning says when all ran.""",
    "tol": """tol : float >= 0, default={default}
    ``fit`` stops once the epoch's training loss has not fallen below the best so far by
    ``tol`` for more than ``n_iter_no_change`` epochs in a row (scikit-learn's rule for
    its stochastic solvers; dptrain's ``tol``). ``partial_fit`` runs its one epoch.""",
    "n_iter_no_change": """n_iter_no_change : int, default={default}
    Epochs without improvement by ``tol`` before ``fit`` stops.""",
    "batch_size": """batch_size : int or "auto", default={default}
    The global batch: "auto" is ``min(200, n_samples)``; a larger one is clipped to
    n_samples. Worker r of N takes its share of every global batch, so the updates do
    not depend on ``workers``.""",
    "momentum": """momentum : float in [0, 1), default={default}
    SGD momentum (solver="sgd" only).""",
    "nesterovs_momentum": """nesterovs_momentum : bool, default={default}
    Nesterov momentum (``nesterov``; solver="sgd" only).""",
    "beta_1": """beta_1 : float in [0, 1), default={default}
    Adam's decay rate of the gradient's running mean (``betas[0]``).""",
    "beta_2": """beta_2 : float in [0, 1), default={default}
    Adam's decay rate of the squared gradient's running mean (``betas[1]``).""",
    "epsilon": """epsilon : float > 0, default={default}
    Adam's term added to the denominator (``eps``).""",
    "alpha": """alpha : float >= 0, default={default}
    L2 penalty as weight decay: each step adds ``alpha * w`` to the gradient of every
    parameter, biases included (``weight_decay``; with "adamw" the weights shrink by
    ``lr * alpha`` instead). scikit-learn's MLP divides its alpha by the batch size and
    spares the biases.""",
    "dropout": """dropout : float in [0, 1), default={default}
    A Dropout layer of this rate after each hidden layer's ReLU while training (none while
    predicting), its masks keyed on the sample: the same with any number of workers. 0: no
    dropout layer (scikit-learn's MLP has none).""",
    "shuffle": """shuffle : bool, default={default}
    A new seeded sample order every epoch.""",
    "random_state": """random_state : int >= 0, RandomState or None, default={default}
    Seeds the initial weights and the epochs' sample orders: an int is dptrain's ``seed``
    (the same model as ``dptrain.fit`` on a dptrain model of that seed); None draws one
    from NumPy's global generator.""",
    "warm_start": """warm_start : bool, default={default}
    ``fit`` continues from the current model (its classes and features) instead of a new
    one.""",
    "dtype": """dtype : {{"float32", "float64", "bfloat16"}}, default={default}
    The model's dtype; X is converted to it once per call. "bfloat16" is mixed precision:
    float32 weights and X, every GEMM's inputs rounded to bfloat16, float32 accumulation.""",
    "workers": """workers : int, default={default}
    Data-parallel workers of each fit (under mpiexec: the MPI world size).""",
    "backend": """backend : {{"thread", "process", "mpi"}} or None, default={default}
    How the workers run: threads of this process, processes sharing memory, or MPI ranks
    (launch the script with mpiexec -n N; every rank's estimator ends up fitted). None:
    MPI when started by an MPI launcher, else threads.""",
    "threads": """threads : int, default={default}
    Threads the C kernels split each worker's batch over.""",
    "sync_every": """sync_every : int or "auto", default={default}
    Local SGD: the workers' replicas take this many local steps on their own shards of
    each batch, then average their parameters (1: synchronous SGD; "auto": chosen from
    the run's loss and timings). The fitted model depends on it and on the replicas
    (``engine_options={{"replicas": K}}``, one per worker by default), not on how many
    workers run them.""",
    "engine_options": """engine_options : dict or None, default={default}
    Further ``dptrain.fit`` options, as they are (e.g. ``{{"allreduce": "ring"}}``,
    ``{{"deterministic": True}}``, ``{{"timeout": 60}}``; ``{{"validation": 0.1}}`` holds
    out the last 10 % of the rows and ``history_`` gives their loss and accuracy per
    epoch); not those set by the parameters above.""",
    "verbose": """verbose : int, default={default}
    0 prints nothing; 1 prints the run's lines (one per epoch); 2 adds a progress bar.""",
    "input_shape": """input_shape : tuple (C, H, W) or None, default={default}
    How to read a flat row of X as an image. None: (3, s, s) for 3 s^2 features, (1, s, s)
    for s^2, else the features in row-major order in a (1, s, s) image (s the smallest
    side that holds them, zeros after them): the reading for tabular data.""",
    "channels": """channels : tuple of int, default={default}
    Output channels of the conv blocks (conv KxK, ReLU, 2x2 max-pool).""",
    "cnn_hidden_layer_sizes": """hidden_layer_sizes : tuple of int, default={default}
    Widths of the dense layers after the conv blocks (ReLU).""",
    "kernel_size": """kernel_size : int, default={default}
    The convolutions' K (stride 1).""",
    "padding": """padding : int, default={default}
    Zeros around each convolution's input.""",
}
_CLASSIFIER_ATTRIBUTES = """classes_ : ndarray (n_classes,)
    The labels, sorted; predictions are taken from them.
n_features_in_ : int
    Features per row seen by fit.
feature_names_in_ : ndarray of str
    Column names of a DataFrame X (only then).
model_ : dptrain model
    The trained dptrain model (params, velocity, logits, save).
n_iter_ : int
    Epochs run since the model was built (fit, warm-started fits and partial_fit calls).
loss_curve_ : list of float
    The mean training loss of every epoch.
history_ : list of dict
    dptrain's per-epoch records (epoch, train_loss, train_accuracy, seconds, ...).
recoveries_ : list of dict
    With engine_options=dict(elastic=True): every worker lost and recovered from (ranks,
    causes, step, workers before and after, seconds), over every fit of the model."""


def _doc(cls, summary: str, attributes: str, notes: str = "") -> str:
    """A numpydoc docstring: the summary, every __init__ parameter with its default, the
    fitted attributes, notes."""
    sig = inspect.signature(cls.__init__)
    lines = [summary.strip(), "", "Parameters", "----------"]
    for name, p in sig.parameters.items():
        if name == "self":
            continue
        key = (
            f"cnn_{name}"
            if cls.__name__ == "CNNClassifier" and name == "hidden_layer_sizes"
            else name
        )
        lines.append(_PARAM_DOCS[key].format(default=repr(p.default)))
    lines += ["", "Attributes", "----------", attributes.strip()]
    if notes:
        lines += ["", "Notes", "-----", notes.strip()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the estimators
def _mlp_model(est, n_features: int, n_outputs: int, loss: str, seed: int):
    """dptrain.MLP of the estimator's widths, or with dropout > 0 the same dense stack with
    a Dropout after each hidden ReLU (a Sequential)."""
    widths = _widths_param(est, "hidden_layer_sizes")
    kw = {"seed": seed, "dtype": est._dtype(), "threads": est.threads}
    if est.dropout:
        return nn.mlp(n_features, widths, n_outputs, loss=loss, dropout=float(est.dropout), **kw)
    return models.MLP((n_features, *widths, n_outputs), loss, **kw)


class MLPClassifier(_Classifier):
    def __init__(
        self,
        hidden_layer_sizes=(100,),
        *,
        solver="adam",
        learning_rate_init=0.001,
        learning_rate="constant",
        max_iter=200,
        batch_size="auto",
        momentum=0.9,
        nesterovs_momentum=True,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        tol=1e-4,
        n_iter_no_change=10,
        alpha=0.0001,
        dropout=0.0,
        shuffle=True,
        random_state=None,
        warm_start=False,
        dtype="float32",
        workers=1,
        backend=None,
        threads=1,
        sync_every=1,
        engine_options=None,
        verbose=0,
    ):
        _keep_params(self, locals())

    def _check_params(self):
        super()._check_params()
        _widths_param(self, "hidden_layer_sizes")
        _real_param(self, "dropout", 0, 1, high_open=True)

    def _build_model(self, n_features, n_classes, seed):
        return _mlp_model(self, n_features, n_classes, "softmax_xent", seed)


MLPClassifier.__doc__ = _doc(
    MLPClassifier,
    """
Multi-layer perceptron classifier trained by SGD on dptrain's engine (``dptrain.MLP``:
dense layers, ReLU, softmax cross-entropy; two classes get two softmax outputs).""",
    _CLASSIFIER_ATTRIBUTES,
)


class _LinearClassifier(_Classifier):
    """LogisticRegression and SoftmaxRegression: one dense layer; the same parameters."""

    def __init__(
        self,
        *,
        solver="adam",
        learning_rate_init=0.01,
        learning_rate="constant",
        max_iter=1000,
        batch_size="auto",
        momentum=0.9,
        nesterovs_momentum=True,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        tol=1e-4,
        n_iter_no_change=10,
        alpha=0.0001,
        shuffle=True,
        random_state=None,
        warm_start=False,
        dtype="float32",
        workers=1,
        backend=None,
        threads=1,
        sync_every=1,
        engine_options=None,
        verbose=0,
    ):
        _keep_params(self, locals())


class LogisticRegression(_LinearClassifier):
    def _build_model(self, n_features, n_classes, seed):
        kw = dict(seed=seed, dtype=self._dtype(), threads=self.threads)
        if n_classes == 2:
            return models.LogisticRegression(n_features, **kw)
        return models.SoftmaxRegression(n_features, n_classes, **kw)


class SoftmaxRegression(_LinearClassifier):
    def _build_model(self, n_features, n_classes, seed):
        return models.SoftmaxRegression(
            n_features, n_classes, seed=seed, dtype=self._dtype(), threads=self.threads
        )


class CNNClassifier(_Classifier):
    def __init__(
        self,
        input_shape=None,
        *,
        channels=(32, 64),
        hidden_layer_sizes=(128,),
        kernel_size=3,
        padding=0,
        solver="adam",
        learning_rate_init=0.001,
        learning_rate="constant",
        max_iter=10,
        batch_size="auto",
        momentum=0.9,
        nesterovs_momentum=True,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        tol=1e-4,
        n_iter_no_change=10,
        alpha=0.0001,
        shuffle=True,
        random_state=None,
        warm_start=False,
        dtype="float32",
        workers=1,
        backend=None,
        threads=1,
        sync_every=1,
        engine_options=None,
        verbose=0,
    ):
        _keep_params(self, locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True  # (n, H, W) grayscale images (and (n, C, H, W))
        return tags

    def _check_params(self):
        super()._check_params()
        _widths_param(self, "channels", allow_empty=False)
        _widths_param(self, "hidden_layer_sizes")
        _int_param(self, "kernel_size")
        _int_param(self, "padding", minimum=0)
        if self.input_shape is not None:
            shape = _widths_param(self, "input_shape")
            if len(shape) != 3:
                raise _bad(self, "input_shape", "(C, H, W) or None")
        self._smallest_side()

    def _smallest_side(self) -> int:
        """The smallest H (and W) the conv blocks take: each must leave a 2x2 window to pool."""
        channels = _widths_param(self, "channels")
        k, p = self.kernel_size, self.padding
        side = 1
        for _ in channels:  # backwards through the blocks: the input they need
            side = max(2 * side, 2) - 2 * p + k - 1
        side = max(side, 1)
        models.check_conv_blocks((1, side, side), channels, k, p)  # raises if none works
        return side

    def _rows(self, X, y=NO_Y, *, reset: bool):
        """Images (n, C, H, W), (n, H, W) or flat rows (n, d) as the network's flat rows: read
        as ``input_shape_`` (C, H, W), then zero-padded at the bottom and right to
        ``image_shape_`` when smaller than the conv blocks take."""
        dt = models.storage_dtype(self._dtype())
        if getattr(X, "ndim", None) is None and not hasattr(X, "toarray"):
            try:  # a list, or an object with __array__
                X = np.asarray(X)
            except ValueError:  # ragged: validate_data says what is wrong
                pass
        if getattr(X, "ndim", 2) > 2:
            X = check_array(X, allow_nd=True, dtype=dt, order="C")
            if X.ndim > 4:
                raise ValueError(
                    f"X has shape {X.shape}: expected images (n, C, H, W) or "
                    f"(n, H, W), or rows (n, features)"
                )
            read = (1,) + X.shape[1:] if X.ndim == 3 else X.shape[1:]
            note = channels_last_note("X", X.shape) if X.ndim == 4 and reset else None
            if note:  # read as it is, as fit reads X: a warning, as scikit-learn's
                warnings.warn(note, UserWarning, stacklevel=3)
            X = X.reshape(len(X), -1)
        else:
            read = None
        out = super()._rows(X, y, reset=reset)
        rows = out if _no_y(y) else out[0]
        d = rows.shape[1]
        if reset:
            if read is None:
                read = self._read_shape(d)
            side = self._smallest_side()
            # what fit saw, set as validate_data sets n_features_in_
            self.input_shape_ = tuple(read)
            self.image_shape_ = (read[0], max(read[1], side), max(read[2], side))
        elif read is not None and tuple(read) != self.input_shape_:
            raise ValueError(
                f"X holds images of shape {tuple(read)}, but "
                f"{type(self).__name__} was fitted on {self.input_shape_}"
            )
        rows = _as_image_rows(rows, self.input_shape_, self.image_shape_)
        return rows if _no_y(y) else (rows, out[1])

    def _read_shape(self, d: int) -> tuple:
        """How a flat row of d features is read: input_shape, a square image, or packed."""
        if self.input_shape is not None:
            shape = _widths_param(self, "input_shape")
            if math.prod(shape) != d:
                raise ValueError(
                    f"input_shape={shape} holds {math.prod(shape)} values, but "
                    f"X has {d} features per row"
                )
            return shape
        try:
            return models.image_shape(d)
        except ValueError:
            side = math.isqrt(d - 1) + 1  # the smallest s with s * s >= d
            return (1, side, side)

    def _build_model(self, n_features, n_classes, seed):
        return models.CNN(
            self.image_shape_,
            n_classes,
            channels=_widths_param(self, "channels"),
            hidden=_widths_param(self, "hidden_layer_sizes"),
            kernel=self.kernel_size,
            padding=self.padding,
            seed=seed,
            dtype=self._dtype(),
            threads=self.threads,
        )


def _as_image_rows(rows: np.ndarray, read: tuple, image: tuple) -> np.ndarray:
    """Rows of d <= C*H*W values read as (C, H, W) images (zeros after the d values),
    placed at the top left of zero (C, H', W') images: the network's flat rows. Rows already
    in that shape are returned as they are (no copy)."""
    n, d = rows.shape
    if tuple(read) == tuple(image) and d == math.prod(image):
        return rows
    c, h, w = read
    out = np.zeros((n, *image), dtype=rows.dtype)
    flat = np.zeros((n, c * h * w), dtype=rows.dtype)
    flat[:, :d] = rows
    out[:, :, :h, :w] = flat.reshape(n, c, h, w)
    return out.reshape(n, -1)


CNNClassifier.__doc__ = _doc(
    CNNClassifier,
    """
Convolutional classifier trained by SGD on dptrain's engine (``dptrain.CNN``: conv blocks
conv KxK -> ReLU -> 2x2 max-pool, then dense layers with ReLU, softmax cross-entropy).

X: images (n, C, H, W) (channels first), grayscale images (n, H, W), or flat rows (n, d)
read as ``input_shape`` (see there: tabular rows are laid out row-major in a square
image). An image smaller than the conv blocks take (``kernel_size``, ``padding`` and the
2x2 pools leave a window at every block) is zero-padded at its bottom and right.""",
    _CLASSIFIER_ATTRIBUTES
    + """
input_shape_ : tuple (C, H, W)
    How a sample of X was read.
image_shape_ : tuple (C, H, W)
    The network's input: input_shape_, zero-padded up to the smallest side the conv
    blocks take.""",
)

_LINEAR_NOTES = """Trained by mini-batch SGD with momentum (not scikit-learn's lbfgs), so
standardize the features first (e.g. a StandardScaler in a Pipeline)."""
LogisticRegression.__doc__ = _doc(
    LogisticRegression,
    """
Logistic regression trained by SGD on dptrain's engine: for two classes one sigmoid
output (``dptrain.LogisticRegression``, binary cross-entropy), for more the multinomial
model (``dptrain.SoftmaxRegression``), as scikit-learn's LogisticRegression does.""",
    _CLASSIFIER_ATTRIBUTES,
    _LINEAR_NOTES,
)
SoftmaxRegression.__doc__ = _doc(
    SoftmaxRegression,
    """
Multinomial logistic (softmax) regression trained by SGD on dptrain's engine
(``dptrain.SoftmaxRegression``: one dense layer, one output per class, softmax
cross-entropy, for two classes too).""",
    _CLASSIFIER_ATTRIBUTES,
    _LINEAR_NOTES,
)


class MLPRegressor(RegressorMixin, _Estimator):
    def __init__(
        self,
        hidden_layer_sizes=(100,),
        *,
        solver="adam",
        learning_rate_init=0.001,
        learning_rate="constant",
        max_iter=200,
        batch_size="auto",
        momentum=0.9,
        nesterovs_momentum=True,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        tol=1e-4,
        n_iter_no_change=10,
        alpha=0.0001,
        dropout=0.0,
        shuffle=True,
        random_state=None,
        warm_start=False,
        dtype="float32",
        workers=1,
        backend=None,
        threads=1,
        sync_every=1,
        engine_options=None,
        verbose=0,
    ):
        _keep_params(self, locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y (n_samples, n_outputs) is learned as is
        return tags

    def fit(self, X, y):
        """Trains on X (n_samples, n_features) and real targets y, (n_samples,) or
        (n_samples, n_outputs), for ``max_iter`` epochs. Returns self."""
        return self._fit(X, y, partial=False)

    def partial_fit(self, X, y):
        """One epoch more on (X, y) from the current parameters. Returns self."""
        return self._fit(X, y, partial=True)

    def _fit(self, X, y, *, partial):
        self._check_params()
        _widths_param(self, "hidden_layer_sizes")
        fresh = not (self._is_trained() and (partial or self.warm_start))
        X, y = validate_data(
            self,
            X,
            y,
            dtype=models.storage_dtype(self._dtype()),
            order="C",
            accept_sparse=False,
            y_numeric=True,
            multi_output=True,
            reset=fresh,
        )
        targets = np.ascontiguousarray(
            y.reshape(len(y), -1), dtype=models.storage_dtype(self._dtype())
        )
        if fresh:
            seed = _seed_of(self.random_state)
            _real_param(self, "dropout", 0, 1, high_open=True)
            model = _mlp_model(self, X.shape[1], targets.shape[1], "mse", seed)
            history = self._train(model, X, targets, partial=partial, seed=seed)
            self._single_output = y.ndim == 1
        else:
            if targets.shape[1] != self.model_.n_outputs:
                raise ValueError(
                    f"y has {targets.shape[1]} outputs per row, but the model "
                    f"was fitted on {self.model_.n_outputs}"
                )
            history = self._train(self.model_, X, targets, partial=partial)
        self._check_training(X, targets, history, partial=partial)
        return self

    def predict(self, X) -> np.ndarray:
        """The predicted targets (float64): (n_samples,) when fitted on 1-D y."""
        check_is_fitted(self)
        X = validate_data(
            self,
            X,
            dtype=models.storage_dtype(self._dtype()),
            order="C",
            accept_sparse=False,
            reset=False,
        )
        z = self._logits(X)
        return z[:, 0] if self._single_output else z


MLPRegressor.__doc__ = _doc(
    MLPRegressor,
    """
Multi-layer perceptron regressor (dense layers, ReLU, mean squared error) trained by SGD
on dptrain's engine: one or several real targets per row (the model's loss is "mse", a
sample's loss the mean squared error over its outputs, PyTorch's ``MSELoss``).""",
    """n_features_in_ : int
    Features per row seen by fit.
feature_names_in_ : ndarray of str
    Column names of a DataFrame X (only then).
model_ : dptrain model
    The trained dptrain model.
n_iter_ : int
    Epochs run since the model was built.
loss_curve_ : list of float
    The mean training loss of every epoch.
history_ : list of dict
    dptrain's per-epoch records.
recoveries_ : list of dict
    The workers an elastic fit lost and recovered from (engine_options=dict(elastic=True)).""",
)
