"""Where every step's time goes, on every rank: the step timer, its tables, its trace.

Each worker's training loop stamps every step with ``time.perf_counter`` (the monotonic
clock, shared by every process of one machine) at its phase boundaries and asks its
communicator how long its collectives waited at their entry for the slowest worker:

    start ─data─ b ─compute─ c ─sync_wait─ (c + w) ─communication─ d ─update─ e ─other─ end

- data: the batch's rows gathered; compute: forward + loss + backward;
- sync_wait: the part of the gradient exchange spent waiting for the other workers to arrive
  (the entry barrier's wait on shared memory, an MPI_Barrier before the collective under MPI),
  communication: the rest of it, the transfer and reduction;
- update: the optimizer step (and the parameter server's broadcast);
- average: local SGD's average of the replicas (``engine.local``), which takes the gradient
  exchange's place: it runs after the update (c ─update─ ─sync_wait─ ─average─ e), its
  entry wait is the step's sync_wait, and a local step without one has neither;
- other: from the end of the update to the start of the next step (loop bookkeeping,
  checkpoints), and for an epoch's last step up to the end of the epoch's closing collective.

A step ends where the next one starts, so the phases of a step add up to its wall time and the
steps of a rank add up to its training time (exactly, by construction). With overlap, the
exchange's wait is hidden inside the communication phase (it runs beside backward).

``StepClock`` is what the exchange strategies mark the boundaries on during a step,
``StepTimer`` what keeps a rank's stamps. ``StepTimes`` holds the stamps of all ranks (ranks
x steps) and turns them into per-step and per-epoch tables, a summary, CSV/JSON, pandas
frames and a Chrome trace. The trace keeps the ranks' real offsets on one machine (one
monotonic clock); ranks whose clocks disagree by more than a second (MPI over machines) are
aligned on their first stamp, where every rank leaves the same barrier.

Stragglers (``StepTimes.stragglers``): the rank that arrived last at a step's gradient
collective is the one that waited least at its entry (everyone else waited for it), so the
stamps name it for every step without another clock reading. Over the run, the ranks' counts
of last arrivals tell a persistent straggler (one rank last far more often than 1/N of the
steps: a slow core, a noisy neighbour, a bigger shard) from random jitter (last arrivals spread
over the ranks), and the others' waits give what the last arrival cost them per step.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from contextlib import contextmanager

import numpy as np

from .._files import write_text_atomically

__all__ = [
    "PHASES",
    "EXCHANGE_PHASES",
    "StepTimer",
    "StepTimes",
    "timer_cost_seconds",
    "read_steal",
    "steal_fraction",
    "binomial_tail",
]

PHASES = ("data", "compute", "communication", "sync_wait", "update", "other", "average")
EXCHANGE_PHASES = ("communication", "sync_wait", "average")  # what the exchange costs a step
# columns of a rank's stamp array; _AVERAGE: 1 where the step's exchange is local SGD's
# average (its seconds then go to the average phase, not to communication)
_START, _DATA, _COMPUTE, _EXCHANGE, _UPDATE, _END, _WAIT, _EPOCH, _AVERAGE = range(9)
_COLUMNS = 9
# a persistent straggler: last this many times as often as the other ranks on average, at
# this significance (StepTimes.stragglers)
STRAGGLER_ODDS = 9
STRAGGLER_ALPHA = 1e-3


class StepTimer:
    """One worker's stamps: ``step(...)`` once per step, ``end(t)`` when the step's time stops
    counting (the next step's start, or the end of the epoch). Appends plain Python lists, so
    that the timer costs a step next to nothing (every run measures it: timer_cost_seconds);
    the array is built once at the end."""

    __slots__ = ("rows", "_open")

    def __init__(self):
        self.rows: list[list] = []
        self._open = None

    def step(self, epoch, t_start, t_data, t_compute, t_exchange, t_update, waited, average=False):
        """Records one step from its phase-boundary clock readings (perf_counter seconds)
        and the seconds waited at its collectives' entry (the sync wait inside the exchange);
        average: the exchange was local SGD's average (recorded in the exchange's place)."""
        if self._open is not None:
            self._open[_END] = t_start
        row = [t_start, t_data, t_compute, t_exchange, t_update, t_update, waited, epoch, average]
        self.rows.append(row)
        self._open = row

    def end(self, t):
        """Closes the open step at t (the epoch's end)."""
        if self._open is not None:
            self._open[_END] = t
            self._open = None

    def array(self) -> np.ndarray:
        """The recorded steps as a (steps, 9) float64 array (the per-rank stamps)."""
        return np.array(self.rows, dtype=np.float64).reshape(-1, _COLUMNS)


def timer_cost_seconds(number: int = 20000) -> float:
    """What the per-step recording costs: the perf_counter calls and the append of one step,
    measured here (seconds per step; the best of 5 batches, so that the host taking the CPU
    away for a moment does not count as the timers' cost)."""
    clock = time.perf_counter
    per_batch = max(1, number // 5)
    best = float("inf")
    for _ in range(5):
        timer = StepTimer()
        t0 = clock()
        for i in range(per_batch):
            a, b, c, d, e = clock(), clock(), clock(), clock(), clock()
            timer.step(0, a, b, c, d, e, 0.0)
        best = min(best, (clock() - t0) / per_batch)
    return best


def read_steal() -> tuple[int, int] | None:
    """(steal ticks, total ticks) of all CPUs from /proc/stat, or None where it is absent."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    return ticks[7], sum(ticks[:8])


def steal_fraction(before, after) -> float | None:
    """The share of CPU time the host took away (steal) between two read_steal() samples."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (exact; no scipy needed)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    i = np.arange(k, n + 1, dtype=np.float64)
    log_terms = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(j + 1) + math.lgamma(n - j + 1) for j in range(k, n + 1)])
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )
    top = log_terms.max()
    return float(min(1.0, math.exp(top) * np.exp(log_terms - top).sum()))


