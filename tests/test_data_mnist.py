"""Tests for MNIST in dptrain.data: the IDX reader (idx.py), the files' lookup, validation
and download (mnist.py), and the MNIST policies of catalog.py (get_mnist, load_dataset)."""

import gzip
import hashlib
import re
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from _mnist import SHARED_MNIST, find_mnist, mnist_mark, mnist_places

from dptrain import data
from dptrain.data import (
    DataError,
    DataNotFound,
    Dataset,
    download_mnist,
    get_mnist,
    load_dataset,
    load_mnist,
    read_idx,
)

# the tests write small stand-ins that are not the published files: the warning that says so
# is tested below, and silenced elsewhere
pytestmark = pytest.mark.filterwarnings("ignore::dptrain.data.DataWarning")

REAL_MNIST_DIR, needs_mnist = find_mnist(), mnist_mark()


REAL_TRAIN_CLASS_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


REAL_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}


# ---------------------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray, elem_type: int = 0x08) -> bytes:
    """Raw IDX encoding of a uint8 array: 0, 0, type, ndim, big-endian dims, data."""
    header = bytes([0, 0, elem_type, array.ndim])
    header += np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, *, gz: bool) -> Path:
    blob = idx_bytes(array)
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


def fake_mnist_arrays(n_train=50, n_test=20, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def write_fake_mnist(directory: Path, arrays=None, *, gz=True) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    arrays = fake_mnist_arrays() if arrays is None else arrays
    for base, array in arrays.items():
        write_idx(directory / (base + (".gz" if gz else "")), array, gz=gz)
    return arrays


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    """No network, no DPTRAIN_DATA from the caller, and an empty private cache directory."""

    def no_network(url, timeout):
        pytest.fail(f"a test tried to download {url}")

    monkeypatch.setattr(data.mnist, "_fetch", no_network)
    monkeypatch.delenv("DPTRAIN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def fake_mnist(tmp_path):
    directory = tmp_path / "fake-mnist"
    return directory, write_fake_mnist(directory)


# ---------------------------------------------------------------------------------------
# read_idx
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("shape", [(7,), (3, 28, 28), (2, 3, 4, 5)])
def test_read_idx_round_trip(tmp_path, gz, shape):
    array = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    path = write_idx(tmp_path / "f.idx", array, gz=gz)
    got = read_idx(path)
    assert got.dtype == np.uint8
    assert got.shape == shape
    np.testing.assert_array_equal(got, array)


def test_read_idx_detects_gzip_by_content_not_name(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    gz_without_suffix = write_idx(tmp_path / "images", array, gz=True)
    raw_with_gz_suffix = write_idx(tmp_path / "images.gz", array, gz=False)
    np.testing.assert_array_equal(read_idx(gz_without_suffix), array)
    np.testing.assert_array_equal(read_idx(raw_with_gz_suffix), array)


def test_read_idx_empty_dimension(tmp_path):
    path = write_idx(tmp_path / "empty", np.zeros((0, 28, 28), np.uint8), gz=False)
    assert read_idx(path).shape == (0, 28, 28)


def test_read_idx_wrong_magic(tmp_path):
    path = tmp_path / "notidx.bin"
    path.write_bytes(b"\x12\x34\x08\x01" + bytes(8))
    with pytest.raises(DataError, match=r"notidx\.bin.*wrong magic number 0x12340801.*expected"):
        read_idx(path)


def test_read_idx_zero_dimensions_is_wrong_magic(tmp_path):
    path = tmp_path / "zerodims"
    path.write_bytes(b"\x00\x00\x08\x00")
    with pytest.raises(DataError, match=r"zerodims.*wrong magic number 0x00000800"):
        read_idx(path)


def test_read_idx_unsupported_element_type(tmp_path):
    path = tmp_path / "floats.idx"
    path.write_bytes(idx_bytes(np.zeros(4, np.uint8), elem_type=0x0D))
    with pytest.raises(
        DataError, match=r"floats\.idx.*unsupported IDX element type 0x0d \(float32\)"
    ):
        read_idx(path)


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_truncated_data(tmp_path, gz):
    blob = idx_bytes(np.zeros((3, 28, 28), np.uint8))[:-100]
    path = tmp_path / "short-images"
    path.write_bytes(gzip.compress(blob) if gz else blob)
    with pytest.raises(
        DataError,
        match=r"short-images: truncated file: dims \(3, 28, 28\) need "
        r"2352 bytes of data, found 2252",
    ):
        read_idx(path)


def test_read_idx_truncated_header(tmp_path):
    path = tmp_path / "short-header"
    path.write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x03")  # 3 dims announced, 1 present
    with pytest.raises(DataError, match=r"short-header.*truncated IDX header.*16 bytes, found 8"):
        read_idx(path)
    path.write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match=r"short-header.*truncated IDX header"):
        read_idx(path)


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_trailing_garbage(tmp_path, gz):
    blob = idx_bytes(np.zeros(10, np.uint8)) + b"junk"
    path = tmp_path / "trailing-labels"
    path.write_bytes(gzip.compress(blob) if gz else blob)
    with pytest.raises(
        DataError,
        match=r"trailing-labels.*trailing garbage.*need 10 bytes of "
        r"data, found 14 \(4 extra\)",
    ):
        read_idx(path)


@pytest.mark.parametrize("damage", ["cut", "garbage", "crc"])
def test_read_idx_corrupt_gzip(tmp_path, damage):
    good = gzip.compress(idx_bytes(np.arange(100, dtype=np.uint8)))
    blob = {
        "cut": good[: len(good) // 2],
        "garbage": b"\x1f\x8b" + b"not really gzip" * 4,
        "crc": good[:-8] + bytes(4) + good[-4:],
    }[damage]
    path = tmp_path / "broken.gz"
    path.write_bytes(blob)
    with pytest.raises(DataError, match=r"broken\.gz.*corrupt gzip"):
        read_idx(path)


# ---------------------------------------------------------------------------------------
# load_mnist: lookup and validation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False])
def test_load_mnist_from_data_dir(tmp_path, gz):
    directory = tmp_path / "m"
    arrays = write_fake_mnist(directory, gz=gz)
    ds = load_mnist(directory)
    assert isinstance(ds, Dataset)
    assert ds.name == "mnist" and ds.n_classes == 10 and ds.source == str(directory)
    assert ds.x_train.shape == (50, 784) and ds.x_test.shape == (20, 784)
    assert ds.n_features == 784
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    expected = arrays["train-images-idx3-ubyte"].reshape(50, 784) / 255.0
    np.testing.assert_allclose(ds.x_train, expected, rtol=1e-7, atol=0)
    np.testing.assert_array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])


def test_load_mnist_dtype_and_normalize(fake_mnist):
    directory, arrays = fake_mnist
    raw = load_mnist(directory, dtype=np.float64, normalize=False)
    assert raw.x_test.dtype == np.float64
    np.testing.assert_array_equal(raw.x_test, arrays["t10k-images-idx3-ubyte"].reshape(20, 784))
    scaled = load_mnist(directory, dtype=np.float64)
    assert scaled.x_test.min() >= 0.0 and scaled.x_test.max() <= 1.0
    np.testing.assert_array_equal(scaled.x_test, raw.x_test / 255.0)


def test_load_mnist_rejects_non_float_dtype(fake_mnist):
    with pytest.raises(ValueError, match=r"dtype=int32 is not supported"):
        load_mnist(fake_mnist[0], dtype=np.int32)


def test_load_mnist_accepts_dot_variant_and_mixed_compression(tmp_path):
    arrays = fake_mnist_arrays()
    directory = tmp_path / "mixed"
    directory.mkdir()
    write_idx(directory / "train-images.idx3-ubyte", arrays["train-images-idx3-ubyte"], gz=False)
    write_idx(directory / "train-labels.idx1-ubyte.gz", arrays["train-labels-idx1-ubyte"], gz=True)
    write_idx(directory / "t10k-images-idx3-ubyte", arrays["t10k-images-idx3-ubyte"], gz=False)
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", arrays["t10k-labels-idx1-ubyte"], gz=True)
    ds = load_mnist(directory, normalize=False)
    np.testing.assert_array_equal(ds.x_train, arrays["train-images-idx3-ubyte"].reshape(50, 784))


def test_load_mnist_finds_mnist_subdirectory_of_data_dir(tmp_path):
    write_fake_mnist(tmp_path / "datasets" / "mnist")
    ds = load_mnist(tmp_path / "datasets")
    assert ds.source == str(tmp_path / "datasets" / "mnist")


@pytest.mark.parametrize("subdir", ["", "mnist"])
def test_load_mnist_from_env_var(tmp_path, monkeypatch, subdir):
    root = tmp_path / "envdata"
    write_fake_mnist(root / subdir if subdir else root)
    monkeypatch.setenv("DPTRAIN_DATA", str(root))
    ds = load_mnist()
    assert ds.source == str(root / subdir if subdir else root)
    assert ds.x_train.shape == (50, 784)


def test_load_mnist_from_xdg_cache(tmp_path, monkeypatch):
    cache = tmp_path / "xdg-cache"  # set by the autouse fixture
    write_fake_mnist(cache / "dptrain" / "mnist")
    assert data.default_cache_dir() == cache / "dptrain" / "mnist"
    assert load_mnist().source == str(cache / "dptrain" / "mnist")


def test_env_var_is_searched_before_cache(tmp_path, monkeypatch):
    write_fake_mnist(tmp_path / "xdg-cache" / "dptrain" / "mnist", fake_mnist_arrays(n_train=5))
    write_fake_mnist(tmp_path / "env", fake_mnist_arrays(n_train=7))
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "env"))
    assert load_mnist().n_train == 7


