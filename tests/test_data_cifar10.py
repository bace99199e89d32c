"""Tests for the CIFAR-10 loaders in dptrain.data, on small files written here in both formats.

CIFAR-10 itself cannot be downloaded on these machines, so every test writes its own batches:
the Python format byte for byte as Python 2's cPickle wrote the published files (protocol 2,
str keys, the numpy array through numpy.core.multiarray._reconstruct), and the binary format
(1 label byte + 3072 pixel bytes per record). Nothing here touches the network.
"""

import io
import json
import os
import pickle
import pickletools
import re
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dptrain import cli, data
from dptrain.data import (
    CIFAR10_BATCHES,
    DataError,
    DataNotFound,
    get_cifar10,
    load_cifar10,
    load_dataset,
    read_cifar10_batch,
    synthetic_cifar10,
)

# the tests write small stand-ins that are not the published files: the warning that says so
# is tested below, and silenced elsewhere
pytestmark = pytest.mark.filterwarnings("ignore::dptrain.data.DataWarning")

TRAIN_SIZES = (3, 2, 4, 3, 3)  # data_batch_1..5: 15 training images
TEST_SIZE = 7


# ---------------------------------------------------------------------------------------
# writers for both formats
# ---------------------------------------------------------------------------------------


class Global:
    """A reference to module.name, written with the GLOBAL opcode."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


def py2_pickle(obj) -> bytes:
    """The bytes Python 2's cPickle.dumps(obj, 2) gives for the types a CIFAR-10 batch holds.

    Python 2 str (here: bytes) is SHORT_BINSTRING / BINSTRING, bools NEWTRUE / NEWFALSE,
    every non-atomic object is memoized with BINPUT, and an ndarray is what NumPy's
    __reduce__ gives: _reconstruct(ndarray, (0,), 'b') then BUILD with
    (1, shape, dtype, is_fortran, raw bytes), the dtype as dtype('u1', 0, 1) then BUILD
    with (3, '|', None, None, None, -1, -1, 0).
    """
    out = [b"\x80\x02"]
    memo = [0]

    def put():
        out.append(b"q" + bytes([memo[0]]) if memo[0] < 256 else b"r" + struct.pack("<I", memo[0]))
        memo[0] += 1

    def reduce(func, args, state):
        save(func)
        save(args)
        out.append(b"R")
        put()
        save(state)
        out.append(b"b")

    def save(v):
        if isinstance(v, Global):
            out.append(b"c" + v.module.encode() + b"\n" + v.name.encode() + b"\n")
            put()
        elif v is None:
            out.append(b"N")
        elif v is True or v is False:
            out.append(b"\x88" if v else b"\x89")
        elif isinstance(v, int):
            if 0 <= v < 256:
                out.append(b"K" + bytes([v]))
            elif 0 <= v < 65536:
                out.append(b"M" + struct.pack("<H", v))
            else:
                out.append(b"J" + struct.pack("<i", v))
        elif isinstance(v, bytes):
            out.append(
                b"U" + bytes([len(v)]) + v if len(v) < 256 else b"T" + struct.pack("<i", len(v)) + v
            )
            put()
        elif isinstance(v, tuple):
            if not v:
                out.append(b")")
                return
            if len(v) > 3:
                out.append(b"(")
            for item in v:
                save(item)
            out.append({1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(v), b"t"))
            put()
        elif isinstance(v, list):
            out.append(b"]")
            put()
            for start in range(0, len(v), 1000):  # cPickle appends in batches of 1000
                out.append(b"(")
                for item in v[start : start + 1000]:
                    save(item)
                out.append(b"e")
        elif isinstance(v, dict):
            out.append(b"}")
            put()
            out.append(b"(")
            for key, value in v.items():
                save(key)
                save(value)
            out.append(b"u")
        elif isinstance(v, np.dtype):
            reduce(
                Global("numpy", "dtype"),
                (v.str[1:].encode(), 0, 1),
                (3, v.str[:1].encode(), None, None, None, -1, -1, 0),
            )
        elif isinstance(v, np.ndarray):
            fortran = bool(np.isfortran(v))
            reduce(
                Global("numpy.core.multiarray", "_reconstruct"),
                (Global("numpy", "ndarray"), (0,), b"b"),
                (1, tuple(v.shape), v.dtype, fortran, v.tobytes(order="F" if fortran else "C")),
            )
        else:
            raise TypeError(f"py2_pickle cannot write {type(v).__name__}")

    save(obj)
    out.append(b".")
    return b"".join(out)


def batch_dict(images: np.ndarray, labels, name: str) -> dict:
    """A batch as the published files hold it (Python 2 str keys and values)."""
    return {
        b"batch_label": f"{name} of 6 (test files)".encode(),
        b"labels": [int(v) for v in labels],
        b"data": images,
        b"filenames": [f"img_{name}_{i}.png".encode() for i in range(len(labels))],
    }


def bin_batch(images: np.ndarray, labels) -> bytes:
    return b"".join(bytes([int(label)]) + img.tobytes() for img, label in zip(images, labels))


def make_images(n: int, seed: int) -> np.ndarray:
    """(n, 3, 32, 32) uint8 images with every pixel distinct across channels and rows."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)


