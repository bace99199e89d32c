"""The user's files as the command line and dptrain.data read them: CSV (header detected,
label column by name or index, the first bad value named by line and column) beside .npy
and .npz; a damaged or mistaken file is one line naming it and what it is, never a
traceback or NumPy's allow_pickle advice."""

import numpy as np
import pytest

from dptrain import cli
from dptrain.data import DataError, from_csv, from_files, from_npy, from_npz

ROWS = [
    [0.5, 1.0, -2.0, 0],
    [1.5, 0.0, 3.25, 1],
    [2.0, -1.0, 0.0, 2],
    [0.0, 4.0, 1.0, 1],
    [3.0, 2.0, -1.5, 0],
    [1.0, 1.0, 1.0, 2],
]
TRAIN_FLAGS = ["--model", "softmax", "--epochs", "1", "--batch-size", "2", "--quiet"]


def _write(path, text):
    path.write_text(text)
    return path


def _csv(path, rows=ROWS, header="a,b,c,label", delimiter=","):
    lines = ([header] if header else []) + [delimiter.join(f"{v:g}" for v in r) for r in rows]
    return _write(path, "\n".join(lines) + "\n")


# ---------------------------------------------------------------- reading CSV
@pytest.mark.parametrize("header", ["a,b,c,label", None])
def test_csv_header_is_detected(tmp_path, header):
    ds = from_csv(_csv(tmp_path / "d.csv", header=header))
    assert (ds.n_train, ds.n_features, ds.n_classes) == (6, 3, 3)
    assert np.array_equal(ds.x_train, np.array(ROWS, np.float32)[:, :3])
    assert ds.y_train.dtype == np.int64 and list(ds.y_train) == [0, 1, 2, 1, 0, 2]


@pytest.mark.parametrize("column", ["a", 0, "0", -4])
def test_the_label_column_by_name_or_index(tmp_path, column):
    ds = from_csv(_csv(tmp_path / "d.csv"), label_column=column, task="regression")
    assert np.array_equal(ds.y_train[:, 0], np.array(ROWS, np.float32)[:, 0])
    assert np.array_equal(ds.x_train, np.array(ROWS, np.float32)[:, 1:])


@pytest.mark.parametrize("delimiter", ["\t", ";", "  "])
def test_other_delimiters(tmp_path, delimiter):
    ds = from_csv(
        _csv(tmp_path / "d.txt", header="a b c label".replace(" ", delimiter), delimiter=delimiter)
    )
    assert ds.n_features == 3 and list(ds.y_train) == [0, 1, 2, 1, 0, 2]


@pytest.mark.parametrize(
    "text, message",
    [
        ("a,b,label\n1,2,0\n3,x,1\n", r"line 3, column 2 \('b'\): 'x' is not a finite number"),
        ("1,2,0\n3,,1\n", r"line 2, column 2: is empty"),
        ("1,2,0\n3,nan,1\n", r"line 2, column 2: 'nan' is not a finite number"),
        # Python's float takes digits grouped by _ ('3_1' is 31): an identifier, likelier
        ("1,2,0\n3_1,4,1\n", r"line 2, column 1: '3_1' is not a finite number"),
        ("# comment\n1,2,0\n\n3,4\n", r"line 4 has 2 fields, but line 2 has 3"),
        ("a,b,label\n", r"holds a header line but no data"),
        ("\n# only a comment\n", r"holds no data"),
        (
            "id,2019,label\n1,2,0\n",
            r"line 1, column 1: 'id' is not a finite number \(if line 1 is a header, say so",
        ),
    ],
)
def test_a_bad_value_is_named_by_line_and_column(tmp_path, text, message):
    p = _write(tmp_path / "bad.csv", text)
    with pytest.raises(DataError, match=rf"{p} {message}"):
        from_csv(p)


@pytest.mark.parametrize(
    "text, where",
    [
        ("a,b,animal\n1,2,cat\n3,4,dog\n", "line 2, column 3 ('animal')"),
        ("1,2,cat\n3,4,dog\n", "line 1, column 3"),  # no header: not taken for one
        ("animal,a,b\ncat,1,2\n", "line 2, column 1 ('animal')"),  # label_column below
    ],
)
def test_text_labels_say_labels_are_numbers_and_how_to_map_them(tmp_path, text, where):
    p = _write(tmp_path / "pets.csv", text)
    column = "animal" if text.startswith("animal") else None
    with pytest.raises(DataError) as info:
        from_csv(p, label_column=column)
    assert str(info.value).startswith(f"{p} {where}: 'cat' is a text label: labels must be ")
    for part in ("class indices 0..C-1", "np.unique(labels, return_inverse=True)", "sklearn"):
        assert part in str(info.value)
    with pytest.raises(DataError, match=r"'cat' is not a number: regression targets must be"):
        from_csv(p, label_column=column, task="regression")


