"""Model files: save and load_model agree on the .npz suffix and refuse directories; a saved
file is written atomically; every damaged, hostile or foreign file is one ValueError naming
it, found from the headers before anything large is allocated (bit flips, truncation, a
config naming a huge network, zip bombs, NaN weights)."""

import io
import json
import os
import tracemalloc
import zipfile

import numpy as np
import pytest

import dptrain
from dptrain import MLP, _files, load_model

SMALL_FILE_PEAK = 16 << 20  # bytes: loading a refused small file allocates no more


def _saved(tmp_path, name="m.npz", **kw):
    model = MLP((6, 5, 3), seed=1, **kw)
    model.velocity[:] = 0.25
    path = tmp_path / name
    model.save(path)
    return model, path


def _npy_bytes(array=None, *, header_shape=None, dtype="<f4", data=b""):
    """An .npy member: a real array's, or a header declaring `header_shape` over `data`."""
    f = io.BytesIO()
    if array is not None:
        np.lib.format.write_array(f, array, allow_pickle=False)
        return f.getvalue()
    np.lib.format.write_array_header_1_0(
        f, {"descr": dtype, "fortran_order": False, "shape": header_shape}
    )
    return f.getvalue() + data


def _write_npz(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as z:
        for key, raw in members.items():
            z.writestr(key + ".npy", raw)
    return path


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ---------------------------------------------------------------- names and places
def test_save_and_load_model_agree_on_the_npz_suffix(tmp_path):
    model = MLP((4, 3, 2), seed=3)
    written = model.save(tmp_path / "m")
    assert written == tmp_path / "m.npz" and written.is_file()
    assert not (tmp_path / "m").exists()
    back = load_model(tmp_path / "m")  # finds m.npz, as np.load users expect of np.savez
    assert np.array_equal(back.params, model.params)
    assert np.array_equal(load_model(str(tmp_path / "m.npz")).params, model.params)


def test_save_to_an_open_file_writes_it_as_it_is(tmp_path):
    model = MLP((4, 3, 2), seed=3)
    with open(tmp_path / "open.bin", "wb") as f:
        assert model.save(f) is None
    assert np.array_equal(load_model(tmp_path / "open.bin").params, model.params)


def test_save_to_a_directory_is_refused_naming_it(tmp_path):
    model = MLP((4, 3, 2))
    (tmp_path / "somedir").mkdir()
    (tmp_path / "other.npz").mkdir()
    for target in ("somedir", "other", "other.npz"):
        with pytest.raises(ValueError, match=rf"{tmp_path / target}.* is a directory"):
            model.save(tmp_path / target)
    assert list((tmp_path / "somedir").iterdir()) == []
    assert not (tmp_path / "somedir.npz").exists()
    with pytest.raises(ValueError, match=r"directory .*missing does not exist"):
        model.save(tmp_path / "missing" / "m.npz")
    with pytest.raises(ValueError, match=rf"model file {tmp_path / 'somedir'} is a directory"):
        load_model(tmp_path / "somedir")


def test_a_missing_model_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=rf"model file {tmp_path / 'nope'}: no such file"):
        load_model(tmp_path / "nope")


def test_save_is_atomic_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    """A write that fails midway (a full disk) leaves the previous model whole, and no
    temporary behind."""
    old, path = _saved(tmp_path)
    before = path.read_bytes()

    def full_disk(f, **arrays):
        f.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dptrain.models, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        MLP((6, 5, 3), seed=9).save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]
    assert np.array_equal(load_model(path).params, old.params)


def test_save_writes_through_the_checkpoints_helper(tmp_path, monkeypatch):
    """One atomic writer for models and checkpoints (the file is fsynced, then renamed)."""
    calls = []
    real = _files.write_atomically
    monkeypatch.setattr(
        dptrain.models, "write_atomically", lambda p, w: calls.append(p) or real(p, w)
    )
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    MLP((4, 3, 2)).save(tmp_path / "w")
    assert calls == [tmp_path / "w.npz"] and synced


# ---------------------------------------------------------------- damaged files
def test_bit_flips_load_cleanly_or_name_the_file(tmp_path):
    """Every single-bit flip of a small model file (400 seeded positions, over the zip's
    headers, the configuration and the arrays) either loads the saved model (same shape,
    finite, the very weights), or raises one ValueError naming the file: never zipfile's,
    zlib's or NumPy's own exception."""
    model, good = _saved(tmp_path)
    data = good.read_bytes()
    rng = np.random.default_rng(33)
    positions = rng.choice(len(data) * 8, size=400, replace=False)
    outcomes = {"loaded": 0, "refused": 0}
    flipped = tmp_path / "flipped.npz"
    for bit in positions:
        b = bytearray(data)
        b[bit // 8] ^= 1 << (bit % 8)
        flipped.write_bytes(bytes(b))
        try:
            back = load_model(flipped)
        except ValueError as exc:
            assert type(exc) is ValueError, (bit, exc)
            assert str(flipped) in str(exc), (bit, exc)
            outcomes["refused"] += 1
        except BaseException as exc:  # noqa: BLE001 (the point: nothing else escapes)
            pytest.fail(f"bit {bit}: {type(exc).__name__}: {exc}")
        else:
            assert back.params.shape == model.params.shape, bit
            assert np.isfinite(back.params).all() and np.isfinite(back.velocity).all(), bit
            # the arrays are CRC-checked: what loads is the saved model, never other weights
            # (a flip in the zip's spare fields, e.g. a timestamp, changes nothing read)
            assert np.array_equal(back.params, model.params), bit
            assert np.array_equal(back.velocity, model.velocity), bit
            outcomes["loaded"] += 1
    assert outcomes["refused"] and outcomes["loaded"], outcomes


@pytest.mark.parametrize("cut", [0, 1, 30, 200, 0.5, -1])
def test_a_truncated_model_file_is_named(tmp_path, cut):
    _, good = _saved(tmp_path)
    data = good.read_bytes()
    n = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    p = tmp_path / "cut.npz"
    p.write_bytes(data[:n])
    with pytest.raises(ValueError, match=rf"model file {p}") as info:
        load_model(p)
    assert type(info.value) is ValueError


def test_text_and_csv_files_are_named_with_what_they_are(tmp_path):
    csv = tmp_path / "weights.npz"
    csv.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError) as info:
        load_model(csv)
    assert "text file (CSV?), not an .npz archive" in str(info.value)
    assert "Model.save" in str(info.value) and "allow_pickle" not in str(info.value)