def fake_cifar(seed: int = 0, train_sizes=TRAIN_SIZES, n_test: int = TEST_SIZE) -> dict:
    """{batch name: (images (n, 3, 32, 32) uint8, labels (n,) uint8)} for the six batches."""
    rng = np.random.default_rng(seed + 1000)
    sizes = dict(zip(CIFAR10_BATCHES, (*train_sizes, n_test)))
    return {
        name: (make_images(n, seed * 10 + i), rng.integers(0, 10, n, dtype=np.uint8))
        for i, (name, n) in enumerate(sizes.items())
    }


def write_py(directory: Path, batches: dict, *, meta: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, (images, labels) in batches.items():
        (directory / name).write_bytes(
            py2_pickle(batch_dict(images.reshape(len(images), -1), labels, name))
        )
    if meta:
        (directory / "batches.meta").write_bytes(
            py2_pickle(
                {
                    b"num_cases_per_batch": 10000,
                    b"label_names": [b"airplane", b"automobile"],
                    b"num_vis": 3072,
                }
            )
        )
    return directory


def write_bin(directory: Path, batches: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, (images, labels) in batches.items():
        (directory / (name + ".bin")).write_bytes(bin_batch(images, labels))
    return directory


def write_archive(path: Path, fmt: str, batches: dict, *, skip=()) -> Path:
    """The official archive layout: <official directory>/<batch>, gzip-compressed tar."""
    directory, suffix = {
        "python": ("cifar-10-batches-py", ""),
        "binary": ("cifar-10-batches-bin", ".bin"),
    }[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, (images, labels) in reversed(batches.items()):  # order must not matter
            if name in skip:
                continue
            blob = (
                bin_batch(images, labels)
                if fmt == "binary"
                else py2_pickle(batch_dict(images.reshape(len(images), -1), labels, name))
            )
            info = tarfile.TarInfo(f"{directory}/{name}{suffix}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def expected_split(batches: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    names = CIFAR10_BATCHES[:5] if split == "train" else CIFAR10_BATCHES[5:]
    x = np.concatenate([batches[n][0].reshape(len(batches[n][0]), -1) for n in names])
    y = np.concatenate([batches[n][1] for n in names]).astype(np.int64)
    return x, y


def assert_matches(ds, batches: dict, *, scale: float = 255.0):
    for split in ("train", "test"):
        x, y = expected_split(batches, split)
        np.testing.assert_array_equal(getattr(ds, f"x_{split}"), x / np.float32(scale))
        np.testing.assert_array_equal(getattr(ds, f"y_{split}"), y)


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    """No network, no DPTRAIN_DATA from the caller, and an empty private cache directory."""

    def no_network(url, timeout):
        pytest.fail(f"a test tried to download {url}")

    monkeypatch.setattr(data.mnist, "_fetch", no_network)
    monkeypatch.delenv("DPTRAIN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def batches():
    return fake_cifar()


# ---------------------------------------------------------------------------------------
# the writers themselves
# ---------------------------------------------------------------------------------------


def test_py2_writer_is_what_numpy_reads_and_uses_only_the_expected_globals():
    images = make_images(3, 0).reshape(3, -1)
    blob = py2_pickle(batch_dict(images, [1, 0, 9], "data_batch_1"))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(blob)]
    assert ops[0] == ("PROTO", 2)
    assert [arg for name, arg in ops if name == "GLOBAL"] == [
        "numpy.core.multiarray _reconstruct",
        "numpy ndarray",
        "numpy dtype",
    ]
    assert {name for name, _ in ops} >= {"SHORT_BINSTRING", "BINSTRING", "BINPUT", "BUILD"}
    trusted = pickle.loads(blob, encoding="bytes")  # our own bytes: safe to load for real
    assert trusted[b"data"].dtype == np.uint8 and trusted[b"data"].shape == (3, 3072)
    np.testing.assert_array_equal(trusted[b"data"], images)
    assert trusted[b"labels"] == [1, 0, 9]


# ---------------------------------------------------------------------------------------
# read_cifar10_batch: both formats, pixel order
# ---------------------------------------------------------------------------------------


def test_binary_record_layout_is_label_then_red_green_blue_planes(tmp_path):
    image = make_images(1, 5)[0]  # (3, 32, 32): channel, row, column
    record = bytes([7]) + bytes(
        int(image[c, r, w]) for c in range(3) for r in range(32) for w in range(32)
    )
    path = tmp_path / "one.bin"
    path.write_bytes(record * 2)
    images, labels = read_cifar10_batch(path)
    assert images.shape == (2, 3072) and images.dtype == np.uint8
    assert labels.tolist() == [7, 7] and labels.dtype == np.int64
    np.testing.assert_array_equal(images[1].reshape(3, 32, 32), image)  # CHW


@pytest.mark.parametrize("writer", ["python2", "py3-protocol2", "py3-protocol4", "str-keys"])
def test_read_python_batch(tmp_path, writer):
    images = make_images(7, 1).reshape(7, -1)
    labels = [0, 1, 2, 3, 4, 5, 9]
    batch = batch_dict(images, labels, "test_batch")
    blob = {
        "python2": lambda: py2_pickle(batch),
        "py3-protocol2": lambda: pickle.dumps(batch, protocol=2),
        "py3-protocol4": lambda: pickle.dumps(batch, protocol=4),
        "str-keys": lambda: pickle.dumps({"data": images, "labels": labels}, protocol=2),
    }[writer]()
    path = tmp_path / "test_batch"
    path.write_bytes(blob)
    got_images, got_labels = read_cifar10_batch(path)
    np.testing.assert_array_equal(got_images, images)
    assert got_labels.tolist() == labels and got_labels.dtype == np.int64


def test_read_python_batch_fortran_order(tmp_path):
    images = np.asfortranarray(make_images(4, 2).reshape(4, -1))
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_pickle(batch_dict(images, [1, 2, 3, 4], "data_batch_1")))
    np.testing.assert_array_equal(read_cifar10_batch(path)[0], images)


# ---------------------------------------------------------------------------------------
# malformed files: ValueError naming the file and the problem
# ---------------------------------------------------------------------------------------


def write_batch(tmp_path, obj, name="data_batch_1") -> Path:
    path = tmp_path / name
    path.write_bytes(py2_pickle(obj) if not isinstance(obj, bytes) else obj)
    return path


@pytest.mark.parametrize("cut", [1, 40, 300, 3000, -2])
def test_truncated_pickle(tmp_path, cut):
    blob = py2_pickle(batch_dict(make_images(2, 0).reshape(2, -1), [1, 2], "data_batch_1"))
    path = write_batch(tmp_path, blob[:cut])
    with pytest.raises(DataError, match=r"data_batch_1: truncated or corrupt pickle"):
        read_cifar10_batch(path)


@pytest.mark.parametrize(
    "size, problem",
    [
        (0, r"empty file; a CIFAR-10 binary batch holds 3073-byte records"),
        (
            3072,
            r"size 3072 bytes is not a whole number of 3073-byte records .*"
            r"0 records and 3072 bytes over; the file is truncated",
        ),
        (2 * 3073 + 100, r"size 6246 bytes .*: 2 records and 100 bytes over"),
    ],
)
def test_truncated_binary(tmp_path, size, problem):
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(bin_batch(make_images(3, 0), [1, 2, 3])[:size])
    with pytest.raises(DataError, match=r"data_batch_3\.bin: " + problem):
        read_cifar10_batch(path)


def test_binary_label_out_of_range(tmp_path):
    path = tmp_path / "test_batch.bin"
    path.write_bytes(bin_batch(make_images(3, 0), [1, 10, 3]))
    with pytest.raises(
        DataError,
        match=r"test_batch\.bin: label 10 of image 1 is out of "
        r"range 0\.\.9",
    ):
        read_cifar10_batch(path)


@pytest.mark.parametrize(
    "data_value, problem",
    [
        (np.zeros((2, 3071), np.uint8), r"data has shape \(2, 3071\), expected \(n, 3072\)"),
        (np.zeros(3072, np.uint8), r"data has shape \(3072,\), expected \(n, 3072\)"),
        (np.zeros((2, 3, 1024), np.uint8), r"data has shape \(2, 3, 1024\)"),
        (np.zeros((0, 3072), np.uint8), r"data has shape \(0, 3072\), expected .* n >= 1"),
        (np.zeros((2, 3072), np.float32), r"not a CIFAR-10 batch: dtype b'f4' is not uint8"),
        (np.zeros((2, 3072), np.int16), r"not a CIFAR-10 batch: dtype b'i2' is not uint8"),
        ([[0] * 3072] * 2, r"'data' is a list, expected a uint8 NumPy array"),
    ],
)
def test_pickle_with_wrong_data(tmp_path, data_value, problem):
    path = write_batch(tmp_path, {b"data": data_value, b"labels": [1, 2]})
    with pytest.raises(DataError, match=r"data_batch_1: " + problem):
        read_cifar10_batch(path)


@pytest.mark.parametrize(
    "obj, problem",
    [
        ([1, 2], r"expected a pickled dict with 'data' and 'labels', found list"),
        ({b"labels": [1]}, r"the pickled dict has no 'data' entry"),
        (
            {b"data": np.zeros((2, 3072), np.uint8)},
            r"the pickled dict has no 'labels' entry \(keys: b'data'\)",
        ),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]}, r"2 images but 1 labels"),
        (
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 10]},
            r"label 10 of image 1 is out of range 0\.\.9",
        ),
        (
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [-1, 0]},
            r"label -1 of image 0 is out of range",
        ),
        (
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, b"x"]},
            r"'labels' is not a list of integers",
        ),
        (
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": b"\x01\x02"},
            r"'labels' is a bytes, expected a list of integers",
        ),
    ],
)
def test_pickle_with_wrong_structure(tmp_path, obj, problem):
    path = write_batch(tmp_path, obj)
    with pytest.raises(DataError, match=r"data_batch_1: " + problem):
        read_cifar10_batch(path)


