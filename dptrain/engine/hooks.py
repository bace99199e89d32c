"""What wraps a worker's training loop from outside (``Hooks``): nothing by default, or
injected faults and stragglers (``Injection``), to study failures and synchronization."""

from __future__ import annotations

import os
import time

import numpy as np

from ..config import TrainConfig


class Hooks:
    """What wraps the loop from outside; the default does nothing."""

    def bind(self, comm) -> None:
        """Called once with the worker's communicator, before the first step."""

    def step_start(self, rank: int, step: int) -> None:
        """Called before each step."""

    def computed(self, rank: int) -> None:
        """Called when a step's compute is done, before its exchange."""


class Injection(Hooks):
    """Faults and stragglers, to study failures and synchronization: worker `fault[0]` fails
    at step `fault[1]` (raise; SIGKILL itself; or stop: SIGSTOP itself, or on a thread sleep
    until the run has given up on it); worker `straggle[0]` computes `straggle[1]` ms longer
    every step; every worker computes U(0, straggle_random_ms) ms longer (seeded). The delays
    are sleeps: the core stays free. faults=False: no fault (an elastic run's workers after
    a recovery, which redo the failed step)."""

    def __init__(self, config: TrainConfig, rank: int, faults: bool = True):
        self.fault = config.fault if faults else None
        self.comm = None
        self.fixed = (
            config.straggle[1] / 1e3 if config.straggle and config.straggle[0] == rank else 0.0
        )
        self.spread = config.straggle_random_ms / 1e3
        self.rng = np.random.default_rng([config.seed, rank, 0x57A6])

    def bind(self, comm):
        self.comm = comm

    def step_start(self, rank, step):
        if self.fault and self.fault[0] == rank and self.fault[1] == step:
            import signal

            if self.fault[2] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault[2] == "stop":
                if self.comm is None or self.comm.backend != "thread":
                    os.kill(os.getpid(), signal.SIGSTOP)  # until killed (or SIGCONT)
                else:  # a thread cannot be stopped alone: it sleeps until the others give up
                    while not self.comm.aborted:
                        time.sleep(0.01)
                return
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")

    def computed(self, rank):
        delay = self.fixed + (self.rng.uniform(0.0, self.spread) if self.spread else 0.0)
        if delay:
            time.sleep(delay)


def hooks_for(config: TrainConfig, rank: int, faults: bool = True) -> Hooks:
    """The hooks a config asks for (none unless faults or stragglers are injected; faults:
    see Injection)."""
    if config.fault and faults or config.straggle or config.straggle_random_ms:
        return Injection(config, rank, faults)
    return Hooks()
