"""The performance model (dptrain.measure.perfmodel): cost formulas at hand-checked values, the fit
recovering known parameters from synthetic sweeps, validation, projection, break-even, and
clear errors on bad input.

The synthetic sweeps are generated here from the model's formulas written out again
(``synthetic_runs``), not with perfmodel.predict, so the fit is checked against an
independent statement of the model.
"""

import json
import math

import numpy as np
import pytest

from dptrain.measure import perfmodel as pm

M = 940584.0  # the MNIST MLP's gradient, bytes

# E[max of p standard normals]: closed forms for 2 and 3, Harter's (1961) table otherwise
E_MAX = {
    1: 0.0,
    2: 1 / math.sqrt(math.pi),
    3: 1.5 / math.sqrt(math.pi),
    4: 1.0293754,
    5: 1.1629645,
    8: 1.4236003,
    16: 1.7659913,
}

TRUTH = {
    "data_per_sample": 2e-7,
    "data_per_step": 5e-6,
    "compute_per_sample": 4e-6,
    "compute_per_step": 2e-5,
    "update_per_sample": 0.0,
    "update_per_step": 1.5e-4,
    "other_per_sample": 0.0,
    "other_per_step": 1e-5,
    "alpha": 2e-6,
    "beta": 1e-10,
    "sigma": 3e-5,
}


def comm_seconds(algorithm, p, nbytes, alpha, beta, calls=1.0):
    """One step's all-reduce(s), written out per algorithm (gamma folded into beta)."""
    if p == 1:
        return 0.0
    if algorithm == "ring":
        return calls * 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    if algorithm == "tree":
        rounds = int(math.log2(p))
        msgs = rounds if 2**rounds == p else rounds + 2
        return calls * msgs * alpha + msgs * nbytes * beta
    return 2 * (p - 1) * (alpha + nbytes * beta)  # ps


def synthetic_runs(
    truth=TRUTH,
    workers=(1, 2, 4, 8),
    sizes=(5000, 10000, 20000, 40000),
    batch_size=128,
    epochs=1,
    allreduce="native",
    repeats=1,
    noise=0.0,
    buckets=1,
    seed=0,
):
    """RUN rows (docs/sweep_schema.md) whose phases follow the model exactly, times a
    log-normal factor of relative size ``noise`` per phase."""
    rng = np.random.default_rng(seed)
    algorithm = "ring" if allreduce == "native" else allreduce
    t_sample = sum(truth[f"{ph}_per_sample"] for ph in ("data", "compute", "update", "other"))
    runs = []
    for p in workers:
        for n in sizes:
            full, rem = divmod(n, batch_size)
            steps = epochs * (full + (rem > 0))
            mean = epochs * n / p
            busiest = epochs * (full * math.ceil(batch_size / p) + math.ceil(rem / p))
            for rep in range(repeats):
                ph = {
                    k: truth[f"{k}_per_sample"] * mean + truth[f"{k}_per_step"] * steps
                    for k in ("data", "compute", "update", "other")
                }
                comm = steps * comm_seconds(algorithm, p, M, truth["alpha"], truth["beta"], buckets)
                if allreduce == "ps":  # the broadcast lands in the update phase
                    half = comm / 2
                    ph["communication"], ph["update"] = half, ph["update"] + half
                else:
                    ph["communication"] = comm
                ph["sync_wait"] = steps * truth["sigma"] * E_MAX[p] + t_sample * (busiest - mean)
                ph = {k: v * float(np.exp(noise * rng.standard_normal())) for k, v in ph.items()}
                runs.append(
                    {
                        "model": "mlp",
                        "dataset": "mnist",
                        "backend": "process",
                        "allreduce": allreduce,
                        "n_samples": n,
                        "workers": p,
                        "threads": 1,
                        "repeat": rep,
                        "epochs": epochs,
                        "batch_size": batch_size,
                        "steps": steps,
                        "param_count": int(M // 4),
                        "dtype": "float32",
                        "param_bytes": M,
                        "train_seconds": sum(ph.values()),
                        "phases": ph,
                        "collective_calls": steps * buckets if p > 1 else 0,
                    }
                )
    return runs


def recovered(model):
    got = dict(model.coefficients, alpha=model.alpha, beta=model.beta, sigma=model.sigma)
    return got


# ------------------------------------------------------------------ cost formulas
NET = pm.Network("test", alpha=1e-5, bandwidth=1e9)  # beta = 1 ns/B
G = 2e-10


@pytest.mark.parametrize("algorithm", pm.ALGORITHMS)
def test_one_worker_costs_nothing(algorithm):
    assert pm.allreduce_seconds(algorithm, 1, 1e9, NET, gamma=G) == 0.0
    assert pm.allreduce_coefficients(algorithm, 1) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "algorithm, p, expected",
    [
        # ring: 2 (p - 1) alpha + 2 (p - 1) / p M beta + (p - 1) / p M gamma
        ("ring", 2, 2 * 1e-5 + 1 * 1e-3 + 0.5 * 2e-4),
        ("ring", 3, 4 * 1e-5 + 4 / 3 * 1e-3 + 2 / 3 * 2e-4),
        ("ring", 8, 14 * 1e-5 + 1.75 * 1e-3 + 0.875 * 2e-4),
        # tree: log2 p rounds; p = 3 is fold + 1 round + unfold (3 messages, 2 sums)
        ("tree", 2, 1e-5 + 1e-3 + 2e-4),
        ("tree", 3, 3 * (1e-5 + 1e-3) + 2 * 2e-4),
        ("tree", 8, 3 * (1e-5 + 1e-3 + 2e-4)),
        ("tree", 6, 4 * (1e-5 + 1e-3) + 3 * 2e-4),
        # flat parameter server: 2 (p - 1) messages of M through the root, (p - 1) M summed
        ("ps", 2, 2 * (1e-5 + 1e-3) + 2e-4),
        ("ps", 3, 4 * (1e-5 + 1e-3) + 2 * 2e-4),
        ("ps", 8, 14 * (1e-5 + 1e-3) + 7 * 2e-4),
    ],
)
def test_allreduce_seconds_hand_checked(algorithm, p, expected):
    # M = 1 MB: M beta = 1e-3 s, M gamma = 2e-4 s
    got = pm.allreduce_seconds(algorithm, p, 1e6, NET, gamma=G)
    assert got == pytest.approx(expected, rel=1e-12), (algorithm, p)


