"""SGD with momentum, Nesterov and weight decay on a model's flat buffers (one C kernel call).

Semantics are torch.optim.SGD's: d = g + wd * p; v = momentum * v + (1 - dampening) * d
(v = d on the first step); d = d + momentum * v if nesterov else v; p -= lr * d.
"""

from __future__ import annotations

import math
import numbers

from . import _core

__all__ = ["SGD", "SCHEDULES", "lr_at"]

SCHEDULES = ("constant", "cosine")


def lr_at(
    step: int, total_steps: int, base_lr: float, schedule: str = "constant", warmup_steps: int = 0
) -> float:
    """Learning rate of step `step` (0-based) out of `total_steps`.

    constant: base_lr. cosine: base_lr * (1 + cos(pi * step / total_steps)) / 2, decaying to 0
    at the end (Loshchilov & Hutter, SGDR). warmup_steps > 0 ramps linearly from
    base_lr / warmup_steps up to base_lr first (Goyal et al., 2017), then the schedule runs
    over the remaining steps.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule is {schedule!r}, expected one of {SCHEDULES}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(total_steps - warmup_steps, 1)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(step - warmup_steps, span) / span))


class SGD:
    """Stochastic gradient descent on a model's flat buffers, one C kernel call per step.

    ``SGD(model, lr, momentum=0.9, dampening=0, weight_decay=0, nesterov=False)``;
    ``step()`` updates ``model.params`` from ``model.grads`` and keeps the momentum in
    ``model.velocity``, with torch.optim.SGD's semantics (see the module docstring), split over
    the threads of ``model.context`` where the model has one. Bad hyper-parameters raise
    ValueError naming the value (see ``check``).
    """

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
        for name, v in (
            ("lr", lr),
            ("momentum", momentum),
            ("dampening", dampening),
            ("weight_decay", weight_decay),
        ):
            if (
                isinstance(v, bool)
                or not isinstance(v, numbers.Real)
                or not (float(v) >= 0.0)
                or float(v) == float("inf")
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
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

    def step(self, lr: float | None = None, grads=None) -> None:
        """One update of model.params from model.grads (or ``grads``, a buffer of the same
        layout); lr overrides the default, e.g. for a schedule."""
        m = self.model
        # the threads that computed the gradient share the step: the model's `context` (what
        # _core.sgd_step takes as ctx: a dptrain model's C engine), None where it has none
        _core.sgd_step(
            m.params,
            m.grads if grads is None else grads,
            m.velocity,
            lr=self.lr if lr is None else float(lr),
            momentum=self.momentum,
            dampening=self.dampening,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            first_step=self.steps == 0,
            ctx=getattr(m, "context", None),
        )
        self.steps += 1

    def config(self) -> dict:
        """The hyper-parameters as a dict."""
        return {
            "lr": self.lr,
            "momentum": self.momentum,
            "dampening": self.dampening,
            "weight_decay": self.weight_decay,
            "nesterov": self.nesterov,
        }
