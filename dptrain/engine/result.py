"""What a run returns (``TrainResult``) and writes: the trained model, the per-epoch history,
where the time went, the JSON result and the files the options ask for; and the lines it
prints about them (``epoch_line``, ``breakdown_line``, ``straggler_line``)."""

from __future__ import annotations

import json
import os
import platform
import time

from .._files import write_text_atomically
from ..comm import placement
from ..comm.placement import AUTO
from ..measure import timing
from ..models import Model, model_from_spec
from .local import AUTO_START

NOT_IN_JSON = ("params", "step_times", "_model", "optimizer_state")  # arrays and objects


class TrainResult(dict):
    """What a run returns: a dict (the JSON result's keys, plus ``params`` and
    ``step_times``) with attributes for what a user reaches for first:

    - ``model``: the trained model (predict, evaluate, save);
    - ``history``: one dict per epoch (train_loss, train_accuracy, test_loss, test_accuracy,
      seconds);
    - ``breakdown``: where the time went (phases per rank, step percentiles, collectives);
    - ``step_times``: every step of every rank (``dptrain.measure.timing.StepTimes``);
    - ``config``: the options as run; ``to_json()``;
    - ``optimizer_state``: the optimizer's state_dict at the end, for ``fit`` to continue.
    """

    @property
    def model(self) -> Model | None:
        """The trained model (rank 0; None on other MPI ranks)."""
        return self.get("_model")

    @property
    def history(self) -> list:
        """One dict per epoch."""
        return self.get("epochs", [])

    @property
    def breakdown(self) -> dict:
        """Where the time went (see dptrain.measure.timing)."""
        return self.get("breakdown", {})

    @property
    def step_times(self):
        """Every step of every rank: a dptrain.measure.timing.StepTimes."""
        return self.get("step_times")

    @property
    def config(self) -> dict:
        """The options as run."""
        return self.get("config", {})

    @property
    def optimizer_state(self) -> dict | None:
        """The optimizer's state at the end (its step count; Adam's second moment): what
        ``dptrain.fit(..., optimizer_state=...)`` continues, with the model's velocity."""
        return self.get("optimizer_state")

    def to_json(self, path=None) -> str:
        """The JSON result (without the parameters and the step table); written to path
        when given."""
        text = (
            json.dumps(
                {k: v for k, v in self.items() if k not in NOT_IN_JSON},
                indent=2,
            )
            + "\n"
        )
        if path is not None:
            write_text_atomically(path, text)
        return text


