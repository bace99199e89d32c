"""dptrain.sklearn: scikit-learn's check_estimator on every estimator, the estimators on a
real problem (digits), the same weights on 1 and 2 workers (threads, processes, MPI ranks),
dptrain.fit underneath, labels, partial_fit, pickling, parameters and their help."""

import copy
import os
import pickle
import pydoc
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn", minversion="1.6")

from sklearn.base import clone  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import dptrain  # noqa: E402
from dptrain.sklearn import (  # noqa: E402
    CNNClassifier,
    LogisticRegression,
    MLPClassifier,
    MLPRegressor,
    SoftmaxRegression,
)

ROOT = Path(__file__).resolve().parent.parent
CLASSIFIERS = (MLPClassifier, LogisticRegression, SoftmaxRegression, CNNClassifier)


def small(cls, **kw):
    """An estimator small and quick enough for scikit-learn's checks (few epochs, narrow
    layers), still reaching their accuracy bar (0.83 on three blobs)."""
    if cls is MLPClassifier:
        kw = {"hidden_layer_sizes": (16,), **kw}
    if cls is CNNClassifier:  # 2 blob features in a 4x4 image: padding=1 keeps it whole
        kw = {"channels": (4, 8), "hidden_layer_sizes": (16,), "padding": 1, "batch_size": 16, **kw}
    if cls is MLPRegressor:  # the checks' targets reach ~600 unscaled: plain SGD needs
        kw = {
            "hidden_layer_sizes": (16,),
            "max_iter": 100,
            "learning_rate_init": 0.001,
            "batch_size": 32,
            **kw,
        }  # a small step (lr 0.005 diverges there)
    # Adam at 0.01 (0.1 for one layer): scikit-learn's default 0.001 needs more than 20
    # epochs for the checks' bar
    lr = 0.1 if cls in (LogisticRegression, SoftmaxRegression) else 0.01
    return cls(**{"max_iter": 20, "random_state": 0, "learning_rate_init": lr, **kw})


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16.0, y, test_size=0.25, random_state=0, stratify=y)


# ---------------------------------------------------------------- scikit-learn's checks
@pytest.mark.filterwarnings("ignore:.*is larger than the")  # the checks' small data sets
@pytest.mark.filterwarnings("ignore:.*has not converged")
@parametrize_with_checks([cls() for cls in CLASSIFIERS])
def test_check_estimator(estimator, check):
    """Every check passes with the estimators' default parameters: no exemption
    (expected_failed_checks) is declared. Only the array-API check skips itself where
    SCIPY_ARRAY_API is not set (see the next test)."""
    check(estimator)