def test_explicit_data_dir_is_the_only_place_searched(tmp_path, monkeypatch):
    write_fake_mnist(tmp_path / "env")
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "env"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFound) as info:
        load_mnist(empty)
    assert info.value.searched == [
        f"{empty} (no MNIST files)",
        f"{empty / 'mnist'} (no such directory)",
    ]


def test_load_mnist_not_found_lists_places_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataNotFound, match=r"MNIST not found") as info:
        load_mnist()
    message = str(info.value)
    for place in (
        tmp_path / "nowhere",
        tmp_path / "nowhere" / "mnist",
        tmp_path / "xdg-cache" / "dptrain" / "mnist",
    ):
        assert str(place) in message
    assert len(info.value.searched) == 3


def test_load_mnist_partial_directory_names_missing_files(fake_mnist):
    directory, _ = fake_mnist
    (directory / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFound, match=r"missing t10k-labels-idx1-ubyte\[\.gz\]"):
        load_mnist(directory)


def test_load_mnist_mismatched_counts_names_both_files(tmp_path):
    arrays = fake_mnist_arrays()
    arrays["train-labels-idx1-ubyte"] = arrays["train-labels-idx1-ubyte"][:49]
    write_fake_mnist(tmp_path / "m", arrays)
    with pytest.raises(
        DataError,
        match=r"train-images-idx3-ubyte\.gz has 50 images but .*"
        r"train-labels-idx1-ubyte\.gz has 49 labels",
    ):
        load_mnist(tmp_path / "m")


