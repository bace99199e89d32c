"""The optimizers on a model's flat buffers, one C kernel call per step each.

SGD (momentum, Nesterov, weight decay), torch.optim.SGD's semantics: d = g + wd * p;
v = momentum * v + (1 - dampening) * d (v = d on the first step); d = d + momentum * v if
nesterov else v; p -= lr * d.

Adam and AdamW, torch.optim.Adam's / AdamW's (t the step, from 1): g = g + wd * p (Adam) or
p = p * (1 - lr * wd) (AdamW); m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
with amsgrad v is replaced by vmax = max(vmax, v); p -= lr / (1 - b1^t) * m /
(sqrt(v) / sqrt(1 - b2^t) + eps).

RMSprop, torch.optim.RMSprop's: g = g + wd * p; sq = alpha * sq + (1 - alpha) * g * g;
centered: gavg = alpha-average of g, avg = sqrt(sq - gavg^2) + eps, else avg = sqrt(sq) + eps;
momentum: buf = momentum * buf + g / avg, p -= lr * buf; else p -= lr * g / avg.

The first moment of every optimizer (SGD's momentum, Adam's m, RMSprop's buffer) is
``model.velocity``: the
buffer that every transport already allocates, broadcasts and checkpoints; Adam's second
moment (and maximum) are its own buffers. ``state_dict()`` / ``load_state_dict()`` hold the
step count and those own buffers (the model's save holds velocity).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import _core
from ._aligned import aligned_zeros

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "OPTIMIZERS",
    "make_optimizer",
    "SCHEDULES",
    "lr_at",
]

SCHEDULES = ("constant", "cosine", "step", "exponential", "onecycle")
ONECYCLE = {"pct_start": 0.3, "div_factor": 25.0, "final_div_factor": 1e4}  # torch's defaults


def lr_at(
    step: int,
    total_steps: int,
    base_lr: float,
    schedule: str = "constant",
    warmup_steps: int = 0,
    *,
    steps_per_epoch: int | None = None,
    gamma: float | None = None,
    step_epochs: int | None = None,
) -> float:
    """Learning rate of step `step` (0-based) out of `total_steps`.

    constant: base_lr. cosine: base_lr * (1 + cos(pi * step / total_steps)) / 2, decaying to 0
    at the end (Loshchilov & Hutter, SGDR). step: base_lr * gamma ** (epoch // step_epochs),
    torch's StepLR stepped once an epoch (epoch = step // steps_per_epoch). exponential:
    base_lr * gamma ** epoch, torch's ExponentialLR stepped once an epoch. onecycle: torch's
    OneCycleLR (Smith & Topin, 2019) over total_steps with its defaults (ONECYCLE): from
    base_lr / 25 up to base_lr over the first 30 % of the steps, then down to base_lr / 25 /
    1e4, both halves cosine (the learning rate only: torch also cycles the momentum unless
    cycle_momentum=False). warmup_steps > 0 ramps linearly from base_lr / warmup_steps up to
    base_lr first (Goyal et al., 2017), then cosine runs over the remaining steps, and step
    and exponential from the epoch where the ramp ends (onecycle has its own).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule is {schedule!r}, expected one of {SCHEDULES}")
    if schedule == "onecycle":
        return _onecycle(step, total_steps, base_lr)
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    if schedule in ("step", "exponential"):
        needs = {"steps_per_epoch": steps_per_epoch, "gamma": gamma}
        if schedule == "step":
            needs["step_epochs"] = step_epochs
        missing = [name for name, v in needs.items() if v is None]
        if missing:
            raise ValueError(f"lr schedule {schedule!r} needs {', '.join(missing)}")
        per_epoch = max(int(steps_per_epoch), 1)
        epoch = step // per_epoch - warmup_steps // per_epoch
        decays = epoch // step_epochs if schedule == "step" else epoch
        return base_lr * gamma**decays
    span = max(total_steps - warmup_steps, 1)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(step - warmup_steps, span) / span))