def test_the_array_api_check_passes_where_scipy_enables_it():
    """The one check skipped above needs SCIPY_ARRAY_API=1 before scipy is imported: run
    it in a fresh interpreter with it."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "check_array_api_input",
            str(Path(__file__)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "SCIPY_ARRAY_API": "1"},
    )
    assert r.returncode == 0 and f"{len(CLASSIFIERS) + 1} passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.filterwarnings("ignore:.*is larger than the")
@pytest.mark.filterwarnings("ignore:.*has not converged")
@parametrize_with_checks([MLPRegressor()])
def test_check_estimator_regressor(estimator, check):
    """The regressor passes every check too, with its defaults (MSE through the C engine)."""
    check(estimator)


@pytest.mark.parametrize("cls", CLASSIFIERS + (MLPRegressor,))
def test_a_samples_outputs_are_the_same_bits_in_any_batch(cls, digits):
    """Batch-invariant inference: a sample's outputs do not depend on the batch it is
    evaluated in (alone, in chunks, in another order), in float32 and float64."""
    X_train, X_test, y_train, _ = digits
    for dtype in ("float32", "float64"):
        est = cls(max_iter=2, random_state=0, dtype=dtype).fit(X_train, y_train)
        methods = ["predict"] + [
            m for m in ("decision_function", "predict_proba") if hasattr(est, m)
        ]
        X = X_test[:97]
        order = np.random.default_rng(0).permutation(len(X))
        for m in methods:
            f = getattr(est, m)
            full = f(X)
            alone = np.concatenate([f(X[i : i + 1]) for i in range(len(X))])
            chunks = np.concatenate([f(X[i : i + 13]) for i in range(0, len(X), 13)])
            shuffled = np.empty_like(full)
            shuffled[order] = f(X[order])
            for other in (alone, chunks, shuffled):
                assert np.array_equal(other, full), (cls.__name__, dtype, m)


def test_regressor_fits_a_smooth_function_as_well_as_sklearns():
    """y = sin(x0) + x1^2 / 2 + noise: dptrain's MLPRegressor reaches an R^2 within 0.05 of
    scikit-learn's own MLPRegressor with the same layers, solver (SGD) and epochs."""
    from sklearn.neural_network import MLPRegressor as SkMLPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(2000, 2))
    y = np.sin(X[:, 0]) + X[:, 1] ** 2 / 2 + rng.normal(0, 0.05, size=len(X))
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    ours = MLPRegressor(hidden_layer_sizes=(32, 32), max_iter=60, random_state=0)
    ours.fit(Xtr, ytr)
    assert ours.model_.loss == "mse"  # trained through the C engine's MSE
    theirs = SkMLPRegressor(
        hidden_layer_sizes=(32, 32),
        solver="sgd",
        max_iter=60,
        learning_rate_init=ours.learning_rate_init,
        momentum=ours.momentum,
        batch_size=ours.batch_size if isinstance(ours.batch_size, int) else "auto",
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn: not converged in 60 epochs
        theirs.fit(Xtr, ytr)
    r2, r2_sk = ours.score(Xte, yte), theirs.score(Xte, yte)
    assert ours.predict(Xte).shape == (len(Xte),)
    assert r2 > 0.9 and r2 > r2_sk - 0.05, (r2, r2_sk)
    # two targets at once: (n, 2) in, (n, 2) out
    Y = np.stack([y, -y], axis=1)
    two = MLPRegressor(hidden_layer_sizes=(32,), max_iter=40, random_state=0).fit(X, Y)
    assert two.predict(X[:5]).shape == (5, 2) and two.score(X, Y) > 0.8


def test_import_dptrain_does_not_import_sklearn():
    code = "import sys, dptrain; print('sklearn' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# ---------------------------------------------------------------- a real problem
@pytest.mark.parametrize(
    "est, floor",
    [
        (MLPClassifier(max_iter=30, learning_rate_init=0.01, random_state=0), 0.95),
        (LogisticRegression(max_iter=30, learning_rate_init=0.01, random_state=0), 0.93),
        (SoftmaxRegression(max_iter=30, learning_rate_init=0.01, random_state=0), 0.93),
        (
            CNNClassifier(
                channels=(8, 16),
                padding=1,
                batch_size=32,
                max_iter=10,
                learning_rate_init=0.005,
                random_state=0,
            ),
            0.95,
        ),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, float) else "",
)
def test_digits(digits, est, floor):
    X_train, X_test, y_train, y_test = digits
    est.fit(X_train, y_train)
    assert est.score(X_test, y_test) >= floor
    assert est.n_iter_ == len(est.loss_curve_) == len(est.history_) <= est.max_iter
    assert est.loss_curve_[-1] < est.loss_curve_[0]
    proba = est.predict_proba(X_test)
    assert proba.dtype == np.float64 and proba.shape == (len(X_test), 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(est.classes_[proba.argmax(axis=1)], est.predict(X_test))


def test_cnn_takes_images_as_they_come(digits):
    """(n, H, W) and (n, C, H, W) images are the same as flat rows of a square image."""
    X_train, X_test, y_train, _ = digits
    flat = small(CNNClassifier, max_iter=2).fit(X_train, y_train)
    assert flat.input_shape_ == (1, 8, 8) and flat.image_shape_ == (1, 8, 8)
    gray = small(CNNClassifier, max_iter=2).fit(X_train.reshape(-1, 8, 8), y_train)
    chw = small(CNNClassifier, max_iter=2).fit(X_train.reshape(-1, 1, 8, 8), y_train)
    for est in (gray, chw):
        assert est.input_shape_ == (1, 8, 8) and est.n_features_in_ == 64
        np.testing.assert_array_equal(est.model_.params, flat.model_.params)
    np.testing.assert_array_equal(gray.predict(X_test.reshape(-1, 8, 8)), flat.predict(X_test))
    with pytest.raises(ValueError, match=r"images of shape \(1, 4, 16\).*fitted on \(1, 8, 8\)"):
        gray.predict(X_test.reshape(-1, 4, 16))


def test_cnn_reads_tabular_rows_as_a_padded_square_image():
    X = np.arange(12.0).reshape(2, 6)
    y = np.array([0, 1])
    est = CNNClassifier(channels=(2,), hidden_layer_sizes=(), max_iter=1, random_state=0)
    est.fit(X, y)
    # 6 features: a 3x3 image (zeros after them), padded to the 4x4 a 3x3 kernel needs
    assert est.input_shape_ == (1, 3, 3) and est.image_shape_ == (1, 4, 4)
    rows = est._rows(X, reset=False)
    image = rows.reshape(2, 4, 4)
    np.testing.assert_array_equal(image[1, :3, :3].ravel(), [6, 7, 8, 9, 10, 11, 0, 0, 0])
    assert not image[:, 3, :].any() and not image[:, :, 3].any()
    est = CNNClassifier(input_shape=(3, 1, 2), channels=(2,), padding=1, max_iter=1)
    est.fit(X, y)
    assert est.input_shape_ == (3, 1, 2) and est.image_shape_ == (3, 2, 2)


# ---------------------------------------------------------------- one engine underneath
@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("cls", [MLPClassifier, LogisticRegression, CNNClassifier])
def test_two_workers_give_the_weights_of_one(digits, cls, backend):
    X_train, _, y_train, _ = digits
    if cls is LogisticRegression:  # the binary (sigmoid) model
        keep = y_train < 2
        X_train, y_train = X_train[keep], y_train[keep]
    one = small(cls, max_iter=3, batch_size=64, dtype="float64").fit(X_train, y_train)
    two = small(cls, max_iter=3, batch_size=64, dtype="float64", workers=2, backend=backend).fit(
        X_train, y_train
    )
    np.testing.assert_allclose(two.model_.params, one.model_.params, rtol=0, atol=1e-5)
    np.testing.assert_allclose(two.loss_curve_, one.loss_curve_, rtol=1e-6)


def test_float32_deterministic_mode_is_bitwise(digits):
    X_train, _, y_train, _ = digits
    kw = dict(max_iter=2, batch_size=64, engine_options={"deterministic": True})
    one = small(MLPClassifier, **kw).fit(X_train, y_train)
    two = small(MLPClassifier, workers=2, backend="thread", **kw).fit(X_train, y_train)
    np.testing.assert_array_equal(two.model_.params, one.model_.params)


def test_mpi_ranks_are_all_fitted(tmp_path):
    mpiexec = shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        pytest.skip("MPI needs mpi4py and mpiexec")
    script = tmp_path / "fit.py"
    script.write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "from sklearn.datasets import load_digits\n"
        "from dptrain.sklearn import MLPClassifier\n"
        "X, y = load_digits(return_X_y=True)\n"
        "est = MLPClassifier((16,), max_iter=2, random_state=0, dtype='float64').fit(X / 16, y)\n"
        "with open(f'{sys.argv[1]}/rank{MPI.COMM_WORLD.Get_rank()}.txt', 'w') as f:\n"
        "    f.write(f'{float(est.model_.params.sum())!r} {len(est.history_)}')\n"
    )
    r = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [(tmp_path / f"rank{i}.txt").read_text().split() for i in range(2)]
    X, y = load_digits(return_X_y=True)
    alone = MLPClassifier((16,), max_iter=2, random_state=0, dtype="float64").fit(X / 16, y)
    for total, epochs in ranks:  # every rank holds the model and the history
        assert int(epochs) == 2
        assert abs(float(total) - alone.model_.params.sum()) < 1e-6, ranks


def test_the_estimator_is_dptrain_fit_with_its_options(digits):
    """random_state is dptrain's seed and the parameters are TrainConfig's options: the
    estimator's model is the one dptrain.fit trains on the encoded labels."""
    X_train, _, y_train, _ = digits
    labels = np.array(list("abcdefghij"))[y_train]
    est = MLPClassifier(
        (32,),
        solver="sgd",
        learning_rate_init=0.02,
        max_iter=2,
        batch_size=50,
        momentum=0.8,
        nesterovs_momentum=False,
        alpha=1e-3,
        random_state=7,
    ).fit(X_train, labels)
    model = dptrain.MLP([64, 32, 10], seed=7)
    result = dptrain.fit(
        model,
        X_train,
        y_train,
        epochs=2,
        batch_size=50,
        lr=0.02,
        lr_schedule="constant",
        momentum=0.8,
        weight_decay=1e-3,
        seed=7,
        quiet=True,
        progress=False,
    )
    np.testing.assert_array_equal(est.model_.params, model.params)
    assert est.loss_curve_ == result["train_loss"]
    assert list(est.classes_) == list("abcdefghij")
    # the default solver: Adam with scikit-learn's names for its options
    est = MLPClassifier(
        (32,), max_iter=2, batch_size=50, beta_1=0.8, beta_2=0.99, epsilon=1e-6, random_state=7
    ).fit(X_train, labels)
    model = dptrain.MLP([64, 32, 10], seed=7)
    dptrain.fit(
        model,
        X_train,
        y_train,
        optimizer="adam",
        betas=(0.8, 0.99),
        eps=1e-6,
        epochs=2,
        batch_size=50,
        lr=0.001,
        lr_schedule="constant",
        weight_decay=1e-4,
        seed=7,
        quiet=True,
    )
    np.testing.assert_array_equal(est.model_.params, model.params)


# ---------------------------------------------------------------- labels and probabilities
def test_binary_logistic_probabilities_are_the_sigmoid_in_float64():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 5))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, "yes", "no")
    est = LogisticRegression(
        max_iter=10, batch_size=20, learning_rate_init=0.1, random_state=0
    ).fit(X, y)
    assert est.model_.n_outputs == 1 and list(est.classes_) == ["no", "yes"]
    z = est.model_.logits(X.astype(np.float32))[:, 0].astype(np.float64)
    np.testing.assert_allclose(est.decision_function(X), z)
    np.testing.assert_allclose(est.predict_proba(X)[:, 1], 1 / (1 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_array_equal(est.predict(X), np.where(z > 0, "yes", "no"))
    assert est.score(X, y) > 0.95
    big = LogisticRegression(max_iter=1).fit(X * 1e3, y)  # saturated logits stay exact
    logp = big.predict_log_proba(X * 1e3)
    assert np.isfinite(logp).all()
    np.testing.assert_allclose(np.exp(logp).sum(axis=1), 1.0)


def test_unknown_and_single_labels():
    X = np.random.default_rng(2).normal(size=(30, 4))
    y = np.repeat([3, 7, 9], 10)
    est = small(SoftmaxRegression).fit(X, y)
    assert list(est.classes_) == [3, 7, 9] and est.model_.n_outputs == 3
    with pytest.raises(ValueError, match="1 class"):
        small(SoftmaxRegression).fit(X, np.full(30, 3))
    with pytest.raises(ValueError, match="Unknown label type"):
        small(SoftmaxRegression).fit(X, X[:, 0])


# ---------------------------------------------------------------- partial_fit, warm_start
def test_partial_fit_is_one_epoch_more():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(90, 4))
    y = np.repeat(["a", "b", "c"], 30)
    est = small(MLPClassifier)
    with pytest.raises(ValueError, match="classes must be given"):
        est.partial_fit(X, y)
    est.partial_fit(X[:30], y[:30], classes=["a", "b", "c"])  # a batch of one class
    assert est.n_iter_ == 1 and len(est.loss_curve_) == 1
    before = est.model_.params.copy()
    est.partial_fit(X, y)
    assert est.n_iter_ == 2 and [h["epoch"] for h in est.history_] == [1, 2]
    assert not np.array_equal(before, est.model_.params)
    with pytest.raises(ValueError, match="label 'd'"):
        est.partial_fit(X[:2], ["a", "d"])
    with pytest.raises(ValueError, match="expecting 4 features"):
        est.partial_fit(X[:, :3], y)
    assert est.n_iter_ == 2  # a refused call changed nothing


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_partial_fit_continues_the_optimizer_as_one_fit(solver):
    """Two partial_fit calls are one 2-epoch fit, bit for bit: the second continues Adam's
    moments and step count (or SGD's velocity), as scikit-learn's partial_fit does."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 4))
    y = (X[:, 0] - X[:, 1] > 0).astype(int)
    kw = dict(solver=solver, shuffle=False, batch_size=20, tol=0.0, n_iter_no_change=5)
    whole = small(MLPClassifier, max_iter=2, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 2 epochs do not converge
        whole.fit(X, y)
    parts = small(MLPClassifier, **kw)
    parts.partial_fit(X, y, classes=[0, 1]).partial_fit(X, y)
    np.testing.assert_array_equal(parts.model_.params, whole.model_.params)
    # a change of solver between calls starts a new optimizer, which trains on
    parts.set_params(solver="adamw" if solver == "adam" else "adam").partial_fit(X, y)
    assert parts.n_iter_ == 3


def test_warm_start_continues_and_a_plain_fit_starts_again():
    X = np.random.default_rng(4).normal(size=(60, 4))
    y = (X[:, 0] > 0).astype(int)
    est = small(LogisticRegression, max_iter=3, warm_start=True).fit(X, y)
    first = est.model_
    est.fit(X, y)
    assert est.model_ is first and est.n_iter_ == 6 and len(est.loss_curve_) == 6
    est.set_params(warm_start=False).fit(X, y)
    assert est.model_ is not first and est.n_iter_ == 3


def test_same_random_state_same_model_and_none_draws_one():
    X = np.random.default_rng(5).normal(size=(60, 4))
    y = (X[:, 0] > 0).astype(int)
    a = small(MLPClassifier).fit(X, y)
    b = small(MLPClassifier).fit(X, y)
    np.testing.assert_array_equal(a.model_.params, b.model_.params)
    c = small(MLPClassifier, random_state=None).fit(X, y)
    d = small(MLPClassifier, random_state=None).fit(X, y)
    assert not np.array_equal(c.model_.params, d.model_.params)


# ---------------------------------------------------------------- parameters, pickle, help
def test_params_round_trip_through_clone_and_set_params():
    est = CNNClassifier(
        (1, 8, 8), channels=(4,), workers=2, backend="process", engine_options={"timeout": 30.0}
    )
    params = est.get_params()
    assert params["workers"] == 2 and params["backend"] == "process"
    twin = clone(est)
    assert twin is not est and twin.get_params() == params
    twin.set_params(max_iter=3, channels=(2, 4), backend=None)
    assert twin.get_params() == {**params, "max_iter": 3, "channels": (2, 4), "backend": None}
    with pytest.raises(ValueError, match="Invalid parameter 'epochs'"):
        twin.set_params(epochs=3)
    assert repr(MLPClassifier(workers=2)) == "MLPClassifier(workers=2)"


@pytest.mark.parametrize(
    "param, value, message",
    [
        ("learning_rate_init", 0.0, "learning_rate_init must be a finite number in \\(0"),
        ("max_iter", 0, "max_iter must be an integer >= 1"),
        ("batch_size", "big", "batch_size must be an integer"),
        ("momentum", 1.0, "momentum must be"),
        ("learning_rate", "adaptive", "learning_rate must be one of 'constant', 'cosine'"),
        ("backend", "gpu", "backend must be one of thread, process, mpi or None"),
        ("dtype", "float16", "dtype must be one of float32, float64"),
        ("random_state", -1, "random_state must be an int >= 0"),
        ("hidden_layer_sizes", (16, 0), "hidden_layer_sizes must be a sequence of positive"),
        ("engine_options", {"lr": 1.0}, "engine_options may not set lr"),
    ],
)
def test_bad_parameters_are_named(param, value, message):
    X = np.random.default_rng(6).normal(size=(20, 3))
    y = np.arange(20) % 2
    with pytest.raises(ValueError, match=message):
        MLPClassifier(**{param: value}).fit(X, y)


def test_engine_options_hold_out_a_validation_split(digits):
    X_train, _, y_train, _ = digits
    est = small(MLPClassifier, max_iter=2, engine_options={"validation": 0.2})
    est.fit(X_train, y_train)
    cut = len(X_train) - int(0.2 * len(X_train) + 0.5)  # the last rows are held out
    assert all(h["test_accuracy"] is not None for h in est.history_)
    assert est.history_[-1]["test_accuracy"] == pytest.approx(
        est.score(X_train[cut:], y_train[cut:])
    )


def test_unknown_engine_option_lists_the_known_ones():
    X = np.random.default_rng(6).normal(size=(20, 3))
    with pytest.raises(TypeError, match="unknown option.*allreduce"):
        small(MLPClassifier, engine_options={"all_reduce": "ring"}).fit(X, np.arange(20) % 2)


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_pickle_keeps_the_model_and_training_goes_on(cls, digits):
    X_train, X_test, y_train, _ = digits
    est = small(cls, max_iter=2).fit(X_train, y_train)
    back = pickle.loads(pickle.dumps(est))
    assert back.model_ is not est.model_
    np.testing.assert_array_equal(back.model_.params, est.model_.params)
    np.testing.assert_array_equal(back.model_.velocity, est.model_.velocity)
    np.testing.assert_array_equal(back.predict_proba(X_test), est.predict_proba(X_test))
    assert back.loss_curve_ == est.loss_curve_ and back.n_iter_ == 2
    est.partial_fit(X_train, y_train)
    back.partial_fit(X_train, y_train)
    np.testing.assert_array_equal(back.model_.params, est.model_.params)
    deep = copy.deepcopy(est)
    np.testing.assert_array_equal(deep.predict(X_test), est.predict(X_test))
    assert "model_" in est.__dict__ and isinstance(est.model_, dptrain.Model)  # unchanged


@pytest.mark.parametrize("cls", CLASSIFIERS + (MLPRegressor,))
def test_help_shows_every_parameter(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for name, default in cls().get_params().items():
        assert f"{name} : " in text and f"default={default!r}" in text, name
    for attribute in ("n_iter_", "loss_curve_", "model_", "history_"):
        assert attribute in text


# ---------------------------------------------------------------- input and output
def test_quiet_by_default_and_verbose_prints_the_epochs(capsys):
    X = np.random.default_rng(7).normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(int)
    small(LogisticRegression, max_iter=2).fit(X, y)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    small(LogisticRegression, max_iter=2, verbose=1).fit(X, y)
    out = capsys.readouterr()
    assert "epoch 1/2" in out.out and "epoch 2/2" in out.out


def test_sparse_input_is_refused_with_a_clear_error():
    sparse = pytest.importorskip("scipy.sparse")
    X = sparse.random(20, 5, density=0.3, format="csr", random_state=0)
    with pytest.raises(TypeError, match="Sparse data was passed.*dense data is required"):
        small(MLPClassifier).fit(X, np.arange(20) % 2)


def test_dataframe_feature_names():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(8)
    frame = pd.DataFrame(rng.normal(size=(40, 3)), columns=["a", "b", "c"])
    y = (frame["a"] > 0).astype(int)
    est = small(SoftmaxRegression).fit(frame, y)
    assert list(est.feature_names_in_) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="feature names"):
        est.predict(frame[["c", "b", "a"]])


def test_batch_size_larger_than_the_data_is_clipped_with_a_warning():
    X = np.random.default_rng(9).normal(size=(30, 3))
    with pytest.warns(UserWarning, match="batch_size=64 is larger than the 30 samples"):
        est = small(LogisticRegression, batch_size=64, max_iter=1).fit(X, np.arange(30) % 2)
    assert est.n_iter_ == 1
