"""The optimizer's side (dptrain.optim): learning-rate schedules."""

import pytest

from dptrain import optim


def test_lr_schedules():
    assert optim.lr_at(5, 10, 0.2, "constant") == 0.2
    assert optim.lr_at(0, 10, 0.2, "cosine") == pytest.approx(0.2)
    assert optim.lr_at(5, 10, 0.2, "cosine") == pytest.approx(0.1)
    assert optim.lr_at(0, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.05)
    assert optim.lr_at(3, 10, 0.2, "constant", warmup_steps=4) == pytest.approx(0.2)