def test_load_mnist_labels_out_of_range(tmp_path):
    arrays = fake_mnist_arrays()
    arrays["t10k-labels-idx1-ubyte"][3] = 10
    write_fake_mnist(tmp_path / "m", arrays)
    with pytest.raises(
        DataError,
        match=r"t10k-labels-idx1-ubyte\.gz: label 10 at index 3 is "
        r"out of range 0\.\.9",
    ):
        load_mnist(tmp_path / "m")


@pytest.mark.parametrize("bad_shape", [(50, 28, 27), (50, 784), (50, 1, 28, 28)])
def test_load_mnist_wrong_image_dims(tmp_path, bad_shape):
    arrays = fake_mnist_arrays()
    arrays["train-images-idx3-ubyte"] = np.zeros(bad_shape, np.uint8)
    write_fake_mnist(tmp_path / "m", arrays)
    with pytest.raises(
        DataError,
        match=re.escape(
            f"train-images-idx3-ubyte.gz: expected images "
            f"of shape (n, 28, 28), found dims {bad_shape}"
        ),
    ):
        load_mnist(tmp_path / "m")


def test_load_mnist_labels_not_1d(tmp_path):
    arrays = fake_mnist_arrays()
    arrays["t10k-labels-idx1-ubyte"] = np.zeros((20, 1), np.uint8)
    write_fake_mnist(tmp_path / "m", arrays)
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: expected labels of shape"):
        load_mnist(tmp_path / "m")