def test_ring_large_message_approaches_two_m_beta():
    # for M >> alpha / beta the ring costs 2 (p - 1) / p M beta -> 2 M beta
    m = 1e15
    ratios = [
        pm.allreduce_seconds("ring", p, m, NET, gamma=0.0) / (m * NET.beta) for p in (2, 4, 16, 256)
    ]
    assert ratios == sorted(ratios)
    assert ratios[0] == pytest.approx(1.0, rel=1e-6)
    assert ratios[-1] == pytest.approx(2 * 255 / 256, rel=1e-6)
    assert 2 - ratios[-1] < 0.01


def test_tree_beats_ring_on_latency_and_ring_beats_tree_on_bandwidth():
    slow_link = pm.Network("latency-bound", alpha=1e-3, bandwidth=1e12)
    assert pm.allreduce_seconds("tree", 64, 1e3, slow_link) < pm.allreduce_seconds(
        "ring", 64, 1e3, slow_link
    )
    assert pm.allreduce_seconds("ring", 64, 1e9, NET) < pm.allreduce_seconds("tree", 64, 1e9, NET)


def test_networks():
    assert {"10 GbE", "25 GbE", "100 Gb InfiniBand (EDR)", "shared memory"} <= set(pm.NETWORKS)
    for net in pm.NETWORKS.values():
        assert net.alpha >= 0 and net.beta > 0
    ib, eth = pm.get_network("100 Gb InfiniBand (EDR)"), pm.get_network("10 GbE")
    assert ib.alpha < eth.alpha and ib.beta < eth.beta
    assert pm.NETWORKS["10 GbE"].beta == pytest.approx(8 / 10e9)
    own = pm.Network("mine", 5e-6, 2e9)
    assert pm.get_network(own) is own and own.beta == 5e-10
    assert pm.Network("ideal", 0.0, math.inf).beta == 0.0
    json.dumps(own.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="x", alpha=-1e-6, bandwidth=1e9), "alpha"),
        (dict(name="x", alpha=math.nan, bandwidth=1e9), "alpha"),
        (dict(name="x", alpha=1e-6, bandwidth=0.0), "bandwidth"),
        (dict(name="x", alpha=1e-6, bandwidth=-5.0), "bandwidth"),
        (dict(name="x", alpha="fast", bandwidth=1e9), "alpha"),
        (dict(name="", alpha=1e-6, bandwidth=1e9), "name"),
    ],
)
def test_network_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pm.Network(**kwargs)


def test_cost_bad_input():
    with pytest.raises(ValueError, match="algorithm is 'butterfly'"):
        pm.allreduce_seconds("butterfly", 4, 1e6, NET)
    for p in (0, -2, 2.5, True, "4"):
        with pytest.raises(ValueError, match="p is"):
            pm.allreduce_seconds("ring", p, 1e6, NET)
    with pytest.raises(ValueError, match="nbytes"):
        pm.allreduce_seconds("ring", 4, -1, NET)
    with pytest.raises(ValueError, match="network is 'token ring'"):
        pm.allreduce_seconds("ring", 4, 1e6, "token ring")


def test_expected_max_normal():
    for p, v in E_MAX.items():
        assert pm.expected_max_normal(p) == pytest.approx(v, abs=1e-6), p
    values = [pm.expected_max_normal(p) for p in range(1, 300)]
    assert all(b > a for a, b in zip(values, values[1:]))
    # below its asymptote sqrt(2 ln p), and approaching it slowly
    assert pm.expected_max_normal(256) < math.sqrt(2 * math.log(256))
    assert pm.expected_max_normal(10**6) / math.sqrt(2 * math.log(10**6)) > 0.88


