"""The engine's small run, shared by the test files that train it (imported by name: conftest
puts tests/ on sys.path). An MLP on a synthetic set whose last global batch (30 of 1030) is
uneven and whose batch of 100 does not split evenly over 3 workers."""

SMALL = dict(
    model="mlp",
    hidden=(16,),
    dataset="synthetic",
    n_samples=1030,
    n_features=12,
    epochs=2,
    batch_size=100,
    lr=0.05,  # and SGD's default momentum, 0.9 (not named: Adam's runs take SMALL too)
    lr_schedule="cosine",
    quiet=True,
)


def as_flags(options: dict) -> list:
    """The command line's flags for train options: --kebab-case VALUE, a tuple as its
    comma-separated text, True as the bare switch."""
    flags = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        else:
            text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            flags += [flag, text]
    return flags


SMALL_FLAGS = as_flags(SMALL)  # SMALL as `python -m dptrain train` flags


# the elastic tests' MPI job (test_elastic, test_ulfm): 8 steps an epoch, the faults mid-run
ELASTIC_MPI_FLAGS = ["--dataset", "synthetic", "--n-samples", "1024", "--n-features", "20"]
ELASTIC_MPI_FLAGS += ["--epochs", "2", "--batch-size", "128", "--hidden", "32", "--seed", "5"]