def test_load_mnist_corrupt_file_is_not_reported_as_missing(fake_mnist):
    directory, _ = fake_mnist
    (directory / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8bbroken")
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: corrupt gzip") as info:
        get_mnist(directory, allow_download=False, announce=None)
    assert not isinstance(info.value, DataNotFound)


# ---------------------------------------------------------------------------------------
# get_mnist and download_mnist (with an in-memory fake network)
# ---------------------------------------------------------------------------------------


@needs_mnist
def test_the_published_mnist_files_are_verified(recwarn):
    ds = load_mnist(REAL_MNIST_DIR)
    assert ds.integrity == "verified" and ds.n_train == 60_000
    assert not [w for w in recwarn if issubclass(w.category, data.DataWarning)]


def test_other_mnist_files_are_read_with_one_warning_naming_them(fake_mnist):
    with pytest.warns(data.DataWarning) as caught:
        ds = load_mnist(fake_mnist[0])
    assert ds.integrity == "modified" and len(caught) == 1
    message = str(caught[0].message)
    assert str(fake_mnist[0]) in message and "not the published data set" in message
    for base in data.MNIST_FILES:
        assert (
            f"{base}.gz (sha256 of the content " in message and data.MNIST_SHA256[base] in message
        )


def test_get_mnist_prefers_local_files(fake_mnist):
    lines = []
    ds = get_mnist(fake_mnist[0], announce=lines.append)
    assert ds.source == str(fake_mnist[0]) and lines == []


def test_get_mnist_not_found_without_download_or_synthetic(tmp_path):
    with pytest.raises(DataNotFound, match=r"MNIST not found.*download disabled"):
        get_mnist(allow_download=False, allow_synthetic=False)


@pytest.mark.parametrize("make", [False, True], ids=["missing", "empty"])
def test_a_named_directory_without_mnist_is_an_error_and_nothing_is_created(tmp_path, make):
    named = tmp_path / "mnsit"  # a typo of the user's
    if make:
        named.mkdir()
    before = sorted(tmp_path.rglob("*"))
    lines = []
    with pytest.raises(DataNotFound) as info:
        get_mnist(named, announce=lines.append)  # download and synthetic both allowed
    message = str(info.value)
    assert str(named) in message
    for base in data.MNIST_FILES:
        assert base in message
    assert lines == [] and sorted(tmp_path.rglob("*")) == before


def test_a_missing_dptrain_data_directory_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "typo"))
    with pytest.raises(DataNotFound, match=r"\$DPTRAIN_DATA is .*typo.*no such directory"):
        get_mnist(announce=None)
    assert not (tmp_path / "typo").exists()


def test_get_mnist_synthetic_fallback_announces_one_line(tmp_path):
    lines = []
    ds = get_mnist(
        allow_download=False, announce=lines.append, synthetic_n_train=600, synthetic_n_test=200
    )
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "MNIST not found" in lines[0] and "SYNTHETIC" in lines[0]
    assert str(tmp_path / "xdg-cache" / "dptrain" / "mnist") in lines[0]
    assert ds.source == "synthetic (MNIST not found)" and ds.name == "synthetic-mnist"
    assert ds.x_train.shape == (600, 784) and ds.x_test.shape == (200, 784)
    assert ds.n_classes == 10 and ds.x_train.dtype == np.float32
    assert ds.input_shape == (1, 28, 28)


