"""The estimators on data as users bring it: scikit-learn's bundled real data sets, unscaled.

Their defaults are scikit-learn's (Adam at 0.001, tol / n_iter_no_change stopping), so they
must score as scikit-learn's own MLP does with its defaults, on the same folds; and when
training goes wrong on unscaled features, the warning names the features' span and the fix.
"""

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the estimators need scikit-learn (the test extra)")

from sklearn import datasets  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.model_selection import cross_val_score  # noqa: E402
from sklearn.neural_network import MLPClassifier as SkMLPClassifier  # noqa: E402
from sklearn.neural_network import MLPRegressor as SkMLPRegressor  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from dptrain.sklearn import MLPClassifier, MLPRegressor, SoftmaxRegression  # noqa: E402

pytestmark = pytest.mark.slow  # cross-validated fits of scikit-learn's MLP beside ours

SHARED = (
    "solver",
    "learning_rate_init",
    "max_iter",
    "batch_size",
    "momentum",
    "nesterovs_momentum",
    "beta_1",
    "beta_2",
    "epsilon",
    "tol",
    "n_iter_no_change",
    "alpha",
    "shuffle",
    "warm_start",
    "hidden_layer_sizes",
)


@pytest.mark.parametrize(
    "ours, theirs", [(MLPClassifier, SkMLPClassifier), (MLPRegressor, SkMLPRegressor)]
)
def test_defaults_are_scikit_learns(ours, theirs):
    mine, sk = ours().get_params(), theirs().get_params()
    assert {k: mine[k] for k in SHARED} == {k: sk[k] for k in SHARED}


# On raw data one initialization can land badly (scikit-learn's own MLP on wine scores 0.59
# for one seed, 0.89 for another): each side is the mean of 5-fold scores over several seeds.
RAW_SETS = [
    ("breast_cancer", MLPClassifier, SkMLPClassifier, 8),
    ("wine", MLPClassifier, SkMLPClassifier, 12),
    ("iris", MLPClassifier, SkMLPClassifier, 6),
    ("digits", MLPClassifier, SkMLPClassifier, 2),
    ("diabetes", MLPRegressor, SkMLPRegressor, 6),
]


@pytest.mark.parametrize("name, ours, theirs, seeds", RAW_SETS, ids=[s[0] for s in RAW_SETS])
def test_raw_data_scores_as_scikit_learns_mlp_does(name, ours, theirs, seeds):
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    scores = {}
    # one BLAS thread: scikit-learn's small matrix products are slower on several here
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both sides' ConvergenceWarnings, our scale advice
        for side, cls in (("ours", ours), ("scikit-learn", theirs)):
            scores[side] = np.mean(
                [cross_val_score(cls(random_state=s), X, y, cv=5).mean() for s in range(seeds)]
            )
    print(f"{name}: {scores}")
    assert scores["ours"] >= scores["scikit-learn"] - 0.03, scores


def breast_cancer():
    return datasets.load_breast_cancer(return_X_y=True)


def test_sgd_on_unscaled_features_warns_with_their_span_and_the_fix():
    X, y = breast_cancer()
    with pytest.warns(UserWarning, match=r"features span 0\.\.4,254: scale them.*StandardScaler"):
        MLPClassifier(solver="sgd", learning_rate_init=0.05, max_iter=20, random_state=0).fit(X, y)


def test_scaled_features_train_without_a_scale_warning():
    X, y = breast_cancer()
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = MLPClassifier(random_state=0).fit(X, y)
    assert est.score(X, y) > 0.97


def test_a_stall_at_one_class_is_named():
    # a large SGD rate on raw features: every row ends predicted as one class
    X, y = breast_cancer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = MLPClassifier(
            solver="sgd", learning_rate_init=0.05, momentum=0.9, max_iter=30, random_state=0
        ).fit(X, y)
    if len(np.unique(est.predict(X))) == 1:
        assert any(
            "training stalled: every training row is predicted" in str(w.message) for w in caught
        )
    else:  # then the loss exploded in the first epoch: that warning instead
        assert any("first epoch's training loss" in str(w.message) for w in caught)


def test_divergence_names_the_cause():
    X, y = datasets.load_diabetes(return_X_y=True)
    with pytest.raises(FloatingPointError, match=r"training diverged.*scale them"):
        MLPRegressor(solver="sgd", learning_rate_init=0.1, max_iter=5, random_state=0).fit(
            X * 1000, y
        )


def test_max_iter_reached_is_a_convergence_warning_and_tol_stops_early():
    X, y = breast_cancer()
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    with pytest.warns(ConvergenceWarning, match="max_iter=3"):
        MLPClassifier(max_iter=3, random_state=0).fit(X, y)
    est = MLPClassifier(max_iter=500, tol=1e-2, n_iter_no_change=2, random_state=0).fit(X, y)
    assert est.n_iter_ == len(est.loss_curve_) < 500


def test_lbfgs_is_refused_with_what_to_use():
    X, y = breast_cancer()
    with pytest.raises(ValueError, match="solver='lbfgs'.*use 'adam'"):
        MLPClassifier(solver="lbfgs").fit(X, y)


@pytest.mark.parametrize("solver", ["adam", "adamw", "sgd"])
def test_every_solver_trains(solver):
    X, y = breast_cancer()
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    est = MLPClassifier((16,), solver=solver, learning_rate_init=0.01, max_iter=20, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_params(random_state=0).fit(X, y)
    assert est.history_ and est.score(X, y) > 0.95


@pytest.mark.parametrize("name, floor", [("iris", 0.95), ("digits", 0.9)])
def test_one_layer_models_train_on_raw_data(name, floor):
    """LogisticRegression / SoftmaxRegression's defaults (Adam at 0.01, up to 1000 epochs)
    on raw data; with 0.001 and 100 epochs iris scored 0.45."""
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        score = cross_val_score(SoftmaxRegression(random_state=0), X, y, cv=5).mean()
    assert score >= floor


def test_no_better_than_the_majority_class_is_named():
    # noise features of scale 1000, 68 % of one class: after 3 epochs the predictions are a
    # mix of both classes, right less often than the majority class alone
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 5)) * 1000, (rng.random(300) < 0.3).astype(int)
    with pytest.warns(UserWarning, match=r"not beaten the majority class.*features span"):
        SoftmaxRegression(max_iter=3, random_state=0).fit(X, y)
    assert len(np.unique(SoftmaxRegression(max_iter=3, random_state=0).fit(X, y).predict(X))) == 2