def make_result(
    job,
    config: dict,
    ds,
    per_rank: list,
    steal,
    data_load_seconds: float,
    wall0: float,
    model_obj,
    say,
    recoveries=None,
) -> TrainResult:
    """The run's TrainResult from its workers' returns (``per_rank``, rank 0's first: its
    history and final parameters): the trained model (``model_obj``, the user's, updated in
    place; else the named model built from the spec on the trained parameters), where the
    time went, and the files the options ask for (JSON, weights, trace, step table).
    recoveries: an elastic run's (``engine.elastic``), or None; the breakdown then covers the
    steps since the last one (on its workers)."""
    from .. import __version__, build_info

    cfg, spec, head = job.config, job.model, per_rank[0]
    history = head["history"]
    if model_obj is not None:
        model_obj.params[:] = head["params"]
        model_obj.velocity[:] = head["velocity"]
        model_obj.step += head["steps"]  # dropout's count: the next fit draws new masks
        net = model_obj
    else:
        net = model_from_spec(spec, threads=cfg.threads, params=head["params"].copy())
        net.velocity[:] = head["velocity"]
    net.state[:] = head["bn_state"]  # batch norms' running statistics (empty without one)
    if cfg.save_weights:
        net.save(cfg.save_weights)
    n, train_seconds, steps = ds.n_train, head["train_seconds"], head["steps"]
    step_times = timing.StepTimes(
        [r["stamps"] for r in per_rank],
        [r["calls"] for r in per_rank],
        [r["bytes_sent"] for r in per_rank],
        meta={k: config[k] for k in ("model", "dataset", "workers", "backend", "batch_size")},
    )
    local = head.get("local_sgd")
    if local is not None:  # the trace names the period and sync_every auto's every choice
        step_times.meta["local_sgd"] = local
    if recoveries:
        step_times.meta["elastic"] = recoveries
    breakdown = step_times.summary()
    timer_cost = timing.timer_cost_seconds(5000)
    breakdown["timer_seconds_per_step"] = timer_cost
    breakdown["timer_fraction"] = (
        timer_cost / breakdown["step_seconds"]["mean"]
        if breakdown["step_seconds"]["mean"] > 0
        else None
    )
    breakdown["steal_fraction"] = steal
    breakdown["param_bytes"] = net.n_params * net.dtype.itemsize
    breakdown["rank_train_seconds"] = [r["train_seconds"] for r in per_rank]
    if recoveries is not None:  # an elastic run: its lost workers, and what each one cost
        breakdown["elastic"] = {
            "recoveries": len(recoveries),
            "final_workers": len(per_rank),
            "recovery_seconds": [e["recovery_seconds"] for e in recoveries],
            "steps_in_breakdown": len(head["stamps"]),
        }
    result = TrainResult(
        {
            "dptrain_version": __version__,
            "config": config,
            "dataset": {
                "name": ds.name,
                "source": ds.source,
                "integrity": ds.integrity,
                "synthetic": ds.name.startswith("synthetic"),
                "n_train": n,
                "n_test": ds.n_test,
                "n_features": ds.n_features,
                "n_classes": ds.n_classes,
                "task": ds.task,
            },
            "model": {
                "kind": spec["kind"],
                "sizes": list(net.sizes),
                "n_params": net.n_params,
                "dtype": cfg.dtype,
                "loss": net.loss,
            },
            "epochs": history,
            "train_loss": [h["train_loss"] for h in history],
            "test_accuracy": [h["test_accuracy"] for h in history],
            "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
            "final_test_loss": history[-1]["test_loss"] if history else None,
            "steps": steps,
            "samples": n * len(history),
            "train_seconds": train_seconds,
            "eval_seconds": head["eval_seconds"],
            "data_load_seconds": data_load_seconds,
            "phase_seconds": breakdown["phase_seconds"],
            "rank_phase_seconds": breakdown["rank_phase_seconds"],
            "breakdown": breakdown,
            "steps_per_second": steps / train_seconds if train_seconds > 0 else None,
            "samples_per_second": n * len(history) / train_seconds if train_seconds > 0 else None,
            "build": build_info(),
            "host": {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
            "job": {"model": spec, "warmup_steps": job.warmup_steps},
            "placement": placement.summary([r.get("placement") for r in per_rank]),
            # the gradient exchange and update the run took (engine.exchange's class)
            "exchange": head.get("exchange"),
            # local SGD's replicas, period, averages and sync_every auto's choices (None:
            # synchronous SGD)
            "local_sgd": local,
            # clip_norm's record: how often it clipped, the norms' median and maximum
            "grad_clip": head.get("grad_clip"),
            # an elastic run's recoveries (engine.elastic), else None
            "elastic": recoveries,
        }
    )
    result["wall_seconds"] = time.perf_counter() - wall0
    if cfg.out:
        result.to_json(cfg.out)
        say(f"wrote {cfg.out}")
    if recoveries:
        say(elastic_line(recoveries, len(head["stamps"])))
    say(breakdown_line(breakdown))
    line = straggler_line(breakdown, "average" if local is not None else "step")
    if line:
        say(line)
    if local is not None:
        say(local_line(local, steps))
    if result["grad_clip"] is not None:
        say(clip_line(result["grad_clip"]))
    say(placement.summary_line(result["placement"]))
    if cfg.trace:
        step_times.chrome_trace(cfg.trace)
        say(f"wrote {cfg.trace} (open it in https://ui.perfetto.dev)")
    if cfg.steps_csv:
        step_times.to_csv(cfg.steps_csv)
        say(f"wrote {cfg.steps_csv}")
    result["params"] = head["params"]  # not in the JSON: the trained parameters
    result["step_times"] = step_times  # not in the JSON: every step of every rank
    result["_model"] = net  # not in the JSON: the trained model
    result["optimizer_state"] = head["optimizer_state"]  # not in the JSON: for fit to continue
    return result


def breakdown_line(b: dict) -> str:
    """One line: each phase's share of the training time (mean over ranks), step p50/p99."""
    total = sum(b["phase_seconds"].values()) or 1.0
    shares = "  ".join(
        f"{k} {100 * v / total:.0f}%"
        for k, v in b["phase_seconds"].items()
        if v or k != "average"  # local SGD's phase: said where there were averages
    )
    st = b["step_seconds"]
    return f"time per step: p50 {1e3 * st['p50']:.2f} ms, p99 {1e3 * st['p99']:.2f} ms; {shares}"


def clip_line(clip: dict) -> str:
    """One line: how often the gradient was clipped, and its norms (rank 0's record)."""
    share = clip["clipped_steps"] / clip["steps"] if clip["steps"] else 0.0
    return (
        f"gradient clipping at norm {clip['max_norm']:g}: {clip['clipped_steps']} of "
        f"{clip['steps']} steps clipped ({100 * share:.0f} %); the norm's median "
        f"{clip['norm_median']:.3g}, maximum {clip['norm_max']:.3g}"
    )


def local_line(local: dict, steps: int) -> str:
    """One line: local SGD's replicas, period and averages (sync_every auto: its choices)."""
    period = local["sync_every"]
    if period == AUTO:
        path = [AUTO_START, *(c["sync_every"] for c in local["choices"])]
        period = "auto (" + " -> ".join(str(p) for p in path) + ")"
    each = 1e3 * local["average_seconds"] / local["averages"] if local["averages"] else 0.0
    return (
        f"local SGD: {local['replicas']} replicas, an average every {period} steps"
        + (f" after {local['local_after']} synchronous epoch(s)" if local["local_after"] else "")
        + f": {local['averages']} averages in {steps} steps, {each:.2f} ms each"
    )


# random jitter's cost gets its own line from this share of the step on (below it, the
# breakdown line's sync_wait share says enough)
NOTABLE_WAIT_SHARE = 0.05


def elastic_line(recoveries: list, steps: int) -> str:
    """One line: an elastic run's lost workers, what each cost, and what the breakdown after
    it covers (the steps since the last recovery)."""
    parts = []
    for e in recoveries:
        ranks = ", ".join(str(x["rank"]) for x in e["lost"])
        cost = e["recovery_seconds"]
        parts.append(
            f"rank {ranks} at step {e['step']} ({e['world'][0]} -> {e['world'][1]} workers"
            + (f", the step redone {cost:.2f} s after it began)" if cost else ")")
        )
    return f"elastic: lost {'; '.join(parts)}; the times below cover the {steps} steps since"


def straggler_line(b: dict, step: str = "step") -> str | None:
    """The line about the last arrivals at the collectives: a persistent straggler, named
    with what waiting for it cost the others; random jitter, where its cost is a notable share
    of the step (NOTABLE_WAIT_SHARE); else None. step: what a step with a collective is
    ("average": local SGD's steps that end in one; the others have none)."""
    s = b.get("stragglers") or {}
    if s.get("pattern") == "persistent":
        r = s["straggler"]
        return (
            f"rank {r} arrived last at {100 * s['last_share'][r]:.0f} % of the {step}s: the "
            f"others waited {1e3 * s['rank_cost_seconds_per_step'][r]:.1f} ms per {step} for it "
            f"({100 * s['rank_cost_share'][r]:.0f} % of the step)"
        )
    if s.get("pattern") == "random" and s["wait_share"] >= NOTABLE_WAIT_SHARE:
        shares = ", ".join(f"{100 * x:.0f}" for x in s["last_share"])
        return (
            f"the last arrival at the collectives is random jitter (last at {shares} % of the "
            f"{step}s, by rank): the others waited {1e3 * s['wait_seconds_per_step']:.2f} ms per "
            f"{step} for the last ({100 * s['wait_share']:.0f} % of the step)"
        )
    return None


def epoch_line(rec: dict, epochs: int, n: int) -> str:
    """One line per epoch: losses, accuracy, time, throughput and the ETA."""
    from ..measure.progress import format_seconds

    left = epochs - rec["epoch"]
    eta = f", eta {format_seconds(left * rec['seconds'])}" if left else ""
    test = f"test loss {rec['test_loss']:.4f}  " if rec["test_loss"] is not None else ""
    if rec["test_accuracy"] is not None:  # None: a regression
        test += f"test acc {100 * rec['test_accuracy']:.2f}%  "
    return (
        f"epoch {rec['epoch']}/{epochs}  train loss {rec['train_loss']:.4f}  {test}"
        f"({rec['seconds']:.2f} s, {n / rec['seconds']:,.0f} samples/s{eta})"
    )