def test_get_mnist_download_failure_falls_back_to_synthetic(tmp_path, monkeypatch):
    def unreachable(url, timeout):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(data.mnist, "_fetch", unreachable)
    lines = []
    ds = get_mnist(announce=lines.append, synthetic_n_train=100, synthetic_n_test=100)
    assert ds.source.startswith("synthetic") and ds.name == "synthetic-mnist"
    assert not (tmp_path / "xdg-cache" / "dptrain" / "mnist").exists()  # nothing to keep
    assert "download into" in lines[0] and "no route to host" in lines[0]


def serve(monkeypatch, blobs: dict, fail_prefix: str | None = None):
    """Replace the network with a dict url -> bytes; URLs starting with fail_prefix fail."""
    requested = []

    def fetch(url, timeout):
        requested.append(url)
        if fail_prefix and url.startswith(fail_prefix):
            raise urllib.error.URLError("mirror down")
        return blobs[url.rsplit("/", 1)[1]]

    monkeypatch.setattr(data.mnist, "_fetch", fetch)
    return requested


def fake_mnist_gz_and_sha(monkeypatch):
    arrays = fake_mnist_arrays()
    blobs = {}
    for base, array in arrays.items():
        raw = idx_bytes(array)
        blobs[base + ".gz"] = gzip.compress(raw)
        monkeypatch.setitem(data.MNIST_SHA256, base, hashlib.sha256(raw).hexdigest())
    return arrays, blobs


def test_download_mnist_verifies_and_writes_atomically(tmp_path, monkeypatch):
    arrays, blobs = fake_mnist_gz_and_sha(monkeypatch)
    requested = serve(monkeypatch, blobs, fail_prefix=data.MNIST_MIRRORS[0])
    dest = download_mnist(tmp_path / "dl")
    assert sorted(p.name for p in dest.iterdir()) == sorted(blobs)  # no temp files left
    assert requested[:2] == [
        data.MNIST_MIRRORS[0] + "train-images-idx3-ubyte.gz",
        data.MNIST_MIRRORS[1] + "train-images-idx3-ubyte.gz",
    ]
    ds = load_mnist(dest, normalize=False)
    np.testing.assert_array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"])
    # files already present and correct are not fetched again
    requested.clear()
    download_mnist(dest)
    assert requested == []


def test_download_mnist_rejects_checksum_mismatch(tmp_path, monkeypatch):
    _, blobs = fake_mnist_gz_and_sha(monkeypatch)
    monkeypatch.setitem(data.MNIST_SHA256, "train-images-idx3-ubyte", "0" * 64)
    serve(monkeypatch, blobs)
    with pytest.raises(
        DataError,
        match=r"could not download train-images-idx3-ubyte\.gz.*"
        r"sha256 of decompressed data is [0-9a-f]{64}, "
        r"expected 0{64}",
    ):
        download_mnist(tmp_path / "dl")
    assert not (tmp_path / "dl" / "train-images-idx3-ubyte.gz").exists()


def test_get_mnist_downloads_when_allowed(tmp_path, monkeypatch):
    _, blobs = fake_mnist_gz_and_sha(monkeypatch)
    serve(monkeypatch, blobs)
    lines = []
    ds = get_mnist(announce=lines.append)  # default: into the (private) cache directory
    assert ds.source == str(tmp_path / "xdg-cache" / "dptrain" / "mnist")
    assert ds.n_train == 50 and lines == []


# ---------------------------------------------------------------------------------------
# load_dataset('mnist')
# ---------------------------------------------------------------------------------------


def test_load_dataset_mnist_limit_and_upscale(fake_mnist):
    full = load_dataset("mnist", data_dir=fake_mnist[0], allow_download=False)
    ds = load_dataset("mnist", data_dir=fake_mnist[0], allow_download=False, limit=10, upscale=4)
    assert ds.x_train.shape == (10, 112 * 112) and ds.x_test.shape == (20, 112 * 112)
    np.testing.assert_array_equal(ds.y_train, full.y_train[:10])
    np.testing.assert_array_equal(
        ds.x_train.reshape(10, 112, 112)[:, ::4, ::4], full.x_train[:10].reshape(10, 28, 28)
    )
    limited = load_dataset("mnist", data_dir=fake_mnist[0], allow_download=False, limit=10)
    assert limited.x_train.base is None  # a copy, not a view keeping the full array alive
    assert limited.x_test.shape == (20, 784)


