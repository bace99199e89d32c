"""Where the tests that need the real MNIST find it: where the command line looks
($DPTRAIN_DATA and its mnist/, then the cache: dptrain.data.locations.search_dirs), then the
shared data beside the checkout (../shared/data/mnist). Imported by name (conftest puts
tests/ on sys.path): ``MNIST_DIR, needs_mnist = find_mnist(), mnist_mark()``."""

from pathlib import Path

import pytest

SHARED_MNIST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


def mnist_places(shared: Path = SHARED_MNIST) -> list[Path]:
    """The directories looked in, in order."""
    from dptrain.data.locations import search_dirs

    return [*search_dirs(None, "mnist"), shared]


def find_mnist(shared: Path = SHARED_MNIST) -> Path | None:
    """The first of mnist_places that holds the four MNIST files (raw or gzip, as the
    command line reads them), or None."""
    from dptrain.data.mnist import _find_mnist_files

    return next((d for d in mnist_places(shared) if _find_mnist_files(d)[0] is not None), None)


def mnist_mark():
    """A skipif mark for a test that needs the real MNIST; its reason names the places
    looked in."""
    places = ", ".join(str(d) for d in mnist_places())
    return pytest.mark.skipif(find_mnist() is None, reason=f"MNIST not found in {places}")
