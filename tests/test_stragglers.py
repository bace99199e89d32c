"""Stragglers named and their cost shown: which rank arrived last at each step's gradient
collective, how often, what waiting for it cost the others, and a persistent straggler told
from random jitter (dptrain.measure.timing.StepTimes.stragglers, the run's last lines)."""

import json
import math

import numpy as np
import pytest
from _runs import SMALL

import dptrain
from dptrain.cli import main
from dptrain.engine.result import straggler_line
from dptrain.measure import timing

# 20 steps of 100 (no uneven last batch: every step takes part in the counts)
QUICK = dict(SMALL, n_samples=2000, epochs=1)
FIELDS = {
    "steps",
    "last_count",
    "last_share",
    "wait_seconds_per_step",
    "wait_share",
    "rank_cost_seconds_per_step",
    "rank_cost_share",
    "p_value",
    "pattern",
    "straggler",
}


def _train(**kw):
    return dptrain.train(**dict(QUICK, **kw))


def _stamps(waits, step=0.010):
    """StepTimes from a (ranks, steps) array of sync waits (seconds): 10 ms steps, the
    compute ending 5 ms in, the exchange 0.1 ms after the wait."""
    waits = np.asarray(waits, dtype=np.float64)
    stamps = []
    for w in waits:
        s = np.zeros((len(w), 8))
        s[:, 0] = np.arange(len(w)) * step
        s[:, 1] = s[:, 0] + 0.001
        s[:, 2] = s[:, 0] + 0.005
        s[:, 3] = s[:, 2] + w + 0.0001
        s[:, 4] = s[:, 3] + 0.0002
        s[:, 5] = s[:, 0] + step
        s[:, 6] = w
        stamps.append(s)
    return timing.StepTimes(stamps)


def _consistent(st, ranks, steps):
    """The summary's counts agree with the per-step last arrivals, in the table and the CSV."""
    s, last = st.summary()["stragglers"], st.last_arrivals().tolist()
    assert set(s) == FIELDS
    assert len(last) == steps and len(s["last_count"]) == ranks
    assert sum(s["last_count"]) == s["steps"] == sum(x >= 0 for x in last)
    assert s["last_count"] == [last.count(r) for r in range(ranks)]
    assert [row["last_rank"] for row in st.per_step()] == last * ranks
    assert st.to_csv().splitlines()[0].endswith(",last_rank")
    assert sum(s["rank_cost_seconds_per_step"]) == pytest.approx(s["wait_seconds_per_step"])
    assert sum(s["rank_cost_share"]) == pytest.approx(s["wait_share"])


def _expected_random_wait(seed, steps, ms):
    """The mean wait of the earlier of 2 ranks for the later one under the run's own seeded
    U(0, ms) draws (hooks.Injection), seconds: mean |x0 - x1|."""
    x = [np.random.default_rng([seed, r, 0x57A6]).uniform(0.0, ms / 1e3, steps) for r in (0, 1)]
    return float(np.abs(x[0] - x[1]).mean())


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_persistent_straggler_is_named_with_what_waiting_for_it_cost(backend, tmp_path):
    trace = tmp_path / "trace.json"
    r = _train(workers=2, backend=backend, straggle=(1, 20.0), trace=trace, n_samples=4000)
    s = r.breakdown["stragglers"]
    _consistent(r.step_times, 2, r["steps"])
    last = r.step_times.last_arrivals().tolist()
    assert s["steps"] == r["steps"] == 40  # long enough: 20 ms x 40 steps of waiting
    assert s["pattern"] == "persistent" and s["straggler"] == 1, s
    assert s["last_share"][1] >= 0.9 and s["p_value"] < 1e-3
    # the others waited about the injected 20 ms per step, nearly all of it for rank 1
    assert 0.5 < s["wait_seconds_per_step"] / 0.020 < 2.0, s["wait_seconds_per_step"]
    assert 0.5 < s["rank_cost_seconds_per_step"][1] / 0.020 < 2.0
    assert 0.5 < s["wait_share"] <= 1.0
    line = straggler_line(r.breakdown)
    assert line.startswith(f"rank 1 arrived last at {100 * s['last_share'][1]:.0f} % of the steps")
    assert "ms per step for it" in line
    # the JSON result and the trace say it too
    assert json.loads(r.to_json())["breakdown"]["stragglers"]["straggler"] == 1
    t = json.loads(trace.read_text())
    assert t["otherData"]["stragglers"]["straggler"] == 1
    lasts = [e for e in t["traceEvents"] if e["name"] == "last to arrive"]
    assert [e["args"]["step"] for e in lasts] == [i for i, x in enumerate(last) if x >= 0]
    assert [e["tid"] for e in lasts] == [x for x in last if x >= 0]
    waits = [e for e in t["traceEvents"] if e["name"] == "sync_wait"]
    assert all(e["args"]["last_rank"] == last[e["args"]["step"]] for e in waits)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_random_jitter_is_not_called_a_straggler_and_its_cost_is_shown(backend):
    steps = 40
    r = _train(workers=2, backend=backend, straggle_random_ms=20.0, n_samples=100 * steps)
    s = r.breakdown["stragglers"]
    _consistent(r.step_times, 2, steps)
    assert s["pattern"] == "random" and s["straggler"] is None, s
    assert min(s["last_count"]) > 0  # the last arrivals spread over both ranks
    # the earlier rank waits for the later one: mean |x0 - x1|, a/3 for U(0, a) on 2 ranks;
    # on a busy machine the workers' own jitter (what they wait without injection) adds to it
    own = _train(workers=2, backend=backend, n_samples=100 * steps)
    own = own.breakdown["stragglers"]["wait_seconds_per_step"]
    wait = s["wait_seconds_per_step"]
    for expected in (_expected_random_wait(0, steps, 20.0), 0.020 / 3):
        assert 0.5 * expected < wait < 2 * expected + own, (wait, expected, own)
    assert straggler_line(r.breakdown).startswith(
        "the last arrival at the collectives is random jitter"
    )


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_an_uninjected_run_says_who_came_last_consistently(backend):
    r = _train(workers=2, backend=backend)
    s = r.breakdown["stragglers"]
    _consistent(r.step_times, 2, r["steps"])
    assert s["pattern"] in ("random", "persistent") and s["steps"] == r["steps"]
    one = _train(workers=1, backend=backend)
    s = one.breakdown["stragglers"]
    assert s["steps"] == 0 and s["pattern"] is None and s["straggler"] is None
    assert set(one.step_times.last_arrivals().tolist()) == {-1}