def test_pickle_whose_array_bytes_do_not_match_its_shape(tmp_path):
    blob = py2_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2]})
    # the raw bytes are a BINSTRING of 6144 zero bytes; claim 3 rows instead of 2
    blob = blob.replace(b"K\x02M\x00\x0c\x86", b"K\x03M\x00\x0c\x86", 1)
    path = write_batch(tmp_path, blob)
    with pytest.raises(
        DataError,
        match=r"data of shape \(3, 3072\) needs 9216 bytes, the "
        r"file holds 6144",
    ):
        read_cifar10_batch(path)


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)


# ---------------------------------------------------------------------------------------
# malicious pickles: refused, nothing run
# ---------------------------------------------------------------------------------------


class Payload:
    """Unpickling this calls `func(*args)`: what an attacker would put in a batch file."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def payloads(marker: Path) -> dict:
    """Each creates `marker` when unpickled by an ordinary unpickler."""
    return {
        "os.system": Payload(os.system, f"touch {marker}"),
        "open": Payload(open, str(marker), "w"),
    }


@pytest.mark.parametrize("kind", ["os.system", "open"])
@pytest.mark.parametrize("where", ["top", "inside the batch", "as the labels"])
@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, kind, where, protocol):
    marker = tmp_path / "pwned"
    payload = payloads(marker)[kind]
    good = batch_dict(make_images(2, 0).reshape(2, -1), [1, 2], "data_batch_1")
    obj = {
        "top": payload,
        "inside the batch": {**good, b"filenames": [b"a.png", payload]},
        "as the labels": {**good, b"labels": payload},
    }[where]
    blob = pickle.dumps(obj, protocol=protocol)
    # the payload is live: an ordinary load would create the marker (checked on a copy)
    live_marker = tmp_path / "live"
    result = pickle.loads(pickle.dumps(payloads(live_marker)[kind], protocol=protocol))
    if hasattr(result, "close"):
        result.close()
    assert live_marker.exists()
    path = tmp_path / "data_batch_1"
    path.write_bytes(blob)
    with pytest.raises(
        DataError,
        match=r"data_batch_1: refused to unpickle: the file asks for "
        r"(posix\.system|builtins\.open|__builtin__\.open|io\.open)"
        r".*nothing in it was run",
    ):
        read_cifar10_batch(path)
    assert not marker.exists()


def test_malicious_pickle_in_the_data_directory_stops_the_load(tmp_path, batches):
    directory = write_py(tmp_path / "cifar-10-batches-py", batches)
    marker = tmp_path / "pwned"
    (directory / "data_batch_4").write_bytes(pickle.dumps(payloads(marker)["open"], protocol=2))
    lines = []
    with pytest.raises(DataError, match=r"data_batch_4: refused to unpickle") as info:
        get_cifar10(tmp_path, announce=lines.append)  # not replaced by synthetic data
    assert not isinstance(info.value, DataNotFound) and lines == []
    assert not marker.exists()


@pytest.mark.parametrize(
    "module, name",
    [
        ("numpy", "load"),
        ("numpy.core.multiarray", "scalar"),
        ("builtins", "eval"),
        ("subprocess", "Popen"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy", "frombuffer"),
    ],
)
def test_globals_beyond_the_array_reconstruction_are_refused(tmp_path, module, name):
    blob = b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\nq\x00)R."
    path = write_batch(tmp_path, blob)
    with pytest.raises(
        DataError, match=re.escape(f"refused to unpickle: the file asks for {module}.{name}")
    ):
        read_cifar10_batch(path)


def test_allowed_globals_only_accept_what_numpy_writes_for_a_uint8_array(tmp_path):
    # an object array goes through the very same _reconstruct: its dtype gives it away
    path = write_batch(
        tmp_path,
        pickle.dumps({b"data": np.array([print, 1], dtype=object), b"labels": [1, 2]}, protocol=2),
    )
    with pytest.raises(DataError, match=r"not a CIFAR-10 batch: dtype 'O8' is not uint8"):
        read_cifar10_batch(path)
    # _reconstruct asked for something other than a plain ndarray
    blob = (
        b"\x80\x02cnumpy.core.multiarray\n_reconstruct\nq\x00cnumpy\ndtype\nq\x01"
        b"K\x00\x85U\x01b\x87R."
    )
    path = write_batch(tmp_path, blob)
    with pytest.raises(DataError, match=r"not how NumPy starts a plain ndarray"):
        read_cifar10_batch(path)
    # BUILD applied to an allowed global itself (would set attributes on it) is refused
    blob = b"\x80\x02cnumpy\ndtype\nq\x00}U\x01xK\x01sb."
    path = write_batch(tmp_path, blob)
    with pytest.raises(DataError, match=r"BUILD applied to numpy\.dtype"):
        read_cifar10_batch(path)
    # numpy.ndarray may only be an argument, never called
    path = write_batch(tmp_path, b"\x80\x02cnumpy\nndarray\nK\x01\x85R.")
    with pytest.raises(DataError, match=r"numpy\.ndarray called directly"):
        read_cifar10_batch(path)
    # _codecs.encode only turns latin-1 text into bytes
    path = write_batch(
        tmp_path, b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x05\x00\x00\x00rot13\x86R."
    )
    with pytest.raises(DataError, match=r"_codecs\.encode with str and 'rot13'"):
        read_cifar10_batch(path)


def test_numpy_protocol_5_pickles_are_refused_cleanly(tmp_path):
    # NumPy writes arrays at protocol 5 through _frombuffer, which is not allowed
    path = write_batch(
        tmp_path,
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2]}, protocol=5),
    )
    with pytest.raises(
        DataError,
        match=r"refused to unpickle: the file asks for "
        r"numpy\.(_core|core)\.numeric\._frombuffer",
    ):  # NumPy 2 | 1
        read_cifar10_batch(path)


# ---------------------------------------------------------------------------------------
# load_cifar10: both formats, every place it is looked for
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["python", "binary"])
def test_load_cifar10_both_formats(tmp_path, batches, fmt):
    directory = (
        write_py(tmp_path / "cifar-10-batches-py", batches)
        if fmt == "python"
        else write_bin(tmp_path / "cifar-10-batches-bin", batches)
    )
    ds = load_cifar10(tmp_path)
    assert ds.name == "cifar10" and ds.n_classes == 10 and ds.source == str(directory)
    assert ds.input_shape == (3, 32, 32) and ds.n_features == 3072
    assert ds.x_train.shape == (15, 3072) and ds.x_test.shape == (7, 3072)
    assert ds.x_train.dtype == np.float32 and ds.x_train.flags.c_contiguous
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    assert_matches(ds, batches)
    # CHW: row k of the training set viewed as (3, 32, 32) is image k as written
    first = batches["data_batch_1"][0]
    np.testing.assert_array_equal(
        ds.x_train[:3].reshape(3, 3, 32, 32) * np.float32(255), first.astype(np.float32)
    )
    assert "3072 features (3x32x32)" in ds.describe()


def test_load_cifar10_dtype_and_normalize(tmp_path, batches):
    write_bin(tmp_path, batches)
    raw = load_cifar10(tmp_path, dtype=np.float64, normalize=False)
    assert raw.x_train.dtype == np.float64
    x, _ = expected_split(batches, "train")
    np.testing.assert_array_equal(raw.x_train, x)
    scaled = load_cifar10(tmp_path, dtype=np.float64)
    np.testing.assert_array_equal(scaled.x_train, x / 255.0)
    assert scaled.x_train.min() >= 0.0 and scaled.x_train.max() <= 1.0
    with pytest.raises(ValueError, match=r"dtype=int32 is not supported"):
        load_cifar10(tmp_path, dtype=np.int32)


@pytest.mark.parametrize(
    "layout",
    [
        "python files directly",
        "binary files directly",
        "cifar-10-batches-py/",
        "cifar-10-batches-bin/",
        "cifar10/cifar-10-batches-py/",
        "cifar10/ directly",
        "cifar-10-python.tar.gz",
        "cifar-10-binary.tar.gz",
        "cifar10/cifar-10-binary.tar.gz",
    ],
)
def test_load_cifar10_layouts_under_data_dir(tmp_path, batches, layout):
    root = tmp_path / "datasets"
    place = {
        "python files directly": lambda: write_py(root, batches),
        "binary files directly": lambda: write_bin(root, batches),
        "cifar-10-batches-py/": lambda: write_py(root / "cifar-10-batches-py", batches),
        "cifar-10-batches-bin/": lambda: write_bin(root / "cifar-10-batches-bin", batches),
        "cifar10/cifar-10-batches-py/": lambda: write_py(
            root / "cifar10" / "cifar-10-batches-py", batches
        ),
        "cifar10/ directly": lambda: write_bin(root / "cifar10", batches),
        "cifar-10-python.tar.gz": lambda: write_archive(
            root / "cifar-10-python.tar.gz", "python", batches
        ),
        "cifar-10-binary.tar.gz": lambda: write_archive(
            root / "cifar-10-binary.tar.gz", "binary", batches
        ),
        "cifar10/cifar-10-binary.tar.gz": lambda: write_archive(
            root / "cifar10" / "cifar-10-binary.tar.gz", "binary", batches
        ),
    }[layout]()
    ds = load_cifar10(root)
    assert ds.source == str(place)
    assert_matches(ds, batches)


def test_archive_is_read_without_extracting_anything(tmp_path, batches):
    archive = write_archive(tmp_path / "cifar-10-python.tar.gz", "python", batches)
    assert_matches(load_cifar10(tmp_path), batches)
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]


def test_extracted_directory_is_preferred_to_the_archive(tmp_path):
    write_archive(tmp_path / "cifar-10-python.tar.gz", "python", fake_cifar(seed=1))
    on_disk = fake_cifar(seed=2)
    directory = write_py(tmp_path / "cifar-10-batches-py", on_disk)
    ds = load_cifar10(tmp_path)
    assert ds.source == str(directory)
    assert_matches(ds, on_disk)


@pytest.mark.parametrize("subdir", ["", "cifar10"])
def test_load_cifar10_from_env_var(tmp_path, monkeypatch, batches, subdir):
    root = tmp_path / "envdata"
    write_bin((root / subdir if subdir else root) / "cifar-10-batches-bin", batches)
    monkeypatch.setenv("DPTRAIN_DATA", str(root))
    ds = load_cifar10()
    assert ds.source == str((root / subdir if subdir else root) / "cifar-10-batches-bin")


def test_load_cifar10_from_cache_and_env_first(tmp_path, monkeypatch):
    cache = tmp_path / "xdg-cache" / "dptrain" / "cifar10"
    assert data.default_cache_dir("cifar10") == cache
    write_py(cache, fake_cifar(train_sizes=(1, 1, 1, 1, 1)))
    assert load_cifar10().source == str(cache) and load_cifar10().n_train == 5
    write_py(tmp_path / "env", fake_cifar(train_sizes=(2, 1, 1, 1, 1)))
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "env"))
    assert load_cifar10().n_train == 6


def test_explicit_data_dir_is_the_only_place_searched(tmp_path, monkeypatch, batches):
    write_py(tmp_path / "env", batches)
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "env"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFound) as info:
        load_cifar10(empty)
    assert info.value.searched == [
        f"{empty} (no CIFAR-10 batches)",
        f"{empty / 'cifar10'} (no such directory)",
    ]


def test_not_found_lists_places_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(
        DataNotFound,
        match=r"CIFAR-10 not found: looked for "
        r"cifar-10-batches-py/",
    ) as info:
        load_cifar10()
    for place in (
        tmp_path / "nowhere",
        tmp_path / "nowhere" / "cifar10",
        tmp_path / "xdg-cache" / "dptrain" / "cifar10",
    ):
        assert str(place) in str(info.value)
    assert len(info.value.searched) == 3


def test_incomplete_directory_and_archive_name_what_is_missing(tmp_path, batches):
    directory = write_bin(tmp_path / "cifar-10-batches-bin", batches)
    (directory / "data_batch_2.bin").unlink()
    write_archive(tmp_path / "cifar-10-python.tar.gz", "python", batches, skip=("test_batch",))
    with pytest.raises(DataNotFound) as info:
        load_cifar10(tmp_path)
    reason = info.value.searched[0]
    assert f"{directory} lacks data_batch_2.bin" in reason
    assert "cifar-10-python.tar.gz lacks cifar-10-batches-py/test_batch" in reason


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_corrupt_archive(tmp_path, batches, damage):
    archive = write_archive(tmp_path / "cifar-10-binary.tar.gz", "binary", batches)
    blob = archive.read_bytes()
    archive.write_bytes(blob[: len(blob) // 2] if damage == "cut" else b"\x1f\x8b" + bytes(100))
    with pytest.raises(
        DataError,
        match=r"cifar-10-binary\.tar\.gz: corrupt or unreadable "
        r"tar\.gz archive",
    ) as info:
        get_cifar10(tmp_path, announce=None)
    assert not isinstance(info.value, DataNotFound)


def test_archive_member_that_is_not_a_regular_file(tmp_path, batches):
    archive = write_archive(
        tmp_path / "cifar-10-binary.tar.gz", "binary", batches, skip=("data_batch_1",)
    )
    with tarfile.open(archive, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        for member, blob in members:
            tar.addfile(member, io.BytesIO(blob))
    with pytest.raises(
        DataError,
        match=r"member cifar-10-batches-bin/data_batch_1\.bin is not "
        r"a regular file",
    ):
        load_cifar10(tmp_path)


def test_bad_batch_in_archive_names_archive_and_member(tmp_path, batches):
    batches["data_batch_5"][1][0] = 11
    write_archive(tmp_path / "cifar-10-binary.tar.gz", "binary", batches)
    with pytest.raises(
        DataError,
        match=r"cifar-10-binary\.tar\.gz member "
        r"cifar-10-batches-bin/data_batch_5\.bin: label 11 of "
        r"image 0 is out of range",
    ):
        load_cifar10(tmp_path)


def test_truncated_file_in_directory_is_reported_not_replaced(tmp_path, batches):
    directory = write_bin(tmp_path / "cifar-10-batches-bin", batches)
    blob = (directory / "test_batch.bin").read_bytes()
    (directory / "test_batch.bin").write_bytes(blob[:-5])
    with pytest.raises(
        DataError,
        match=r"test_batch\.bin: size 21506 bytes is not a whole "
        r"number of 3073-byte records",
    ):
        get_cifar10(tmp_path, announce=None)


# ---------------------------------------------------------------------------------------
# the synthetic stand-in
# ---------------------------------------------------------------------------------------


def test_get_cifar10_synthetic_fallback_announces_one_line(tmp_path):
    lines = []
    ds = get_cifar10(announce=lines.append, synthetic_n_train=300, synthetic_n_test=100)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "CIFAR-10 not found" in lines[0] and "SYNTHETIC" in lines[0]
    assert "never downloaded" in lines[0]
    assert str(tmp_path / "xdg-cache" / "dptrain" / "cifar10") in lines[0]
    assert ds.source == "synthetic (CIFAR-10 not found)" and ds.name == "synthetic-cifar10"
    assert ds.x_train.shape == (300, 3072) and ds.x_test.shape == (100, 3072)
    assert ds.input_shape == (3, 32, 32) and ds.n_classes == 10
    with pytest.raises(DataNotFound, match=r"CIFAR-10 not found"):
        get_cifar10(allow_synthetic=False)


def test_a_named_directory_without_cifar10_is_an_error_and_nothing_is_created(tmp_path):
    lines = []
    with pytest.raises(DataNotFound, match=r"CIFAR-10 not found.*cifar-10-batches-py") as info:
        get_cifar10(tmp_path / "none", announce=lines.append)
    assert str(tmp_path / "none") in str(info.value)
    assert lines == [] and not (tmp_path / "none").exists()


# ---------------------------------------------------------------------------------------
# load_dataset and the command line
# ---------------------------------------------------------------------------------------


def test_load_dataset_cifar10_with_limit(tmp_path, batches):
    write_py(tmp_path / "cifar-10-batches-py", batches)
    ds = load_dataset("cifar10", data_dir=tmp_path, limit=4)
    x, y = expected_split(batches, "train")
    np.testing.assert_array_equal(ds.x_train, x[:4] / np.float32(255))
    np.testing.assert_array_equal(ds.y_train, y[:4])
    assert ds.x_train.base is None and ds.x_test.shape == (7, 3072)
    assert ds.input_shape == (3, 32, 32)
    with pytest.raises(ValueError, match=r"limit=16 exceeds the 15 training samples of cifar10"):
        load_dataset("cifar10", data_dir=tmp_path, limit=16)
    with pytest.raises(
        ValueError,
        match=r"n_samples=5 applies only to name='synthetic', not "
        r"name='cifar10'",
    ):
        load_dataset("cifar10", data_dir=tmp_path, n_samples=5)
    with pytest.raises(
        ValueError,
        match=r"cannot upscale cifar10: n_features=3072 is not a "
        r"square image",
    ):
        load_dataset("cifar10", data_dir=tmp_path, upscale=2)


def test_load_dataset_cifar10_fallback_draws_only_the_limit(tmp_path):
    lines = []
    ds = load_dataset("cifar10", limit=500, seed=2, announce=lines.append)
    assert len(lines) == 1 and "SYNTHETIC" in lines[0]
    assert ds.x_train.shape == (500, 3072) and ds.x_test.shape == (10_000, 3072)
    reference = synthetic_cifar10(500, 10, seed=2)
    np.testing.assert_array_equal(ds.x_train, reference.x_train)


def test_cli_trains_on_cifar10_files(tmp_path, batches, capsys):
    write_bin(tmp_path / "cifar-10-batches-bin", batches)
    out = tmp_path / "run.json"
    rc = cli.main(
        [
            "train",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path),
            "--model",
            "softmax",
            "--epochs",
            "1",
            "--batch-size",
            "5",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["dataset"]["source"] == str(tmp_path / "cifar-10-batches-bin")
    assert result["dataset"]["n_train"] == 15 and result["dataset"]["n_features"] == 3072


@pytest.mark.parametrize("quiet", [False, True])
def test_cli_cifar10_fallback_is_announced_on_stderr_even_when_quiet(tmp_path, capsys, quiet):
    from dptrain.engine import data

    data.ANNOUNCED.clear()
    out = tmp_path / "run.json"
    rc = cli.main(
        [
            "train",
            "--dataset",
            "cifar10",
            "--model",
            "softmax",
            "--epochs",
            "1",
            "--limit",
            "200",
            "--batch-size",
            "50",
            "--out",
            str(out),
        ]
        + (["--quiet"] if quiet else [])
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "CIFAR-10 not found" in captured.err and "SYNTHETIC CIFAR-10-shaped" in captured.err
    assert ("test acc" in captured.out) is not quiet
    result = json.loads(out.read_text())
    assert result["config"]["dataset"] == result["dataset"]["name"] == "synthetic-cifar10"
    assert result["config"]["requested_dataset"] == "cifar10" and result["dataset"]["synthetic"]


def test_cli_named_data_dir_without_cifar10_fails_and_creates_nothing(tmp_path, capsys):
    rc = cli.main(
        [
            "train",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "none"),
            "--model",
            "softmax",
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 1 and "CIFAR-10 not found" in captured.err
    assert str(tmp_path / "none") in captured.err
    assert not (tmp_path / "none").exists() and not (tmp_path / "r.json").exists()


def test_python_batches_are_checked_against_the_published_md5(tmp_path, batches):
    write_py(tmp_path / "cifar-10-batches-py", batches)
    with pytest.warns(
        data.DataWarning,
        match=r"CIFAR-10 in .* is not the published data set: "
        r"data_batch_1 \(md5 [0-9a-f]{32}, published "
        r"c99cafc152244af753f735de768cd75f\)",
    ):
        ds = load_cifar10(tmp_path)
    assert ds.integrity == "modified"


def test_binary_batches_have_no_published_md5_and_say_unchecked(tmp_path, batches, recwarn):
    write_bin(tmp_path / "cifar-10-batches-bin", batches)
    assert load_cifar10(tmp_path).integrity == "unchecked"
    assert not [w for w in recwarn if issubclass(w.category, data.DataWarning)]


def test_cli_dataset_choices():
    parser = cli.build_parser()
    assert parser.parse_args(["train", "--dataset", "cifar10"]).dataset == "cifar10"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--dataset", "cifar100"])