def _onecycle(step: int, total_steps: int, max_lr: float) -> float:
    """torch.optim.lr_scheduler.OneCycleLR's rate at step `step` (two phases, cosine)."""
    initial = max_lr / ONECYCLE["div_factor"]
    final = initial / ONECYCLE["final_div_factor"]
    up_end = float(ONECYCLE["pct_start"] * total_steps) - 1
    down_end = float(total_steps - 1)

    def cos(start, end, pct):
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    if step <= up_end:
        return cos(initial, max_lr, step / up_end) if up_end > 0 else max_lr
    span = down_end - up_end
    return cos(max_lr, final, (step - up_end) / span) if span > 0 else final


def _check_nonnegative(**values) -> None:
    """ValueError naming the first value that is not a finite real number >= 0."""
    for name, v in values.items():
        if (
            isinstance(v, bool)
            or not isinstance(v, numbers.Real)
            or not (float(v) >= 0.0)
            or float(v) == float("inf")
        ):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def _check_state(state, own: dict) -> int:
    """The steps of a state_dict for an optimizer whose own arrays are `own` (name: array),
    after checking that it holds exactly those, of their dtype and shape; ValueError naming
    what is wrong."""
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict (from state_dict()), got {type(state).__name__}")
    want = {"steps", *own}
    if set(state) != want:
        raise ValueError(
            f"state holds {sorted(state)}, expected {sorted(want)} (another optimizer's?)"
        )
    steps = state["steps"]
    if isinstance(steps, (bool, float)) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"state['steps'] must be an integer >= 0, got {steps!r}")
    for name, arr in own.items():
        got = np.asarray(state[name])
        if got.shape != arr.shape or got.dtype != arr.dtype:
            raise ValueError(
                f"state[{name!r}] has dtype {got.dtype} and shape {got.shape}, expected "
                f"{arr.dtype} and {arr.shape}"
            )
    return int(steps)


def _part_views(part, *arrays):
    """The arrays (None stays None) whole where part is None, else their [lo, hi) views."""
    if part is None:
        return arrays
    lo, hi = part
    return tuple(None if a is None else a[lo:hi] for a in arrays)