# ------------------------------------------------------------------ the fit
def test_fit_recovers_known_parameters_exactly():
    model = pm.fit(synthetic_runs())
    got = recovered(model)
    for name, want in TRUTH.items():
        assert got[name] == pytest.approx(want, rel=1e-6, abs=1e-12), name
    assert model.fit_rms_error_pct < 1e-6
    t_sample = TRUTH["data_per_sample"] + TRUTH["compute_per_sample"]
    t_serial = sum(TRUTH[f"{k}_per_step"] for k in ("data", "compute", "update", "other"))
    assert model.t_sample == pytest.approx(t_sample, rel=1e-6)
    assert model.t_serial == pytest.approx(t_serial, rel=1e-6)
    assert model.serial_fraction == pytest.approx(t_serial / (t_serial + 128 * t_sample), rel=1e-6)
    # the fit's predictions of the runs it saw are the runs
    for run in synthetic_runs(workers=(2, 8), sizes=(10000,)):
        pred = model.predict_run(run)
        assert pred.seconds == pytest.approx(run["train_seconds"], rel=1e-6)
        for ph in pm.PHASES:
            want = run["phases"].get(ph, 0.0)  # no "average": synchronous SGD's runs
            assert pred.phases[ph] == pytest.approx(want, rel=1e-6, abs=1e-12)
        assert sum(pred.breakdown.values()) == pytest.approx(pred.seconds, rel=1e-12)


def test_fit_recovers_parameters_with_noise():
    runs = synthetic_runs(noise=0.02, repeats=3, seed=1)
    got = recovered(pm.fit(runs))
    # the large terms within a few per cent, the small ones within 10 %, alpha (28 us of a
    # 200 us all-reduce at p = 8) within 15 % (seeds 0-5 gave at most 2 %, 5 %, 9 %)
    for name in ("compute_per_sample", "update_per_step", "beta", "sigma"):
        assert got[name] == pytest.approx(TRUTH[name], rel=0.05), name
    for name in ("compute_per_step", "data_per_step"):
        assert got[name] == pytest.approx(TRUTH[name], rel=0.1), name
    assert got["alpha"] == pytest.approx(TRUTH["alpha"], rel=0.15)
    model = pm.fit(runs)
    assert model.t_sample == pytest.approx(4.2e-6, rel=0.03)
    assert 0 < model.fit_rms_error_pct < 5


def test_fit_noise_is_not_fitted_away():
    # a different seed gives different (but close) parameters: the fit uses the data
    a = pm.fit(synthetic_runs(noise=0.02, seed=1)).beta
    b = pm.fit(synthetic_runs(noise=0.02, seed=2)).beta
    assert a != b and a == pytest.approx(b, rel=0.1)


@pytest.mark.parametrize("allreduce", ["tree", "ps"])
def test_fit_other_algorithms(allreduce):
    # messages and bytes grow alike with p: latency and bandwidth are not told apart ...
    runs = synthetic_runs(allreduce=allreduce, workers=(1, 2, 3, 4, 8))
    with pytest.raises(ValueError, match="alpha.*beta"):
        pm.fit(runs)
    if allreduce == "tree":
        # ... unless the tree also ran with another bucket size
        model = pm.fit(runs + synthetic_runs(allreduce="tree", workers=(2, 4), buckets=4))
    else:
        # ... or (one message per gradient) alpha is known
        model = pm.fit(runs, alpha=TRUTH["alpha"])
    assert model.algorithm == allreduce
    got = recovered(model)
    for name, want in TRUTH.items():
        assert got[name] == pytest.approx(want, rel=1e-6, abs=1e-12), (allreduce, name)


def test_fit_mixed_algorithms_share_the_transport():
    runs = synthetic_runs(workers=(1, 2, 4)) + synthetic_runs(allreduce="ps", workers=(2, 4))
    got = recovered(pm.fit(runs))
    for name in ("alpha", "beta", "sigma", "update_per_step", "compute_per_sample"):
        assert got[name] == pytest.approx(TRUTH[name], rel=1e-6), name


def test_fit_with_known_alpha():
    # two worker counts (1 and 2): ring latency and bandwidth cannot be told apart ...
    runs = synthetic_runs(workers=(1, 2))
    with pytest.raises(ValueError, match="too few distinct configurations.*alpha"):
        pm.fit(runs)
    # ... unless alpha is known; then beta comes out exactly
    model = pm.fit(runs, alpha=TRUTH["alpha"])
    assert model.alpha_fixed and model.alpha == TRUTH["alpha"]
    assert model.beta == pytest.approx(TRUTH["beta"], rel=1e-6)
    assert model.sigma == pytest.approx(TRUTH["sigma"], rel=1e-6)
    assert (
        "given, not fitted" in [r for r in model.parameters() if r["name"] == "alpha"][0]["meaning"]
    )