def test_jitter_spread_over_the_ranks_names_no_straggler():
    rng = np.random.default_rng(1)
    arrive = rng.uniform(0, 0.002, (4, 400))  # no rank slower than the others
    st = _stamps(arrive.max(axis=0) - arrive)
    s = st.stragglers()
    _consistent(st, 4, 400)
    assert s["pattern"] == "random" and s["straggler"] is None and s["p_value"] > 1e-3
    assert st.last_arrivals().tolist() == arrive.argmax(axis=0).tolist()
    # E[max - own] over the other 3 of 4 ranks: N a / (2 (N + 1)) = 0.8 ms for a = 2 ms
    assert s["wait_seconds_per_step"] == pytest.approx(0.0008, rel=0.1)
    assert s["wait_share"] == pytest.approx(s["wait_seconds_per_step"] / 0.010)
    assert straggler_line(st.summary()).startswith("the last arrival at the collectives is random")


def test_a_persistent_straggler_needs_both_significance_and_a_share_far_above_chance():
    rng = np.random.default_rng(2)
    # 16 ranks, rank 3 late by 1 ms in 60 % of the steps: chance is 1/16, the bar 9/24
    late = rng.uniform(size=500) < 0.6
    arrive = rng.uniform(0, 0.0005, (16, 500))
    arrive[3] += np.where(late, 0.001, 0.0)
    s = _stamps(arrive.max(axis=0) - arrive).stragglers()
    assert s["pattern"] == "persistent" and s["straggler"] == 3
    line = straggler_line({"stragglers": s})
    assert line.startswith(f"rank 3 arrived last at {100 * s['last_share'][3]:.0f} % of the steps")
    # 2 ranks, rank 0 last in 85 % of 10,000 steps: significant, but below the bar of 0.9
    for share, pattern, straggler in [(0.85, "random", None), (0.95, "persistent", 0)]:
        first = rng.uniform(size=10000) < share
        s = _stamps([np.where(first, 0, 1e-4), np.where(first, 1e-4, 0)]).stragglers()
        assert s["p_value"] < 1e-3 and s["last_count"][0] == first.sum()
        assert s["pattern"] == pattern and s["straggler"] == straggler
    # last in all of 5 steps: too few to tell
    s = _stamps([[1e-3] * 5, [0.0] * 5]).stragglers()
    assert s["last_count"] == [0, 5] and s["pattern"] is None and s["p_value"] is None


def test_small_waits_name_nothing_and_print_nothing():
    s = _stamps([[0.0] * 30, [0.0] * 30]).summary()  # no measured wait: no collective
    assert s["stragglers"]["steps"] == 0 and straggler_line(s) is None
    jitter = np.tile([[1e-5, 0.0], [0.0, 1e-5]], 20)  # random, 0.1 % of the step
    s = _stamps(jitter).summary()
    assert s["stragglers"]["pattern"] == "random" and straggler_line(s) is None


def test_binomial_tail():
    for n, k, p in [(10, 0, 0.5), (10, 7, 0.5), (20, 20, 0.5), (30, 5, 1 / 16), (5, 6, 0.5)]:
        want = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
        assert timing.binomial_tail(n, k, p) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_the_run_prints_the_straggler_line(capsys):
    args = ["train", "--model", "softmax", "--dataset", "synthetic", "--n-samples", "2000"]
    args += ["--batch-size", "100", "--epochs", "1", "--workers", "2", "--backend", "thread"]
    assert main(args + ["--straggle", "1:20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("rank 1 arrived last at") and "for it (" in out[-2], out[-3:]
    assert out[-3].startswith("time per step: p50")
    assert out[-1].startswith("placement: ")