def test_cli_text_labels_in_a_labels_file_are_one_line(tmp_path, capsys):
    x = _write(tmp_path / "x.csv", "1,2\n3,4\n")
    y = _write(tmp_path / "y.csv", "animal\ncat\ndog\n")
    assert cli.main(["train", *TRAIN_FLAGS, "--train-x", str(x), "--train-y", str(y)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{y} line 2, column 1 ('animal'): 'cat' is a text label: labels must be" in err
    # a text column among the features is not a label: the message stays the value's own
    x = _write(tmp_path / "x.csv", "1,red\n3,blue\n")
    y = _write(tmp_path / "y.csv", "0\n1\n")
    assert cli.main(["train", *TRAIN_FLAGS, "--train-x", str(x), "--train-y", str(y)]) == 1
    assert f"{x} line 1, column 2: 'red' is not a finite number" in capsys.readouterr().err


def test_an_unknown_label_column_lists_the_columns(tmp_path):
    p = _csv(tmp_path / "d.csv")
    with pytest.raises(
        DataError, match=r"label column 'y' is not a column .*: its columns are a, b, c, label"
    ):
        from_csv(p, label_column="y")
    with pytest.raises(DataError, match=r"label column 7 is out of range: .* has 4 columns"):
        from_csv(p, label_column=7)


def test_a_csv_in_another_encoding_or_empty_says_so(tmp_path):
    """Latin-1 and UTF-16 text is text, not "neither .npy nor .npz nor CSV: expected an .npz
    archive"; an empty file is empty, with what it could have held."""
    from dptrain.data import from_files

    latin1, utf16, empty = tmp_path / "l.csv", tmp_path / "u.csv", tmp_path / "e.csv"
    latin1.write_bytes("a,b,caf\u00e9\n0.1,0.2,0\n0.3,0.4,1\n".encode("latin-1"))
    utf16.write_bytes("a,b\n1,0\n2,1\n".encode("utf-16"))
    empty.write_bytes(b"")
    for p in (latin1, utf16):
        with pytest.raises(
            DataError, match=r"is text that is not UTF-8 .*save the file as UTF-8\)$"
        ):
            from_files(p)
    with pytest.raises(DataError, match=r"e.csv is empty: expected CSV text or an .npz archive"):
        from_files(empty)
    noise = tmp_path / "n.csv"  # no zero byte, not UTF-8, and not text either
    noise.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(DataError, match=r"n.csv is neither a .npy or .npz file nor CSV text"):
        from_files(noise)
    with pytest.raises(DataError, match=r"e.csv is empty: expected CSV text or a .npy array"):
        from_files(_csv(tmp_path / "x.csv"), empty)


def test_a_label_column_name_given_twice_in_the_header_is_refused(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("a,label,c,label\n1,0,2,1\n3,1,4,0\n5,0,6,1\n")
    with pytest.raises(DataError, match=r"label column 'label' is ambiguous: .* columns 1, 3 so"):
        from_csv(p, label_column="label")
    assert list(from_csv(p, label_column=3).y_train) == [1, 0, 1]


def test_csv_header_can_be_forced(tmp_path):
    p = _write(tmp_path / "d.csv", "1999,2000,0\n1,2,1\n3,4,0\n")
    assert from_csv(p, header=True).n_train == 2
    assert from_csv(p).n_train == 3


# ---------------------------------------------------------------- files of the wrong kind
def test_a_csv_given_as_npz_or_npy_says_what_it_is(tmp_path):
    p = _csv(tmp_path / "data.npz")
    for load in (from_npz, lambda q: from_npy(q, q)):
        with pytest.raises(DataError) as info:
            load(p)
        text = str(info.value)
        assert f"{p} is a text file (CSV?), not a" in text and "read CSV with from_csv" in text
        assert "allow_pickle" not in text


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "not a zip", "empty"])
def test_a_damaged_npz_is_a_data_error_naming_it(tmp_path, damage):
    good = tmp_path / "good.npz"
    np.savez(good, X=np.ones((50, 4)), y=np.arange(50) % 2)
    raw = bytearray(good.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "bit-flipped":
        raw[len(raw) // 2] ^= 0x04
    elif damage == "not a zip":
        raw = b"\x01\x02binary junk"
    else:
        raw = b""
    p = tmp_path / "bad.npz"
    p.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"{p}"):
        from_npz(p)


# ---------------------------------------------------------------- the command line
def test_cli_trains_on_a_csv(tmp_path, capsys):
    p = _csv(tmp_path / "d.csv", rows=ROWS * 5)
    assert cli.main(["train", *TRAIN_FLAGS, "--data", str(p), "--validation", "0.2"]) == 0
    rc = cli.main(["train", *TRAIN_FLAGS, "--data", str(p), "--label-column", "a"])
    assert rc == 1 and "is not a whole number" in capsys.readouterr().err


def test_cli_trains_on_csv_features_and_labels(tmp_path):
    x = tmp_path / "x.csv"
    _write(x, "\n".join(",".join(f"{v:g}" for v in r[:3]) for r in ROWS * 5) + "\n")
    y = _csv(tmp_path / "y.csv", rows=ROWS * 5)  # several columns: --label-column picks
    np.save(tmp_path / "y.npy", np.array([r[3] for r in ROWS * 5], np.int64))
    for labels, extra in ((y, ["--label-column", "label"]), (tmp_path / "y.npy", [])):
        rc = cli.main(
            ["train", *TRAIN_FLAGS, "--train-x", str(x), "--train-y", str(labels), *extra]
        )
        assert rc == 0


def test_cli_a_test_x_without_a_test_y_names_the_flags(tmp_path, capsys):
    x = _csv(tmp_path / "d.csv")
    argv = ["train", *TRAIN_FLAGS, "--train-x", str(x), "--train-y", str(x), "--test-x", str(x)]
    assert cli.main(argv) == 1
    assert "--test-x and --test-y go together" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        (b"PK\x03\x04 a damaged zip", "cannot be read"),
        (b"", "is empty"),
        (b"\x00\x01\x02\x03binary", "neither a .npy or .npz file nor CSV text"),
        (b"a,b,c\n1,x,0\n", "line 2, column 2 ('b'): 'x' is not a finite number"),
        (b"a,b\n1,x\n", "line 2, column 2 ('b'): 'x' is a text label: labels must be numbers"),
    ],
)
def test_cli_bad_data_file_is_one_line(tmp_path, capsys, content, message):
    p = tmp_path / "corrupt.npz"
    p.write_bytes(content)
    rc = cli.main(["train", *TRAIN_FLAGS, "--data", str(p)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(p) in err and message in err, err


def test_cli_a_npy_given_as_data_says_what_to_do(tmp_path, capsys):
    p = tmp_path / "x.npy"
    np.save(p, np.zeros((4, 2)))
    assert cli.main(["train", *TRAIN_FLAGS, "--data", str(p)]) == 1
    err = capsys.readouterr().err
    assert f"{p} is a .npy array (np.save's format), not an .npz archive" in err
    assert "read it with from_npy (command line: --train-x)" in err


def test_from_files_reads_each_file_by_its_content(tmp_path):
    x = tmp_path / "x.data"
    np.save(tmp_path / "x.npy", np.array(ROWS, np.float32)[:, :3])
    (tmp_path / "x.npy").rename(x)
    y = _write(tmp_path / "labels.bin", "label\n0\n1\n2\n1\n0\n2\n")
    ds = from_files(x, y)
    assert isinstance(ds.x_train, np.memmap) and list(ds.y_train) == [0, 1, 2, 1, 0, 2]


def test_a_label_column_for_a_file_that_is_not_csv_is_refused(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.ones((4, 2)), y=np.arange(4) % 2)
    with pytest.raises(ValueError, match=r"label column 'y' picks a column of a CSV file, but"):
        from_files(tmp_path / "d.npz", label_column="y")
    np.save(tmp_path / "y.npy", np.arange(4) % 2)
    x = _write(tmp_path / "x.csv", "1,2\n3,4\n5,6\n7,8\n")
    with pytest.raises(ValueError, match=rf"label column 0 .* but {tmp_path / 'y.npy'} is not"):
        from_files(x, tmp_path / "y.npy", label_column=0)
    assert from_files(x, tmp_path / "y.npy").n_train == 4
