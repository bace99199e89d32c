"""Options as the user typed them: the command line's errors name the flag (the Python API's,
the keyword), options that would be silently ignored are refused naming both, a resumed
run's refusal names what the user changed, the header names the optimizer's options, and a
worker's failure names no place inside dptrain."""

import numpy as np
import pytest
from _runs import SMALL, SMALL_FLAGS

import dptrain
from dptrain import cli
from dptrain.comm.base import check_flat, describe
from dptrain.config import OptionError, TrainConfig, cli_message


def _cli(capsys, *flags):
    """train with SMALL's flags and these: (exit code, stderr)."""
    try:
        rc = cli.main(["train", *SMALL_FLAGS, *flags])
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    return rc, capsys.readouterr().err


# ---------------------------------------------------------------- errors name the flag
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--betas", "1", "0.9", "--optimizer", "adam"], "--betas must be a number in [0, 1)"),
        (["--hidden", "0"], "--hidden must hold positive integer widths"),
        (["--threads", "1000"], "--threads must be in [1, "),
        (["--save-weights", "nodir/w.npz"], "--save-weights nodir/w.npz: the directory"),
        (["--comm-dtype", "bfloat16", "--dtype", "float64"], "--comm-dtype bfloat16 needs"),
    ],
)
def test_cli_errors_name_the_flag_not_the_field(capsys, flags, message):
    rc, err = _cli(capsys, *flags)
    assert rc == 1 and err.startswith("dptrain: error: ") and message in err, err
    assert "betas[0]" not in err and "save_weights" not in err and "hidden size" not in err


def test_lr_has_one_message_for_every_refused_value(capsys):
    errs = [_cli(capsys, "--lr", v) for v in ("-1", "0", "nan", "x")]
    assert {rc for rc, _ in errs} == {2}
    assert all("argument --lr: expected a finite number > 0, got" in e for _, e in errs), errs
    for lr in (-1.0, 0.0):
        with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, got"):
            TrainConfig(lr=lr)


def test_the_api_names_the_field_and_the_error_carries_it():
    with pytest.raises(OptionError, match=r"^threads must be in \[1, ") as info:
        TrainConfig(threads=1000)
    assert info.value.option == "threads" and isinstance(info.value, ValueError)
    assert cli_message(info.value).startswith("--threads must be in [1, ")
    with pytest.raises(OptionError) as info:
        TrainConfig(optimizer="adam", betas=(1.0, 0.9))
    assert info.value.option == "betas" and str(info.value).startswith("betas[0]")
    assert cli_message(info.value).startswith("--betas must be")
    # a message that does not start with its option's name still names the flag
    assert cli_message(OptionError("workers", "too many")) == "--workers: too many"


@pytest.mark.parametrize("name", ["shuffle", "nesterov", "overlap", "elastic", "deterministic"])
@pytest.mark.parametrize("value", ["False", "no", 2, None])
def test_a_switch_takes_a_bool_not_a_truthy_value(name, value):
    # fit(shuffle="False") shuffled (a new user's trial): a non-empty string is truthy
    with pytest.raises(OptionError, match=rf"^{name} must be True or False, got {value!r}$"):
        TrainConfig(**{name: value})


@pytest.mark.parametrize("name", ["checkpoint", "resume", "out", "save_weights"])
@pytest.mark.parametrize("value", [123, "", b"run.npz", ["run.npz"]])
def test_a_path_option_takes_a_path(name, value):
    # checkpoint=123 wrote a file named 123; resume="" was ignored (a new user's trial)
    with pytest.raises(OptionError, match=rf"^{name} must be a file path \(str or os.PathLike\)"):
        TrainConfig(**{name: value})


def test_a_switch_takes_numpys_bool_and_0_or_1_as_bools():
    config = TrainConfig(shuffle=np.bool_(False), nesterov=1)
    assert config.shuffle is False and config.nesterov is True


# ---------------------------------------------------------------- silently ignored: refused
@pytest.mark.parametrize(
    "flags, names",
    [
        (["--optimizer", "adam", "--momentum", "0.9"], ("--momentum 0.9", "--optimizer adam")),
        (["--optimizer", "adamw", "--momentum", "0.5"], ("--momentum 0.5", "--optimizer adamw")),
        (["--n-iter-no-change", "2"], ("--n-iter-no-change 2", "tol")),
        (["--start-method", "spawn", "--backend", "thread"], ("--start-method", "--backend")),
        (["--start-method", "fork"], ("--start-method fork", "--backend None")),
        (["--label-column", "3"], ("--label-column", "--dataset synthetic")),
        (["--csv-header", "yes"], ("--csv-header", "--dataset synthetic")),
        (["--validation", "0.2"], ("--validation", "--dataset synthetic")),
        (["--test-x", "x.npy"], ("--test-x", "--dataset synthetic")),
    ],
)
def test_an_option_that_would_be_ignored_is_refused_naming_both(capsys, flags, names):
    rc, err = _cli(capsys, *flags)
    assert rc == 1 and err.count("\n") == 1, err
    assert all(n in err for n in names), err