def test_fit_accepts_sweep_dict_and_parameters_are_documented():
    model = pm.fit({"config": {}, "runs": synthetic_runs()})
    rows = model.parameters()
    names = {r["name"] for r in rows}
    assert {"alpha", "beta", "sigma", "t_sample", "t_serial", "serial_fraction"} <= names
    assert all(r["unit"] and r["meaning"] for r in rows)
    assert model.labels == {
        "model": "mlp",
        "dataset": "mnist",
        "backend": "process",
        "dtype": "float32",
        "threads": 1,
    }
    assert model.n_samples == 40000 and model.workers_fitted == [1, 2, 4, 8]


# ------------------------------------------------------------------ bad input
def test_fit_bad_input():
    runs = synthetic_runs()
    with pytest.raises(ValueError, match="runs is empty"):
        pm.fit([])
    with pytest.raises(ValueError, match="runs must be a list"):
        pm.fit("results/sweep.json")
    with pytest.raises(ValueError, match=r"runs\[0\] is a int"):
        pm.fit([3])
    # one worker count: per-sample and per-step work cannot be separated
    with pytest.raises(ValueError, match="too few distinct configurations.*worker counts"):
        pm.fit(synthetic_runs(workers=(2,)))
    # workers=1 only, with two batch sizes: nothing measures communication
    ones = synthetic_runs(workers=(1,)) + synthetic_runs(workers=(1,), batch_size=256)
    with pytest.raises(ValueError, match="every run has workers=1"):
        pm.fit(ones)
    bad = [dict(r) for r in runs]
    bad[3]["workers"] = 0
    with pytest.raises(ValueError, match=r"runs\[3\]: workers is 0"):
        pm.fit(bad)
    bad[3]["workers"] = -2
    with pytest.raises(ValueError, match=r"runs\[3\]: workers is -2"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    del bad[5]["phases"]
    with pytest.raises(ValueError, match=r"runs\[5\] has no 'phases'"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    bad[2]["phases"] = {k: v for k, v in bad[2]["phases"].items() if k != "sync_wait"}
    with pytest.raises(ValueError, match=r"runs\[2\]: phases has no 'sync_wait'"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    bad[1]["steps"] += 1
    with pytest.raises(ValueError, match=r"runs\[1\]: steps is"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    bad[4]["allreduce"] = "gossip"
    with pytest.raises(ValueError, match="allreduce is 'gossip'"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    bad[4]["backend"] = "thread"
    with pytest.raises(ValueError, match="runs mix backend"):
        pm.fit(bad)
    bad = [dict(r) for r in runs]
    bad[0]["train_seconds"] = 0.0
    with pytest.raises(ValueError, match="train_seconds"):
        pm.fit(bad)
    with pytest.raises(ValueError, match="native_algorithm is 'star'"):
        pm.fit(runs, native_algorithm="star")
    with pytest.raises(ValueError, match="alpha is -1"):
        pm.fit(runs, alpha=-1)


def test_predict_bad_input():
    model = pm.fit(synthetic_runs())
    for w in (0, -1, 1.5, None, True):
        with pytest.raises(ValueError, match="workers is"):
            model.predict(w, 1000)
    with pytest.raises(ValueError, match="algorithm is 'allgather'"):
        model.predict(4, 1000, algorithm="allgather")
    with pytest.raises(ValueError, match="n_samples is 0"):
        model.predict(4, 0)
    with pytest.raises(ValueError, match="network is"):
        model.predict(4, 1000, network=42)


# ------------------------------------------------------------------ validation
def test_validate_holds_out_the_largest_data_set():
    runs = synthetic_runs(noise=0.02, repeats=3, seed=3)
    val = pm.validate(runs, holdout="n_samples")
    assert val.holdout == "n_samples=40000"
    assert [(r["workers"], r["n_samples"]) for r in val.rows] == [(p, 40000) for p in (1, 2, 4, 8)]
    assert all(r["repeats"] == 3 for r in val.rows)
    assert val.fit.n_runs == 3 * 4 * 3 and 40000 not in val.fit.n_samples_fitted
    for r in val.rows:
        assert r["measured"] == pytest.approx(
            np.median(
                [
                    x["train_seconds"]
                    for x in runs
                    if (x["workers"], x["n_samples"]) == (r["workers"], r["n_samples"])
                ]
            )
        )
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] / r["measured"] - 1))
    assert val.max_abs_error_pct < 5 and val.within_target
    doc = json.loads(json.dumps(val.to_dict(), allow_nan=False))
    assert doc["rows"][0]["predicted_phases"].keys() == set(pm.PHASES)


def test_validate_holds_out_the_largest_worker_count():
    runs = synthetic_runs(workers=(1, 2, 4, 8, 16))
    val = pm.validate(runs, holdout="workers")
    assert {r["workers"] for r in val.rows} == {16} and 16 not in val.fit.workers_fitted
    assert val.max_abs_error_pct < 1e-4  # noiseless: the model extrapolates
    # a model that is wrong shows as a validation error: the truth's communication doubles
    # at 16 workers (a second, slower network level)
    slow = [dict(r) for r in runs]
    for r in slow:
        if r["workers"] == 16:
            extra = r["phases"]["communication"]
            r["phases"] = dict(r["phases"], communication=2 * extra)
            r["train_seconds"] += extra
    val = pm.validate(slow, holdout="workers")
    assert not val.within_target and all(r["error_pct"] < -15 for r in val.rows)


def test_validate_callable_and_bad_holdouts():
    runs = synthetic_runs()
    val = pm.validate(runs, holdout=lambda r: r["workers"] == 4 and r["n_samples"] == 10000)
    assert [(r["workers"], r["n_samples"]) for r in val.rows] == [(4, 10000)]
    with pytest.raises(ValueError, match="leaves no run out"):
        pm.validate(runs, holdout=lambda r: False)
    with pytest.raises(ValueError, match="leaves every run out"):
        pm.validate(synthetic_runs(sizes=(5000,)), holdout="n_samples")
    with pytest.raises(ValueError, match="holdout is 'epochs'"):
        pm.validate(runs, holdout="epochs")
    # workers 1, 2, 4 with 4 left out: the ring's alpha needs the hint ...
    small = synthetic_runs(workers=(1, 2, 4))
    with pytest.raises(ValueError, match="alpha"):
        pm.validate(small, holdout="workers")
    # ... and with a known alpha the extrapolation to 4 workers is exact
    val = pm.validate(small, holdout="workers", alpha=TRUTH["alpha"])
    assert val.max_abs_error_pct < 1e-4


def test_validation_verdict_states_a_failed_or_too_small_check():
    v = pm.validation_verdict(102.13, 15.0, n_points=2, n_parameters=5)
    assert v["validated"] is False
    assert v["text"] == (
        "NOT VALIDATED: held-out error up to 102.1 % > 15 % target; "
        "checked on 2 held-out points for 5 fitted parameters: not a "
        "validation"
    )
    v = pm.validation_verdict(3.0, 15.0, n_points=4, n_parameters=11)
    assert not v["validated"] and v["problems"] == [
        "checked on 4 held-out points for 11 fitted parameters: not a validation"
    ]
    assert v["text"] == (
        "NOT VALIDATED: checked on 4 held-out points for 11 fitted "
        "parameters: not a validation (held-out error up to 3.0 %, within "
        "the 15 % target)"
    )
    v = pm.validation_verdict(30.0, 15.0, n_points=20, n_parameters=11)
    assert not v["validated"] and v["problems"] == ["held-out error up to 30.0 % > 15 % target"]
    v = pm.validation_verdict(3.0, 15.0, n_points=12, n_parameters=11)
    assert v["validated"] and v["problems"] == []
    assert v["text"] == (
        "validated: held-out error up to 3.0 % <= 15 % target on 12 "
        "held-out points for 11 fitted parameters"
    )
    # the points test is left out, and said so, when the parameter count is not known
    v = pm.validation_verdict(3.0, 15.0, n_points=3)
    assert v["validated"] and "number of fitted parameters not given" in v["text"]
    with pytest.raises(ValueError, match="max_abs_error_pct is nan"):
        pm.validation_verdict(float("nan"))


def test_validation_counts_held_out_points_against_fitted_parameters():
    runs = synthetic_runs(noise=0.02, repeats=3, seed=3)
    val = pm.validate(runs, holdout="n_samples")
    assert val.fit.n_fitted_parameters == 11  # 8 work coefficients, alpha, beta, sigma
    assert pm.fit(runs, alpha=TRUTH["alpha"]).n_fitted_parameters == 10
    # within the target, but 4 held-out points for 11 parameters: not a validation
    assert val.within_target and val.n_points == 4 and not val.validated
    doc = val.to_dict()
    assert doc["within_target"] is True and doc["validated"] is False
    assert doc["n_points"] == 4 and doc["n_fitted_parameters"] == 11
    assert doc["verdict"] == (
        f"NOT VALIDATED: checked on 4 held-out points for 11 fitted "
        f"parameters: not a validation (held-out error up to "
        f"{val.max_abs_error_pct:.1f} %, within the 15 % target)"
    )
    assert doc["fit"]["n_fitted_parameters"] == 11
    # three data-set sizes of five worker counts held out: 15 points, within the target
    sizes = (2500, 5000, 10000, 20000, 40000, 80000)
    big = synthetic_runs(workers=(1, 2, 4, 8, 16), sizes=sizes)
    val = pm.validate(big, holdout=lambda r: r["n_samples"] >= 20000)
    assert val.n_points == 15 and val.validated
    assert val.to_dict()["verdict"].startswith("validated: held-out error up to 0.0 % <= 15 %")
    # a model that misses: the verdict names the error first
    slow = [
        dict(r, train_seconds=2 * r["train_seconds"]) if r["n_samples"] >= 20000 else r for r in big
    ]
    doc = pm.validate(slow, holdout=lambda r: r["n_samples"] >= 20000).to_dict()
    assert doc["validated"] is False
    assert doc["verdict"] == "NOT VALIDATED: held-out error up to 50.0 % > 15 % target"


# ------------------------------------------------------------------ projection
def test_projection_rows_and_monotonic_properties():
    model = pm.fit(synthetic_runs())
    workers = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    rows = pm.project(model, workers)
    assert len(rows) == len(pm.NETWORKS) * len(pm.ALGORITHMS) * len(workers)
    json.dumps(rows, allow_nan=False)
    for r in rows:
        assert r["efficiency"] <= 1 + 1e-12
        assert r["speedup"] == pytest.approx(r["efficiency"] * r["workers"])
        if r["workers"] == 1:
            assert r["speedup"] == pytest.approx(1.0)
    by = {(r["network"], r["algorithm"], r["workers"]): r for r in rows}
    for net in pm.NETWORKS:
        for alg in pm.ALGORITHMS:
            eff = [by[net, alg, p]["efficiency"] for p in workers]
            assert all(b <= a + 1e-12 for a, b in zip(eff, eff[1:])), (net, alg)
            # Amdahl: never beyond 1 / serial fraction
            assert max(by[net, alg, p]["speedup"] for p in workers) < 1 / model.serial_fraction
    for alg in pm.ALGORITHMS:
        for p in workers[1:]:
            # a faster network is never slower
            assert (
                by["100 Gb InfiniBand (EDR)", alg, p]["seconds"] < by["10 GbE", alg, p]["seconds"]
            )
    # the flat parameter server falls behind the ring at scale
    assert by["10 GbE", "ps", 256]["seconds"] > 10 * by["10 GbE", "ring", 256]["seconds"]


def test_projection_ring_step_approaches_two_m_beta_for_large_models():
    model = pm.fit(synthetic_runs())
    big = 4e9  # a 1 B-parameter float32 gradient
    eth = pm.NETWORKS["10 GbE"]
    for p in (128, 256):
        pred = model.predict(
            p, 128, batch_size=128, param_bytes=big, algorithm="ring", network=eth, gamma=0.0
        )
        assert pred.config["steps"] == 1
        assert pred.phases["communication"] / (2 * big * eth.beta) == pytest.approx(1, abs=0.01)


def test_projection_arguments():
    model = pm.fit(synthetic_runs())
    own = pm.Network("my cluster", 3e-6, 5e9)
    rows = pm.project(
        model, (1, 4), networks=[own, "25 GbE"], algorithms="tree", n_samples=1000, batch_size=64
    )
    assert [(r["network"], r["algorithm"], r["workers"]) for r in rows] == [
        ("my cluster", "tree", 1),
        ("my cluster", "tree", 4),
        ("25 GbE", "tree", 1),
        ("25 GbE", "tree", 4),
    ]
    assert all(r["n_samples"] == 1000 and r["batch_size"] == 64 for r in rows)
    with pytest.raises(ValueError, match="algorithm is 'mesh'"):
        pm.project(model, (1, 2), algorithms=("ring", "mesh"))
    with pytest.raises(ValueError, match="workers is 0"):
        pm.project(model, (0, 2))
    with pytest.raises(ValueError, match="workers is empty"):
        pm.project(model, ())
    with pytest.raises(ValueError, match="expected a FittedModel"):
        pm.project({"alpha": 1}, (1, 2))


# ------------------------------------------------------------------ break-even
def test_break_even_is_where_speedup_crosses_one():
    model = pm.fit(synthetic_runs())
    for net in pm.NETWORKS:
        for alg in pm.ALGORITHMS:
            for p in (2, 3, 16, 256):
                b = pm.break_even_samples(model, p, net, alg)
                assert isinstance(b, int) and b >= 2

                def speedup(size):
                    one = model.predict(1, size, batch_size=size, algorithm=alg, network=net)
                    many = model.predict(p, size, batch_size=size, algorithm=alg, network=net)
                    return one.seconds / many.seconds

                assert speedup(b) > 1, (net, alg, p, b)
                if b > 2:
                    assert speedup(b - 1) <= 1 + 1e-12, (net, alg, p, b)


def test_break_even_grows_with_latency_and_shrinks_with_bandwidth():
    model = pm.fit(synthetic_runs())
    sizes = [
        pm.break_even_samples(model, 16, pm.Network(f"a{a}", a, 1e9), "ring")
        for a in (1e-6, 1e-5, 1e-4, 1e-3)
    ]
    assert sizes == sorted(sizes) and sizes[-1] > 10 * sizes[0]
    fast = pm.break_even_samples(model, 16, pm.Network("fast", 1e-5, 1e11), "ring")
    slow = pm.break_even_samples(model, 16, pm.Network("slow", 1e-5, 1e8), "ring")
    assert fast < slow
    # more workers of the parameter server need more samples per step
    assert pm.break_even_samples(model, 64, "10 GbE", "ps") > pm.break_even_samples(
        model, 8, "10 GbE", "ps"
    )
    with pytest.raises(ValueError, match="workers is 1, expected 2 or more"):
        pm.break_even_samples(model, 1, "10 GbE", "ring")
    with pytest.raises(ValueError, match="algorithm is 'x'"):
        pm.break_even_samples(model, 4, "10 GbE", "x")


def test_break_even_is_infinite_without_parallel_work():
    truth = dict(TRUTH, data_per_sample=0.0, compute_per_sample=0.0)
    model = pm.fit(synthetic_runs(truth))
    assert model.t_sample == 0.0
    assert pm.break_even_samples(model, 4, "10 GbE", "ring") == math.inf


# ------------------------------------------------------------------ everything as JSON
def test_analyze_and_load_runs(tmp_path):
    runs = synthetic_runs(noise=0.01, seed=4)
    (tmp_path / "sweep.json").write_text(json.dumps({"config": {}, "runs": runs}))
    loaded = pm.load_runs(tmp_path)
    assert loaded == json.loads(json.dumps(runs))
    out = pm.analyze(loaded, workers=(1, 2, 4, 64), networks=["10 GbE", "shared memory"])
    text = json.dumps(out, allow_nan=False)
    doc = json.loads(text)
    assert set(doc) == {"fit", "validation", "projection", "break_even"}
    assert doc["validation"]["within_target"] is True
    assert doc["validation"]["verdict"].startswith("NOT VALIDATED: checked on 4 held-out")
    assert len(doc["projection"]) == 2 * 3 * 4
    assert len(doc["break_even"]) == 2 * 3 * 3
    assert all(r["samples_per_step"] >= 2 for r in doc["break_even"])
    with pytest.raises(ValueError, match="does not exist"):
        pm.load_runs(tmp_path / "nowhere")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'runs' list"):
        pm.load_runs(tmp_path / "bad.json")


# ------------------------------------------------------------------ hierarchical all-reduce
def test_hierarchical_allreduce_cost_by_its_terms():
    eth, shm, m, g = pm.NETWORKS["10 GbE"], pm.NETWORKS["shared memory"], 0.94e6, 3e-11
    # one rank per node: the flat algorithm; one node: the shared-memory ring alone
    for alg in ("ring", "tree"):
        assert pm.hierarchical_allreduce_seconds(alg, 64, m, 1, eth, gamma=g) == pytest.approx(
            pm.allreduce_seconds(alg, 64, m, eth, gamma=g)
        )
        assert pm.hierarchical_allreduce_seconds(alg, 16, m, 16, eth, gamma=g) == pytest.approx(
            pm.allreduce_seconds("ring", 16, m, shm, gamma=g)
        )
    # 256 ranks on 16 nodes: the node's sum and read-out, then a ring over 16 leaders
    want = (
        3 * shm.alpha
        + 15 / 16 * m * (shm.beta + g)
        + m * shm.beta
        + pm.allreduce_seconds("ring", 16, m, eth, gamma=g)
    )
    got = pm.hierarchical_allreduce_seconds("ring", 256, m, 16, eth, gamma=g)
    assert got == pytest.approx(want)
    # 30 fewer inter-node latencies than the flat ring's 2 * 255: far cheaper on Ethernet
    assert got < 0.3 * pm.allreduce_seconds("ring", 256, m, eth, gamma=g)
    # a rank count that does not fill the last node: ceil(p / m) nodes
    assert pm.hierarchical_allreduce_seconds("tree", 20, m, 16, eth, gamma=g) == pytest.approx(
        3 * shm.alpha
        + 15 / 16 * m * (shm.beta + g)
        + m * shm.beta
        + pm.allreduce_seconds("tree", 2, m, eth, gamma=g)
    )
    with pytest.raises(ValueError, match="ranks_per_node is 0, expected a positive integer"):
        pm.hierarchical_allreduce_seconds("ring", 8, m, 0, eth)


def test_projection_shows_flat_and_hierarchical_to_256_workers():
    model = pm.fit(synthetic_runs())
    workers = (1, 2, 16, 64, 256)
    rows = pm.project(
        model, workers, networks=["10 GbE", "100 Gb InfiniBand (EDR)"], ranks_per_node=16
    )
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    assert algs == ["ring", "tree", "ps", "hier-ring", "hier-tree"]
    assert len(rows) == 2 * 5 * len(workers)
    by = {(r["network"], r["algorithm"], r["workers"]): r for r in rows}
    assert all(
        r["ranks_per_node"] == (16 if r["algorithm"].startswith("hier") else None) for r in rows
    )
    for net in ("10 GbE", "100 Gb InfiniBand (EDR)"):
        for alg in ("ring", "tree"):
            assert by[net, f"hier-{alg}", 1]["speedup"] == pytest.approx(1.0)
            for p in (64, 256):
                assert (
                    by[net, f"hier-{alg}", p]["communication_seconds"]
                    < by[net, alg, p]["communication_seconds"]
                )
    with pytest.raises(ValueError, match="no parameter-server form"):
        model.predict(16, algorithm="ps", network="10 GbE", ranks_per_node=4)
    # without ranks_per_node: the flat rows only, as before
    assert len(pm.project(model, workers, networks="10 GbE")) == 3 * len(workers)


def test_local_sgd_prediction_exchanges_every_h_steps():
    model = pm.fit(synthetic_runs())
    n, b, epochs, p = 10000, 128, 2, 8
    per_epoch = -(-n // b)  # 79 steps
    sync = model.predict(p, n, batch_size=b, epochs=epochs)
    assert model.predict(p, n, batch_size=b, epochs=epochs, sync_every=1).phases == sync.phases
    assert sync.phases["average"] == 0.0
    one_exchange = sync.phases["communication"] / (epochs * per_epoch)  # calls_per_step 1
    jitter = model.sigma * pm.expected_max_normal(p)
    uneven = sync.phases["sync_wait"] - epochs * per_epoch * jitter
    for h in (2, 8, 64, 200):
        local = model.predict(p, n, batch_size=b, epochs=epochs, sync_every=h)
        full, rest = divmod(per_epoch, h)
        averages = epochs * (full + (rest > 0))  # every h steps and each epoch's end
        assert local.phases["communication"] == 0.0
        # the parameters and the momentum, each one exchange of param_bytes
        assert local.phases["average"] == pytest.approx(2 * averages * one_exchange, rel=1e-9)
        waits = epochs * (full * math.sqrt(h) + math.sqrt(rest))
        assert local.phases["sync_wait"] == pytest.approx(waits * jitter + uneven, rel=1e-9)
        for ph in ("data", "compute", "update", "other"):  # the same work
            assert local.phases[ph] == pytest.approx(sync.phases[ph], rel=1e-12)
        assert local.seconds == pytest.approx(sum(local.phases.values()), rel=1e-12)
        assert local.seconds < sync.seconds
        assert local.config["sync_every"] == h
    # parameters only: half the bytes; synchronous epochs average every step
    lone = model.predict(p, n, batch_size=b, epochs=epochs, sync_every=8, averaged_arrays=1)
    local = model.predict(p, n, batch_size=b, epochs=epochs, sync_every=8)
    assert lone.phases["average"] == pytest.approx(local.phases["average"] / 2, rel=1e-12)
    post = model.predict(p, n, batch_size=b, epochs=epochs, sync_every=8, local_after=epochs)
    assert post.phases["average"] == pytest.approx(2 * epochs * per_epoch * one_exchange)
    assert post.phases["sync_wait"] == pytest.approx(sync.phases["sync_wait"], rel=1e-12)
    for bad, match in (
        (dict(sync_every=0), "sync_every is 0, expected a positive integer"),
        (dict(sync_every=8, local_after=-1), "local_after is -1, expected an integer >= 0"),
        (dict(sync_every=8, averaged_arrays=True), "averaged_arrays is True"),
        (dict(sync_every=8, algorithm="ps"), "'ps' has no local SGD"),
    ):
        with pytest.raises(ValueError, match=match):
            model.predict(p, n, **bad)


def test_local_sgd_phases_from_a_measured_synchronous_run():
    phases = dict(data=1.0, compute=10.0, communication=2.0, sync_wait=4.0, update=0.5, other=0.1)
    run = {
        "breakdown": {"phase_seconds": phases},
        "steps": 100,
        "epochs": [{}, {}],  # 2 epochs of 50 steps
        "local_sgd": None,
    }
    got = pm.predict_local_run(run, sync_every=8)
    averages = 2 * 7  # 6 full periods and the epoch's end, twice
    p = got["phases"]
    assert p["communication"] == 0.0
    assert p["average"] == pytest.approx(2 * averages * 2.0 / 100)  # 2 arrays, 0.02 s each
    assert p["sync_wait"] == pytest.approx(2 * (6 * math.sqrt(8) + math.sqrt(2)) * 4.0 / 100)
    assert all(p[k] == phases[k] for k in ("data", "compute", "update", "other"))
    assert got["seconds"] == pytest.approx(sum(p.values()))
    assert pm.averages_and_waits(50, 2, 8) == (averages, pytest.approx(2 * (6 * 8**0.5 + 2**0.5)))
    # one period: unchanged; local_after covering the run: an average every step
    assert pm.predict_local_run(run, 1)["phases"] == dict(phases, average=0.0)
    every = pm.predict_local_run(run, 8, local_after=2, averaged_arrays=1)["phases"]
    assert every["average"] == pytest.approx(2.0) and every["sync_wait"] == pytest.approx(4.0)
    # a wait that does not average out stays
    kept = pm.local_sgd_phases(phases, steps_per_epoch=50, epochs=2, sync_every=4, uneven_wait=1.0)
    full = pm.local_sgd_phases(phases, steps_per_epoch=50, epochs=2, sync_every=4)
    assert kept["sync_wait"] - 1.0 == pytest.approx(0.75 * (full["sync_wait"]))
    with pytest.raises(ValueError, match="the run is local SGD's"):
        pm.predict_local_run(dict(run, local_sgd={"averages": 3}), 8)
    with pytest.raises(ValueError, match="101 steps over 2 epochs"):
        pm.predict_local_run(dict(run, steps=101), 8)
    with pytest.raises(ValueError, match="phases has no 'compute'"):
        pm.local_sgd_phases({"data": 1.0}, steps_per_epoch=5, epochs=1, sync_every=2)
    with pytest.raises(ValueError, match="sync_every is 'x'"):
        pm.predict_local_run(run, "x")
