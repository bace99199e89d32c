"""Behaviour of the Python engine fixed after review: each test names the finding it guards.
(The C core's are in the test file of their family: test_act.py, test_loss.py, test_sgd.py,
test_model_core.py, test_context.py, test_gather_rows.py.)
"""
import numpy as np
import pytest

import dptrain
from dptrain.models import MLP, load_model


def test_load_model_rejects_damaged_files_with_their_name(tmp_path):
    m = MLP((4, 3, 2))
    good = tmp_path / "m.npz"
    m.save(good)
    cases = {
        "scalar.npz": dict(config=np.array(open(good, "rb") and str(np.load(good)["config"])),
                           params=np.float32(0.5), velocity=np.zeros(23, np.float32)),
        "f64.npz": dict(config=np.load(good)["config"], params=np.zeros(23),
                        velocity=np.zeros(23)),
        "novel.npz": dict(config=np.load(good)["config"], params=np.zeros(23, np.float32)),
        "nokind.npz": dict(config=np.array('{"sizes": [4, 3, 2]}'), params=np.zeros(23)),
    }
    for name, arrays in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            load_model(tmp_path / name)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="junk.npz is not a readable"):
        load_model(tmp_path / "junk.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ValueError, match="single .npy array"):
        load_model(tmp_path / "single.npy")
    assert np.array_equal(load_model(good).params, m.params)


def test_a_huge_batch_size_on_a_small_data_set_does_not_allocate_it():
    import dptrain
    r = dptrain.train(model="softmax", dataset="synthetic", n_samples=200, epochs=1,
                      batch_size=10**11, quiet=True)
    assert r["steps"] == 1