def test_an_empty_hidden_width_is_refused(capsys):
    for text in ("8,,4", "8,", ",8"):
        rc, err = _cli(capsys, "--hidden", text)
        assert rc == 2 and "argument --hidden:" in err and "is empty" in err, err


def test_dataset_and_a_file_of_ones_own_are_refused_together(capsys, tmp_path):
    path = tmp_path / "d.npz"
    X = np.random.default_rng(0).standard_normal((40, 3))
    np.savez(path, X=X, y=(X[:, 0] > 0).astype(int))
    rc, err = _cli(capsys, "--data", str(path))  # SMALL's flags name --dataset synthetic
    assert rc == 1 and "--dataset synthetic and --data both name the training data" in err
    flags = [f for f in SMALL_FLAGS if f not in ("--dataset", "synthetic")]
    assert cli.main(["train", *flags, "--data", str(path), "--epochs", "1"]) == 0


def test_momentum_and_n_iter_no_change_defaults_depend_on_what_uses_them():
    sgd, adam = TrainConfig(), TrainConfig(optimizer="adam")
    assert (sgd.momentum, adam.momentum) == (0.9, None)
    assert TrainConfig(momentum=0.0).momentum == 0.0
    with pytest.raises(ValueError, match="momentum=0.9 is not an option of optimizer='adam'"):
        TrainConfig(optimizer="adam", momentum=0.9)
    assert TrainConfig().n_iter_no_change is None
    assert TrainConfig(tol=1e-3).n_iter_no_change == 10
    assert TrainConfig(tol=1e-3, n_iter_no_change=3).n_iter_no_change == 3
    with pytest.raises(ValueError, match="^n_iter_no_change=3 counts"):
        TrainConfig(n_iter_no_change=3)
    assert TrainConfig(workers=2, backend="process", start_method="spawn").start_method
    with pytest.raises(ValueError, match="^start_method='spawn' says how the process"):
        TrainConfig(workers=2, backend="thread", start_method="spawn")


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("validation", [7, 1.5, 0, -0.1, True, "0.1"])
def test_validation_out_of_range_is_refused_for_every_data_set(validation):
    with pytest.raises(ValueError, match="must be a fraction between 0 and 1"):
        dptrain.train(**{**SMALL, "validation": validation})


def test_validation_is_refused_with_a_named_data_set_or_a_dataset(capsys):
    with pytest.raises(ValueError, match="named data set 'synthetic', which has its own test"):
        dptrain.train(**{**SMALL, "validation": 0.2})
    rc, err = _cli(capsys, "--validation", "1.5")
    assert rc == 2 and "argument --validation: expected a fraction between 0 and 1" in err


# ---------------------------------------------------------------- resume names the cause
def test_resume_with_another_optimizer_names_the_optimizer(train_small, tmp_path):
    ckpt = str(tmp_path / "ck.npz")
    train_small(epochs=1, checkpoint=ckpt, checkpoint_every=5, lr=None)
    with pytest.raises(ValueError, match=r"optimizer='sgd', but this run has optimizer='adam'"):
        train_small(epochs=1, resume=ckpt, optimizer="adam", lr=None)
    # another data set (of the same shape) is named too
    with pytest.raises(ValueError, match=r"on another data set"):
        train_small(epochs=1, resume=ckpt, n_samples=1100, lr=None)


# ---------------------------------------------------------------- the header
@pytest.mark.parametrize(
    "options, shown",
    [
        (dict(optimizer="adamw"), "adamw betas (0.9, 0.999), eps 1e-08, weight decay 0.01"),
        (dict(optimizer="adam"), "adam betas (0.9, 0.999), eps 1e-08, 1 worker"),
        (dict(nesterov=True, weight_decay=0.001), "sgd momentum 0.9 (nesterov), weight decay"),
        (
            dict(optimizer="rmsprop", rms_alpha=0.9, momentum=0.5, centered=True),
            "rmsprop alpha 0.9, eps 1e-08, momentum 0.5, centered, 1 worker",
        ),
    ],
)
def test_the_header_names_the_optimizer_and_its_options(train_small, options, shown):
    lines = []
    train_small(epochs=1, limit=200, quiet=False, progress=False, log=lines.append, **options)
    assert shown in lines[0], lines[0]


# ---------------------------------------------------------------- worker failures
def _users_code():
    raise RuntimeError("in the user's code")


def test_a_failure_names_a_place_only_in_the_users_code():
    try:
        check_flat([1.0])  # raised inside dptrain
    except TypeError as exc:
        inside = describe(exc)
    assert inside == "TypeError: array must be a numpy.ndarray, got list", inside
    try:
        _users_code()
    except RuntimeError as exc:
        mine = describe(exc)
    assert mine.startswith("RuntimeError: in the user's code (at ") and "test_options.py:" in mine