def test_load_dataset_mnist_falls_back_to_synthetic(tmp_path, monkeypatch):
    lines = []
    ds = load_dataset("mnist", allow_download=False, announce=lines.append, limit=1000)
    assert len(lines) == 1 and ds.source.startswith("synthetic")
    assert ds.x_train.shape == (1000, 784) and ds.name == "synthetic-mnist"
    with pytest.raises(DataNotFound, match="none"):
        load_dataset("mnist", data_dir=tmp_path / "none", announce=lines.append, limit=1000)
    with pytest.raises(ValueError, match=r"data_dir=.* applies to 'mnist' and 'cifar10'"):
        load_dataset("synthetic", data_dir=tmp_path, n_samples=100)


@pytest.mark.parametrize(
    "limit, message",
    [
        (0, r"limit=0 must be >= 1"),
        (-5, r"limit=-5 must be >= 1"),
        (1.5, r"limit=1\.5 must be an integer"),
        (True, r"limit=True must be an integer"),
        (51, r"limit=51 exceeds the 50 training samples of mnist"),
    ],
)
def test_load_dataset_rejects_bad_limit(fake_mnist, limit, message):
    with pytest.raises(ValueError, match=message):
        load_dataset("mnist", data_dir=fake_mnist[0], allow_download=False, limit=limit)


def test_load_dataset_rejects_synthetic_options_for_mnist(fake_mnist):
    with pytest.raises(ValueError, match=r"n_features=20 applies only to name='synthetic'"):
        load_dataset("mnist", data_dir=fake_mnist[0], n_features=20)


# ---------------------------------------------------------------------------------------
# the real MNIST files
# ---------------------------------------------------------------------------------------


def test_the_tests_find_mnist_where_the_command_line_does(tmp_path, monkeypatch):
    """$DPTRAIN_DATA (or its mnist/), then the cache, then ../shared/data/mnist: the first
    that holds the files, raw or gzip (isolated_environment: no $DPTRAIN_DATA, an empty
    cache)."""
    shared = tmp_path / "shared"
    assert find_mnist(shared) is None
    write_fake_mnist(shared)
    assert find_mnist(shared) == shared
    cache = tmp_path / "xdg-cache" / "dptrain" / "mnist"
    write_fake_mnist(cache, gz=False)
    assert find_mnist(shared) == cache
    env = tmp_path / "env"
    write_fake_mnist(env / "mnist")
    monkeypatch.setenv("DPTRAIN_DATA", str(env))
    assert find_mnist(shared) == env / "mnist"
    assert mnist_places(shared) == [env, env / "mnist", cache, shared]
    loaded = load_dataset("mnist", allow_download=False, announce=None)
    assert loaded.source.startswith(str(env / "mnist"))  # where the command line reads it
    reason = mnist_mark().kwargs["reason"]  # a skip names every place looked in
    assert all(str(d) in reason for d in (env, cache, SHARED_MNIST)), reason


@needs_mnist
def test_real_mnist():
    files, _ = data.mnist._find_mnist_files(REAL_MNIST_DIR)
    for base, expected in REAL_SHA256.items():
        path = files[base]  # raw or gzip, as the command line reads them
        raw = path.read_bytes()
        digest = hashlib.sha256(gzip.decompress(raw) if path.suffix == ".gz" else raw).hexdigest()
        assert digest == expected, f"{path}: sha256 {digest}, README says {expected}"
        assert data.MNIST_SHA256[base] == expected
    ds = load_mnist(REAL_MNIST_DIR)
    assert ds.x_train.shape == (60000, 784) and ds.x_test.shape == (10000, 784)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
    assert 0.12 < ds.x_train.mean() < 0.14  # MNIST's mean pixel is about 0.1307
    assert np.bincount(ds.y_train, minlength=10).tolist() == REAL_TRAIN_CLASS_COUNTS
    assert np.bincount(ds.y_test, minlength=10).sum() == 10000
    assert ds.y_test.min() == 0 and ds.y_test.max() == 9