def test_a_checkpoint_is_named_as_one_with_how_to_get_a_model(tmp_path, train_small):
    ckpt = tmp_path / "ck.npz"
    train_small(checkpoint=str(ckpt), checkpoint_every=4, epochs=1)
    with pytest.raises(ValueError) as info:
        load_model(ckpt)
    text = str(info.value)
    assert text.startswith(f"model file {ckpt} is a training checkpoint (what --resume")
    assert "--save-weights FILE" in text and "model.save(FILE)" in text


@pytest.mark.parametrize("text", ['{"config": {}, "epochs": []}\n', "  [1, 2]"])
def test_a_json_file_is_named_json_not_csv(tmp_path, text):
    run = tmp_path / "run.json"
    run.write_text(text)
    with pytest.raises(ValueError) as info:
        load_model(run)
    assert str(info.value).startswith(
        f"model file {run} is a JSON file (such as a run's --out result), not an .npz archive"
    )


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_on_load(tmp_path, value):
    model, path = _saved(tmp_path)
    model.params[7] = value
    model.save(path)
    with pytest.raises(ValueError, match=rf"model file {path}: params holds non-finite"):
        load_model(path)
    with pytest.raises(ValueError, match="non-finite"):
        MLP((6, 5, 3)).load_state(path)


# ---------------------------------------------------------------- sizes, before allocating
def test_a_small_file_naming_a_huge_network_allocates_nothing(tmp_path):
    """A 3 kB file whose configuration names a wide network (4e10 parameters) is refused
    from its headers: the model is never built."""
    config = MLP((4, 3, 2)).config()
    config.update(sizes=[200_000, 200_000, 10], layers=[["dense", 200_000], "relu", ["dense", 10]])
    config["input_shape"] = [200_000]
    p = _write_npz(
        tmp_path / "wide.npz",
        {
            "config": _npy_bytes(np.array(json.dumps(config))),
            "params": _npy_bytes(np.zeros(23, np.float32)),
            "velocity": _npy_bytes(np.zeros(23, np.float32)),
        },
    )
    assert p.stat().st_size < 4000

    def load():
        with pytest.raises(ValueError, match=rf"model file {p}") as info:
            load_model(p)
        assert "40,002,200,010" in str(info.value)

    assert _peak_bytes(load) < SMALL_FILE_PEAK


@pytest.mark.parametrize(
    "params, compression, declared",
    [
        # a header declaring 2^40 values over 92 bytes of data
        (_npy_bytes(header_shape=(2**40,), data=b"\0" * 92), zipfile.ZIP_STORED, 2**40),
        # a zip bomb: 64 MB of zeros deflated into a 64 kB member
        (_npy_bytes(np.zeros(16 << 20, np.float32)), zipfile.ZIP_DEFLATED, 16 << 20),
    ],
    ids=["2^40 values", "zip bomb"],
)
def test_a_huge_array_header_is_refused_unread(tmp_path, params, compression, declared):
    """The configuration names 53 parameters; the params member declares far more: refused
    from its .npy header, nothing read or decompressed past it."""
    model, good = _saved(tmp_path)
    with np.load(good) as f:
        config = f["config"]
    members = {
        "config": _npy_bytes(config),
        "params": params,
        "velocity": _npy_bytes(model.velocity),
    }
    p = _write_npz(tmp_path / "huge.npz", members, compression)
    assert p.stat().st_size < 1 << 20

    def load():
        message = rf"model file {p}: params has .* shape \({declared},\)"
        with pytest.raises(ValueError, match=message):
            load_model(p)

    assert _peak_bytes(load) < SMALL_FILE_PEAK


def test_a_member_that_claims_more_than_the_file_holds_is_refused(tmp_path):
    """The zip's own header lies about a member's size: refused before it is read."""
    model, good = _saved(tmp_path)
    data = bytearray(good.read_bytes())
    # the central directory's entry of params.npy: its uncompressed size field (offset 24)
    at = data.rindex(b"PK\x01\x02", 0, data.rindex(b"params.npy"))
    data[at + 24 : at + 28] = (2**31).to_bytes(4, "little")
    p = tmp_path / "liar.npz"
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"model file {p} cannot be read"):
        load_model(p)