class _Optimizer:
    """What every optimizer here shares: its hyper-parameters by name (HYPER) and its state
    (the step count and the arrays of its own, ``_own()``; model.velocity is the model's)."""

    HYPER: tuple = ()

    def config(self) -> dict:
        """The hyper-parameters as a dict."""
        return {name: getattr(self, name) for name in self.HYPER}

    def _own(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """{"steps": int, plus each array of the optimizer's own by name (copies)}: the state
        besides model.velocity, which the model's buffers hold (and checkpoints save)."""
        return {"steps": self.steps, **{k: a.copy() for k, a in self._own().items()}}

    def _fresh_views(self, part, grads, *own):
        """(ctx, params, grads, velocity, *own) for a step of an optimizer whose state starts
        at 0: the model's threads (see SGD.step), the buffers' ``part`` views, and, on the
        first step, velocity and the own buffers zeroed (velocity may hold SGD's)."""
        m = self.model
        ctx = getattr(m, "context", None)
        views = _part_views(part, m.params, m.grads if grads is None else grads, m.velocity, *own)
        if self.steps == 0:
            for buf in views[2:]:
                if buf is not None:
                    _core.zero_(buf, ctx=ctx)
        return (ctx, *views)

    def load_state_dict(self, state: dict) -> None:
        """Continues from a state_dict() of an optimizer of this kind and size (model.velocity
        is restored with the model)."""
        own = self._own()
        steps = _check_state(state, own)
        for name, arr in own.items():
            arr[:] = state[name]
        self.steps = steps


class SGD(_Optimizer):
    """Stochastic gradient descent on a model's flat buffers, one C kernel call per step.

    ``SGD(model, lr, momentum=0.9, dampening=0, weight_decay=0, nesterov=False)``;
    ``step()`` updates ``model.params`` from ``model.grads`` and keeps the momentum in
    ``model.velocity``, with torch.optim.SGD's semantics (see the module docstring), split over
    the threads of ``model.context`` where the model has one. Bad hyper-parameters raise
    ValueError naming the value (see ``check``).
    """

    HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(
        self,
        model,
        lr: float,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        self.check(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
        self.model = model
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self.steps = 0

    @staticmethod
    def check(*, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False) -> None:
        """Raises ValueError naming the first hyper-parameter that SGD cannot use."""
        _check_nonnegative(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        if momentum >= 1:
            raise ValueError(
                f"momentum must be in [0, 1), got {momentum!r}: with momentum >= 1 "
                f"the velocity never decays and training diverges"
            )
        if dampening > 1:
            raise ValueError(f"dampening must be in [0, 1], got {dampening!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"nesterov needs momentum > 0 and dampening == 0, got "
                f"momentum={momentum}, dampening={dampening}"
            )

    def step(self, lr: float | None = None, grads=None, part=None) -> None:
        """One update of model.params from model.grads (or ``grads``, a buffer of the same
        layout); lr overrides the default, e.g. for a schedule. part=(lo, hi): only those
        elements (of the parameters, the gradient and the state), the others untouched, with
        the bits the whole step gives them (the update is elementwise)."""
        m = self.model
        params, grads, velocity = _part_views(
            part, m.params, m.grads if grads is None else grads, m.velocity
        )
        # the threads that computed the gradient share the step: the model's `context` (what
        # _core.sgd_step takes as ctx: a dptrain model's C engine), None where it has none
        _core.sgd_step(
            params,
            grads,
            velocity,
            lr=self.lr if lr is None else float(lr),
            momentum=self.momentum,
            dampening=self.dampening,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            first_step=self.steps == 0,
            ctx=getattr(m, "context", None),
        )
        self.steps += 1


class Adam(_Optimizer):
    """Adam (Kingma & Ba, 2015) on a model's flat buffers, one C kernel call per step.

    ``Adam(model, lr=1e-3, *, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
    amsgrad=False)``, as torch.optim.Adam (weight_decay is an L2 term added to the
    gradient; see the module docstring). ``step()`` updates ``model.params`` from
    ``model.grads``; the first moment is ``model.velocity``, the second moment
    ``exp_avg_sq`` (and its running maximum ``max_exp_avg_sq`` with amsgrad) are this
    optimizer's. The first step starts every moment from 0, as a new torch optimizer does.
    Split over the threads of ``model.context`` where the model has one. Bad
    hyper-parameters raise ValueError naming the value (see ``check``).
    """

    HYPER = ("lr", "betas", "eps", "weight_decay", "amsgrad")
    decoupled = False  # AdamW: the weight decay shrinks the parameters instead

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        *,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        self.check(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        self.model = model
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.amsgrad = bool(amsgrad)
        n, dtype = len(model.params), model.params.dtype
        self.exp_avg_sq = aligned_zeros(n, dtype)
        self.max_exp_avg_sq = aligned_zeros(n, dtype) if self.amsgrad else None
        self.steps = 0

    @staticmethod
    def check(*, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False) -> None:
        """Raises ValueError naming the first hyper-parameter that Adam cannot use."""
        _check_nonnegative(lr=lr, eps=eps, weight_decay=weight_decay)
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for i, b in enumerate(betas):
            if (
                isinstance(b, bool)
                or not isinstance(b, numbers.Real)
                or not (0.0 <= float(b) < 1.0)
            ):
                raise ValueError(f"betas[{i}] must be a number in [0, 1), got {b!r}")
        if not isinstance(amsgrad, (bool, np.bool_)):
            raise ValueError(f"amsgrad must be True or False, got {amsgrad!r}")

    def step(self, lr: float | None = None, grads=None, part=None) -> None:
        """One update of model.params from model.grads (or ``grads``, a buffer of the same
        layout); lr overrides the default, e.g. for a schedule. part=(lo, hi): only those
        elements, as SGD.step."""
        ctx, params, grads, velocity, sq, sq_max = self._fresh_views(
            part, grads, self.exp_avg_sq, self.max_exp_avg_sq
        )
        _core.adam_step(
            params,
            grads,
            velocity,
            sq,
            sq_max,
            step=self.steps + 1,
            lr=self.lr if lr is None else float(lr),
            beta1=self.betas[0],
            beta2=self.betas[1],
            eps=self.eps,
            weight_decay=self.weight_decay,
            amsgrad=self.amsgrad,
            decoupled=self.decoupled,
            ctx=ctx,
        )
        self.steps += 1

    def _own(self) -> dict:
        own = {"exp_avg_sq": self.exp_avg_sq}
        if self.amsgrad:
            own["max_exp_avg_sq"] = self.max_exp_avg_sq
        return own


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter, 2019): Adam whose weight decay multiplies the parameters
    by 1 - lr * weight_decay before the update instead of adding to the gradient;
    ``AdamW(model, lr=1e-3, *, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
    amsgrad=False)``, as torch.optim.AdamW."""

    decoupled = True

    def __init__(self, model, lr: float = 1e-3, *, weight_decay: float = 1e-2, **options):
        # only the default differs (PyTorch's AdamW decays by default); options: Adam's
        super().__init__(model, lr, weight_decay=weight_decay, **options)


class RMSprop(_Optimizer):
    """RMSprop (Hinton, lecture 6e) on a model's flat buffers, one C kernel call per step.

    ``RMSprop(model, lr=1e-2, *, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
    centered=False)``, as torch.optim.RMSprop (see the module docstring). The moving average
    of the squared gradient is ``square_avg``, the gradient's (centered) ``grad_avg``, both
    this optimizer's; the momentum buffer is ``model.velocity``. Split over the threads of
    ``model.context`` where the model has one. Bad hyper-parameters raise ValueError naming
    the value (see ``check``).
    """

    HYPER = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")

    def __init__(
        self,
        model,
        lr: float = 1e-2,
        *,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ):
        self.check(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
        )
        self.model = model
        self.lr, self.alpha, self.eps = float(lr), float(alpha), float(eps)
        self.weight_decay, self.momentum = float(weight_decay), float(momentum)
        self.centered = bool(centered)
        n, dtype = len(model.params), model.params.dtype
        self.square_avg = aligned_zeros(n, dtype)
        self.grad_avg = aligned_zeros(n, dtype) if self.centered else None
        self.steps = 0

    @staticmethod
    def check(*, lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
        """Raises ValueError naming the first hyper-parameter that RMSprop cannot use."""
        _check_nonnegative(
            lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum
        )
        if alpha >= 1:
            raise ValueError(
                f"alpha must be in [0, 1), got {alpha!r}: at 1 the average of squared "
                f"gradients never moves from 0, and every step is the gradient / eps"
            )
        if eps == 0:
            raise ValueError(
                "eps must be > 0, got 0: a parameter whose gradient is 0 would take 0 / 0"
            )
        if momentum >= 1:
            raise ValueError(
                f"momentum must be in [0, 1), got {momentum!r}: with momentum >= 1 the "
                f"buffer never decays and training diverges"
            )
        if not isinstance(centered, (bool, np.bool_)):
            raise ValueError(f"centered must be True or False, got {centered!r}")

    def step(self, lr: float | None = None, grads=None, part=None) -> None:
        """One update of model.params from model.grads (or ``grads``); lr overrides the
        default; part=(lo, hi): only those elements, as SGD.step."""
        ctx, params, grads, velocity, sq, gavg = self._fresh_views(
            part, grads, self.square_avg, self.grad_avg
        )
        _core.rmsprop_step(
            params,
            grads,
            sq,
            gavg,
            velocity if self.momentum > 0 else None,
            lr=self.lr if lr is None else float(lr),
            alpha=self.alpha,
            eps=self.eps,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            centered=self.centered,
            ctx=ctx,
        )
        self.steps += 1

    def _own(self) -> dict:
        own = {"square_avg": self.square_avg}
        if self.centered:
            own["grad_avg"] = self.grad_avg
        return own


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}


def make_optimizer(model, lr: float, config):
    """The optimizer that a TrainConfig names (``config.optimizer``) on model, at the learning
    rate lr (the run's peak rate; the schedule passes each step's to step())."""
    if config.optimizer == "sgd":
        return SGD(
            model,
            lr,
            momentum=config.momentum,
            dampening=config.dampening,
            weight_decay=config.weight_decay,
            nesterov=config.nesterov,
        )
    if config.optimizer == "rmsprop":
        return RMSprop(
            model,
            lr,
            alpha=config.rms_alpha,
            eps=config.eps,
            weight_decay=config.weight_decay,
            momentum=config.momentum,
            centered=config.centered,
        )
    return OPTIMIZERS[config.optimizer](
        model, lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
    )
