"""`python -m dptrain plot` given a file that is not a sweep (an .npz, random bytes, invalid
JSON, JSON of another shape): one line naming the file, what it is and what it should be,
never a codec's or the JSON parser's own words alone. No figure is drawn, so matplotlib is
not needed."""

import zipfile

import pytest

from dptrain import cli
from dptrain.measure.perfmodel import load_runs
from dptrain.measure.plots.load import load_trace

EXPECTED = (
    "expected a sweep directory or its sweep.json, written by `python -m dptrain sweep --out DIR`"
)
RANDOM = bytes(range(128, 256)) * 8  # not UTF-8, no NUL: what `head -c /dev/urandom` gives


def _npz(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("params.npy", b"\x93NUMPY")
    return path


@pytest.mark.parametrize(
    "content, what",
    [
        (None, "is an .npz archive (np.savez's format), not JSON"),
        (RANDOM, "is binary data, not JSON"),
        (b"\xff\xfe{}", "is binary data, not JSON"),
        (b'{"summary": [1, 2', "is not valid JSON (Expecting "),
        (b'{"runs": []}', "holds a JSON dict with keys ['runs'], not a sweep"),
        (b'"a string"', "holds a JSON str, not a sweep"),
    ],
)
@pytest.mark.parametrize("as_dir", [False, True])
def test_plot_of_a_file_that_is_not_a_sweep_names_it(tmp_path, capsys, content, what, as_dir):
    if as_dir:  # a directory whose sweep.json holds it
        (tmp_path / "bs").mkdir()
        path, arg = tmp_path / "bs" / "sweep.json", tmp_path / "bs"
    else:
        path = arg = tmp_path / "corrupt.npz"
    if content is None:
        _npz(path)
    else:
        path.write_bytes(content)
    rc = cli.main(["plot", str(arg), "--out", str(tmp_path / "out"), "--no-model"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(f"dptrain: error: {path} {what}"), err
    assert EXPECTED in err, err


def test_the_performance_model_and_trace_readers_name_the_file(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_bytes(RANDOM)
    with pytest.raises(ValueError, match=rf"^{path} is binary data, not JSON: {EXPECTED}"):
        load_runs(tmp_path)
    trace = _npz(tmp_path / "trace.json")
    with pytest.raises(ValueError, match=rf"^{trace} is an .npz archive .*, not JSON: expected a "):
        load_trace(trace)
