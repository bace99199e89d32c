"""Which samples each step uses (dptrain.sampler): the shards of a global batch, the
epochs' orders, the steps per epoch."""

import numpy as np

from dptrain import sampler


def test_shard_covers_each_batch_exactly_once():
    for start, stop in [(0, 100), (100, 130), (7, 8)]:
        for world in (1, 2, 3, 4, 8):
            parts = [sampler.shard(start, stop, r, world) for r in range(world)]
            assert parts[0][0] == start and parts[-1][1] == stop
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            sizes = [hi - lo for lo, hi in parts]
            assert max(sizes) - min(sizes) <= 1


def test_steps_per_epoch_counts_the_batches_kept():
    for n, batch in [(1030, 100), (1000, 100), (1, 7), (7, 1), (99, 100)]:
        assert sampler.steps_per_epoch(n, batch) == len(sampler.batch_bounds(n, batch))


def test_epoch_orders_are_seeded_permutations():
    a = sampler.epoch_order(50, 1, seed=7)
    assert sorted(a.tolist()) == list(range(50)) and a.dtype == np.int64
    assert np.array_equal(a, sampler.epoch_order(50, 1, seed=7))
    assert not np.array_equal(a, sampler.epoch_order(50, 2, seed=7))
    assert not np.array_equal(a, sampler.epoch_order(50, 1, seed=8))
    assert np.array_equal(sampler.epoch_order(50, 3, 7, shuffle=False), np.arange(50))
