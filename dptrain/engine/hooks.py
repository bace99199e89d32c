"""What wraps a worker's training loop from outside (``Hooks``): nothing by default, or
injected faults and stragglers (``Injection``), to study failures and synchronization."""

from __future__ import annotations

import os
import time

import numpy as np

from ..config import TrainConfig


class Hooks:
    """What wraps the loop from outside; the default does nothing."""

    def step_start(self, rank: int, step: int) -> None:
        """Called before each step."""

    def computed(self, rank: int) -> None:
        """Called when a step's compute is done, before its exchange."""


class Injection(Hooks):
    """Faults and stragglers, to study failures and synchronization: worker `fault[0]` fails
    at step `fault[1]` (raise, or SIGKILL itself); worker `straggle[0]` computes `straggle[1]`
    ms longer every step; every worker computes U(0, straggle_random_ms) ms longer (seeded).
    The delays are sleeps: the core stays free."""

    def __init__(self, config: TrainConfig, rank: int):
        self.fault = config.fault
        self.fixed = (
            config.straggle[1] / 1e3 if config.straggle and config.straggle[0] == rank else 0.0
        )
        self.spread = config.straggle_random_ms / 1e3
        self.rng = np.random.default_rng([config.seed, rank, 0x57A6])

    def step_start(self, rank, step):
        if self.fault and self.fault[0] == rank and self.fault[1] == step:
            if self.fault[2] == "kill":
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")

    def computed(self, rank):
        delay = self.fixed + (self.rng.uniform(0.0, self.spread) if self.spread else 0.0)
        if delay:
            time.sleep(delay)


def hooks_for(config: TrainConfig, rank: int) -> Hooks:
    """The hooks a config asks for (none unless faults or stragglers are injected)."""
    if config.fault or config.straggle or config.straggle_random_ms:
        return Injection(config, rank)
    return Hooks()
