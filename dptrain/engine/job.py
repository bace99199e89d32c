"""A run's job: everything a worker needs besides the data, settled once in the launching
process (``Job.plan``) and handed to every worker as it is (plain values: it pickles for the
'spawn' start method)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..config import TrainConfig
from ..sampler import steps_per_epoch


@dataclass(frozen=True)
class Job:
    """Everything a worker needs besides the data: plain values, so it pickles for 'spawn'.

    config: the run's options, as validated once; model: the model's spec (``Model.spec()``);
    what depends on the number of workers, settled once (``Job.plan``): ``world``,
    ``batch_size`` (the global batch), ``lr`` (the peak learning rate), ``warmup_steps``.
    ``coupled=False``: one of the uncoupled workers that measure the contention ceiling (a
    1-worker run on its own data: no deterministic chunks, checkpoints or resume). ``data``:
    the data set's identity (``checkpoint.data_identity``), among the resume keys.
    ``checkpoint_steps``: steps between checkpoints (config's checkpoint_every; with a
    checkpoint path and no interval, one epoch's steps: a checkpoint named is written).
    ``replicas``: local SGD's replicas (config's replicas, else one per worker); 0: none.
    ``restore``: where an elastic run goes on after a lost worker (engine.elastic)."""

    config: TrainConfig
    model: dict
    world: int
    batch_size: int
    lr: float
    warmup_steps: int = 0
    coupled: bool = True
    data: dict = field(default_factory=dict)
    checkpoint_steps: int = 0
    replicas: int = 0
    # an elastic run going on after a lost worker: loop.POSITION's values, "epoch_seconds"
    # and "history" (the arrays travel as the launch's INIT_ extras); None: a run's start
    restore: dict | None = field(default=None, compare=False, repr=False)

    @classmethod
    def plan(
        cls, config: TrainConfig, model: dict, world: int, n_train: int, data: dict | None = None
    ) -> "Job":
        """The job of a run of `config` on `world` workers over n_train samples (of the data
        set whose identity is `data`)."""
        batch = config.global_batch(world)
        per_epoch = steps_per_epoch(n_train, batch)
        steps = per_epoch * config.epochs
        if config.fault is not None and config.fault[1] > steps:  # at `steps`: the run's end
            raise ValueError(
                f"fault is at step {config.fault[1]}, but the run has {steps} steps "
                f"(0..{steps - 1}, and {steps}: its end): it would never happen"
            )
        if config.augmentation is not None:
            shape = tuple(model.get("input_shape") or ())
            pad = config.augmentation[0]
            if len(shape) != 3:
                raise ValueError(
                    f"augment={config.augment!r} needs images, a model whose input is (C, H, W) "
                    f"(e.g. --model cnn); this model's input is {shape}"
                )
            if pad >= min(shape[1:]):
                raise ValueError(
                    f"augment={config.augment!r}: a crop padding of {pad} pixels is not smaller "
                    f"than the {shape[1]} x {shape[2]} images"
                )
        return cls(
            config=config,
            model=model,
            world=world,
            batch_size=batch,
            lr=config.peak_lr(world),
            warmup_steps=int(round(config.warmup_epochs * per_epoch)),
            data=dict(data or {}),
            checkpoint_steps=config.checkpoint_every or (per_epoch if config.checkpoint else 0),
            replicas=(config.replicas or world) if config.local else 0,
        )

    def uncoupled(self) -> "Job":
        """One of `world` uncoupled workers: a 1-worker run with 1/world of the batch (the
        same number of steps over its 1/world of the data)."""
        return replace(self, world=1, batch_size=-(-self.batch_size // self.world), coupled=False)

    @property
    def deterministic(self) -> bool:
        return self.coupled and self.config.deterministic

    @property
    def local(self) -> bool:
        """Local SGD: ``replicas`` replicas that average their parameters (config's
        sync_every), K / world on each worker."""
        return self.coupled and self.replicas > 0

    @property
    def checkpoint_every(self) -> int:
        return self.checkpoint_steps if self.coupled else 0

    @property
    def resume(self) -> str | None:
        return self.config.resume if self.coupled else None