def _stamp_array(s) -> np.ndarray:
    """One rank's stamps as a (steps, 9) array; 8 columns (no _AVERAGE) get a zero one."""
    a = np.asarray(s, dtype=np.float64)
    if a.size == 0:
        return a.reshape(0, _COLUMNS)
    if a.ndim != 2 or a.shape[1] not in (_COLUMNS - 1, _COLUMNS):
        raise ValueError(f"a rank's stamps must be (steps, {_COLUMNS}), got shape {a.shape}")
    if a.shape[1] == _COLUMNS - 1:
        a = np.hstack([a, np.zeros((len(a), 1))])
    return a


class StepTimes:
    """The step stamps of every rank of one run.

    stamps: one (steps, 9) array per rank (StepTimer.array(); the 8 columns of the files
    written before local SGD's average had a phase of its own are read as runs without one);
    calls / bytes_sent: per rank, the collective calls and bytes of the whole run; meta: the
    run's configuration (goes into the trace and the JSON).
    """

    def __init__(self, stamps, calls=None, bytes_sent=None, meta=None):
        stamps = [_stamp_array(s) for s in stamps]
        if not stamps:
            raise ValueError("StepTimes needs the stamps of at least one rank")
        steps = {len(s) for s in stamps}
        if len(steps) != 1:
            raise ValueError(f"every rank must have the same number of steps, got {sorted(steps)}")
        self.stamps = stamps
        self.ranks = len(stamps)
        self.steps = len(stamps[0])
        self.calls = list(calls) if calls is not None else [0] * self.ranks
        self.bytes_sent = list(bytes_sent) if bytes_sent is not None else [0] * self.ranks
        self.meta = dict(meta or {})

    # ------------------------------------------------------------ arrays
    def phases(self) -> np.ndarray:
        """(ranks, steps, len(PHASES)) seconds."""
        out = np.empty((self.ranks, self.steps, len(PHASES)))
        for r, s in enumerate(self.stamps):
            wait = np.clip(s[:, _WAIT], 0.0, s[:, _EXCHANGE] - s[:, _COMPUTE])
            exchange = s[:, _EXCHANGE] - s[:, _COMPUTE] - wait
            average = s[:, _AVERAGE] != 0
            out[r, :, 0] = s[:, _DATA] - s[:, _START]
            out[r, :, 1] = s[:, _COMPUTE] - s[:, _DATA]
            out[r, :, 2] = np.where(average, 0.0, exchange)
            out[r, :, 3] = wait
            out[r, :, 4] = s[:, _UPDATE] - s[:, _EXCHANGE]
            out[r, :, 5] = s[:, _END] - s[:, _UPDATE]
            out[r, :, 6] = np.where(average, exchange, 0.0)
        return out

    def step_seconds(self) -> np.ndarray:
        """(ranks, steps) wall time of each step."""
        return np.stack([s[:, _END] - s[:, _START] for s in self.stamps])

    def epochs(self) -> np.ndarray:
        """The epoch (0-based) of each step."""
        return self.stamps[0][:, _EPOCH].astype(np.int64)

    def last_arrivals(self) -> np.ndarray:
        """(steps,) the rank that arrived last at each step's gradient collective: the one that
        waited least at its entry, since every other rank waited there for it; -1 for a step
        where no rank waited (one rank, or a step without a measured wait: a local step of
        local SGD, an overlapped exchange, whose wait is not measured apart)."""
        if self.ranks < 2 or not self.steps:
            return np.full(self.steps, -1, dtype=np.int64)
        wait = self.phases()[:, :, 3]
        last = wait.argmin(axis=0).astype(np.int64)
        last[~(wait > 0).any(axis=0)] = -1
        return last

    def stragglers(self) -> dict:
        """Who arrived last at the gradient collectives, how often, and what it cost the others.

        In each step with a measured wait the last rank is the one that waited least
        (``last_arrivals``), and the others' wait is the mean of the other ranks' sync_wait in
        that step: what the last arrival cost them. The fields:

        - steps: the steps with a measured wait (the others are left out of all below);
        - last_count, last_share: per rank, in how many / which share of the steps it was last;
        - wait_seconds_per_step: the others' wait, mean over the steps; wait_share: its share of
          the step (over the mean step time of the same steps, mean over ranks);
        - rank_cost_seconds_per_step, rank_cost_share: per rank, the others' wait in the steps
          where it was last, over all the steps: what waiting for that rank cost (they add up
          to wait_seconds_per_step and wait_share);
        - p_value: how likely random jitter (each rank last with chance 1/N, independently per
          step) makes some rank last as often as the most frequent one: the one-sided binomial
          tail, times N since the top rank of N was picked (Bonferroni);
        - pattern: "persistent" where one rank (``straggler``) was last both significantly
          (p_value < 1e-3) and far more often than the others: at least STRAGGLER_ODDS (9) times
          as often as the other ranks on average, i.e. in a share of the steps of at least
          9 / (N + 8) (0.9 on 2 ranks, 0.75 on 4, 0.375 on 16: 6 times chance); else "random"
          (the last arrivals spread over the ranks); None where it cannot be told: one rank, or
          so few steps that even a rank last in all of them would not be significant (under 11
          on 2 ranks).

        Both conditions are needed: over 10,000 steps a rank last in 55 % of them on 2 ranks is
        very significant but hardly a straggler; in 4 steps, last 4 times may well be chance.
        The odds are high because two workers time-sliced on a busy machine take turns in a
        pattern: with no rank slower, one of them was last in 80-90 % of 200 steps on the
        2-core development machine at load 4 (an injected straggler: 95-100 %).
        """
        n, last = self.ranks, self.last_arrivals()
        mask = last >= 0
        steps = int(mask.sum())
        out = {
            "steps": steps,
            "last_count": [0] * n,
            "last_share": [0.0] * n,
            "wait_seconds_per_step": 0.0,
            "wait_share": 0.0,
            "rank_cost_seconds_per_step": [0.0] * n,
            "rank_cost_share": [0.0] * n,
            "p_value": None,
            "pattern": None,
            "straggler": None,
        }
        if not steps:
            return out
        wait = self.phases()[:, mask, 3]
        lasts = last[mask]
        others = (wait.sum(axis=0) - wait[lasts, np.arange(steps)]) / (n - 1)
        step_total = float(self.step_seconds()[:, mask].mean(axis=0).sum())
        counts = np.bincount(lasts, minlength=n)
        cost = np.bincount(lasts, weights=others, minlength=n)  # per rank waited for
        top = int(counts.argmax())
        out.update(
            last_count=[int(c) for c in counts],
            last_share=[float(c / steps) for c in counts],
            wait_seconds_per_step=float(others.mean()),
            wait_share=float(others.sum() / step_total) if step_total > 0 else 0.0,
            rank_cost_seconds_per_step=[float(c / steps) for c in cost],
            rank_cost_share=[float(c / step_total) if step_total > 0 else 0.0 for c in cost],
        )
        if n * binomial_tail(steps, steps, 1.0 / n) >= STRAGGLER_ALPHA:
            return out  # too few steps to tell
        p_value = min(1.0, n * binomial_tail(steps, int(counts[top]), 1.0 / n))
        bar = STRAGGLER_ODDS / (n - 1 + STRAGGLER_ODDS)  # share = odds x the others' mean
        persistent = p_value < STRAGGLER_ALPHA and counts[top] / steps >= bar
        out.update(
            p_value=p_value,
            pattern="persistent" if persistent else "random",
            straggler=top if persistent else None,
        )
        return out

    # ------------------------------------------------------------ tables
    def per_step(self) -> list[dict]:
        """One row per (rank, step): epoch, wall seconds, every phase's seconds and the rank
        that arrived last at the step's collective (``last_arrivals``: -1 where none waited)."""
        ph, wall, ep, last = self.phases(), self.step_seconds(), self.epochs(), self.last_arrivals()
        rows = []
        for r in range(self.ranks):
            for i in range(self.steps):
                row = {"rank": r, "step": i, "epoch": int(ep[i]) + 1, "seconds": float(wall[r, i])}
                row.update({p: float(ph[r, i, k]) for k, p in enumerate(PHASES)})
                row["last_rank"] = int(last[i])
                rows.append(row)
        return rows

    def per_epoch(self) -> list[dict]:
        """One row per (rank, epoch): steps, wall seconds and every phase's seconds."""
        ph, wall, ep = self.phases(), self.step_seconds(), self.epochs()
        rows = []
        for r in range(self.ranks):
            for e in np.unique(ep):
                m = ep == e
                row = {
                    "rank": r,
                    "epoch": int(e) + 1,
                    "steps": int(m.sum()),
                    "seconds": float(wall[r, m].sum()),
                }
                row.update({p: float(ph[r, m, k].sum()) for k, p in enumerate(PHASES)})
                rows.append(row)
        return rows

    def summary(self) -> dict:
        """Totals (mean over ranks and per rank), per-step medians, step-time percentiles,
        the compute-to-communication ratio, collective calls and bytes per epoch, and who
        arrived last at the collectives (``stragglers``)."""
        ph, wall = self.phases(), self.step_seconds()
        n_epochs = max(1, len(np.unique(self.epochs()))) if self.steps else 1
        totals = ph.sum(axis=1)  # (ranks, phases)
        mean_tot = totals.mean(axis=0)
        comm = mean_tot[2] + mean_tot[3] + mean_tot[6]
        per_step = wall.mean(axis=0) if self.steps else np.zeros(0)
        pct = (lambda q: float(np.percentile(per_step, q))) if self.steps else (lambda q: 0.0)
        return {
            "ranks": self.ranks,
            "steps": self.steps,
            "seconds": float(wall.sum(axis=1).mean()),
            "phase_seconds": {p: float(mean_tot[k]) for k, p in enumerate(PHASES)},
            "rank_phase_seconds": [
                {p: float(totals[r, k]) for k, p in enumerate(PHASES)} for r in range(self.ranks)
            ],
            "step_median_seconds": {
                p: float(np.median(ph[:, :, k])) if self.steps else 0.0
                for k, p in enumerate(PHASES)
            },
            "step_seconds": {
                "mean": float(per_step.mean()) if self.steps else 0.0,
                "p50": pct(50),
                "p90": pct(90),
                "p99": pct(99),
            },
            "compute_to_communication": float(mean_tot[1] / comm) if comm > 0 else None,
            "collective_calls": int(max(self.calls)) if self.calls else 0,
            "collective_calls_per_epoch": max(self.calls) / n_epochs if self.calls else 0.0,
            "bytes_sent": int(max(self.bytes_sent)) if self.bytes_sent else 0,
            "bytes_sent_per_epoch": max(self.bytes_sent) / n_epochs if self.bytes_sent else 0.0,
            "stragglers": self.stragglers(),
        }

    # ------------------------------------------------------------ export
    def to_csv(self, path=None, per="step") -> str:
        """The per-step (or per="epoch") table as CSV; written to path when given."""
        if per not in ("step", "epoch"):
            raise ValueError(f"per is {per!r}, expected 'step' or 'epoch'")
        rows = self.per_step() if per == "step" else self.per_epoch()
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        text = buf.getvalue()
        if path is not None:
            write_text_atomically(path, text)
        return text

    def to_dict(self) -> dict:
        """Metadata, summary, per-epoch table, calls and bytes as plain values (JSON-ready)."""
        return {
            "meta": self.meta,
            "phases": list(PHASES),
            "summary": self.summary(),
            "per_epoch": self.per_epoch(),
            "calls": self.calls,
            "bytes_sent": self.bytes_sent,
            "stamps": [s.tolist() for s in self.stamps],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StepTimes":
        return cls(d["stamps"], d.get("calls"), d.get("bytes_sent"), d.get("meta"))

    def to_json(self, path=None) -> str:
        """``to_dict()`` as JSON text, also written to ``path`` when given."""
        text = json.dumps(self.to_dict())
        if path is not None:
            write_text_atomically(path, text)
        return text

    def to_pandas(self, per="step"):
        """The per-step (or per-epoch) table as a pandas DataFrame (pandas must be installed)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("to_pandas needs pandas: pip install pandas") from exc
        if per not in ("step", "epoch"):
            raise ValueError(f"per is {per!r}, expected 'step' or 'epoch'")
        return pd.DataFrame(self.per_step() if per == "step" else self.per_epoch())

    def chrome_trace(self, path=None, first_step: int = 0, last_step: int | None = None) -> dict:
        """Chrome trace-event JSON (Perfetto, chrome://tracing): one track per rank, every
        phase a slice (the gradient exchange as sync_wait then communication), times in us
        from the run's start; each step's last arrival at the collective an instant event
        "last to arrive" on that rank's track (and ``last_rank`` in the step's sync_wait
        slices), and the run's stragglers (``stragglers()``) in
        ``otherData``. Written to path when given."""
        events = []
        last = self.last_arrivals()
        stop = self.steps if last_step is None else min(self.steps, last_step)
        firsts = [s[0, _START] for s in self.stamps if len(s)]
        # one machine: every rank stamps the same monotonic clock, so keep their real offsets;
        # clocks that disagree by more than a second are different machines' (MPI), and each
        # rank is then aligned on its own first stamp (all ranks leave the same barrier there)
        shared_clock = bool(firsts) and max(firsts) - min(firsts) < 1.0
        for r, s in enumerate(self.stamps):
            events.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": 0,
                    "tid": r,
                    "args": {"name": f"rank {r}"},
                }
            )
            if not len(s):
                continue
            t0 = min(firsts) if shared_clock else s[0, _START]
            for i in range(first_step, stop):
                row = s[i]
                wait = min(max(row[_WAIT], 0.0), row[_EXCHANGE] - row[_COMPUTE])
                if row[_AVERAGE]:  # in the order it ran: the update, then the average
                    updated = row[_COMPUTE] + (row[_UPDATE] - row[_EXCHANGE])
                    bounds = [
                        ("update", row[_COMPUTE], updated),
                        ("sync_wait", updated, updated + wait),
                        ("average", updated + wait, row[_UPDATE]),
                    ]
                else:
                    bounds = [
                        ("sync_wait", row[_COMPUTE], row[_COMPUTE] + wait),
                        ("communication", row[_COMPUTE] + wait, row[_EXCHANGE]),
                        ("update", row[_EXCHANGE], row[_UPDATE]),
                    ]
                bounds = [
                    ("data", row[_START], row[_DATA]),
                    ("compute", row[_DATA], row[_COMPUTE]),
                    *bounds,
                    ("other", row[_UPDATE], row[_END]),
                ]
                args = {"step": i, "epoch": int(row[_EPOCH]) + 1}
                for name, a, b in bounds:
                    if b > a:
                        events.append(
                            {
                                "name": name,
                                "cat": "phase",
                                "ph": "X",
                                "pid": 0,
                                "tid": r,
                                "ts": (a - t0) * 1e6,
                                "dur": (b - a) * 1e6,
                                "args": dict(args, last_rank=int(last[i]))
                                if name == "sync_wait"
                                else args,
                            }
                        )
                if last[i] == r:  # it arrives at the collective when its compute ends
                    events.append(
                        {
                            "name": "last to arrive",
                            "cat": "straggler",
                            "ph": "i",
                            "s": "t",
                            "pid": 0,
                            "tid": r,
                            "ts": (row[_COMPUTE] - t0) * 1e6,
                            "args": args,
                        }
                    )
        trace = {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": dict(self.meta, stragglers=self.stragglers()),
        }
        if path is not None:
            write_text_atomically(path, json.dumps(trace))
        return trace


class StepClock:
    """The phase boundaries of one step (perf_counter), marked by the exchange strategy:
    start ─data─ b ─compute─ c ─exchange─ d ─update─ e; and the seconds the exchange waited
    at its collectives' entry (read from the communicator). ``hooks.computed(rank)`` (the
    training loop's hooks: an injected straggler) runs when the compute ends."""

    __slots__ = (
        "comm",
        "hooks",
        "rank",
        "start",
        "data_seconds",
        "t_data",
        "t_compute",
        "t_exchange",
        "waited_before",
        "waited_exchange",
        "average",
    )

    def __init__(self, comm, hooks):
        self.comm, self.hooks, self.rank = comm, hooks, comm.rank
        self.average = False

    def begin(self, t: float) -> None:
        self.start, self.data_seconds, self.t_data = t, 0.0, None

    def data_done(self) -> None:
        """The batch is gathered (strategies that gather once)."""
        self.t_data = time.perf_counter()

    @contextmanager
    def data(self):
        """Times one of several gathers (strategies that gather per chunk)."""
        t0 = time.perf_counter()
        yield
        self.data_seconds += time.perf_counter() - t0

    def computed(self) -> None:
        self.hooks.computed(self.rank)  # an injected straggler computes longer
        self.t_compute = time.perf_counter()
        self.waited_before = self.comm.waited

    def exchanged(self) -> None:
        self.t_exchange = time.perf_counter()
        # the exchange's waits: a wait in the update (the barrier of a sharded update) is the
        # update's, not the wait at the gradient collective's entry
        self.waited_exchange = self.comm.waited - self.waited_before

    def averaged(self, t_updated: float, done: bool) -> None:
        """Local SGD's step: its update ended at t_updated, then, where done, the replicas'
        average ran until now. Recorded in the exchange's place (the stamps' order: exchange,
        then update), each phase its own duration and the step flagged as averaged (the
        average phase; the trace draws it after the update); a step without an average has
        no exchange."""
        self.average = done
        if not done:
            self.t_exchange, self.waited_exchange = self.t_compute, 0.0
            return
        self.t_exchange = self.t_compute + (time.perf_counter() - t_updated)
        self.waited_exchange = self.comm.waited - self.waited_before

    def record(self, timer: StepTimer, epoch: int, t_update: float) -> None:
        t_data = self.t_data if self.t_data is not None else self.start + self.data_seconds
        timer.step(
            epoch,
            self.start,
            t_data,
            self.t_compute,
            self.t_exchange,
            t_update,
            self.waited_exchange,
            self.average,
        )
        self.average = False
