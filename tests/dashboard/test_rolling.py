"""Rolling statistics updated step by step agree with recomputing them from scratch."""

import math
import random

import numpy as np
import pytest

from dashboard.rolling import RollingPercentiles, RollingRate


def test_percentiles_match_numpy_over_the_last_values() -> None:
    rng = random.Random(0)
    rolling = RollingPercentiles(window=16)
    seen: list[float] = []
    assert all(math.isnan(x) for x in rolling.add([]))
    for _ in range(200):
        new = [rng.choice([1.0, 2.0, rng.uniform(0, 100)]) for _ in range(rng.randint(0, 3))]
        seen += new
        p50, p99 = rolling.add(new)
        if seen:
            last = seen[-16:]
            assert p50 == pytest.approx(np.percentile(last, 50))
            assert p99 == pytest.approx(np.percentile(last, 99))
    assert len(rolling.ranked) == 16


def test_rate_counts_the_steps_after_the_windows_first() -> None:
    rate = RollingRate(window=3, width=2)
    times = [0.0, 0.5, 1.0, 2.0, 2.5]
    counts = [
        np.array([10.0, 1.0]),
        np.array([20.0, 2.0]),
        np.array([30.0, 3.0]),
        np.array([40.0, 4.0]),
        np.array([50.0, 5.0]),
    ]
    out = [rate.add(t, c) for t, c in zip(times, counts, strict=True)]
    assert np.isnan(out[0]).all()  # no span yet
    assert out[1] == pytest.approx([40.0, 4.0])  # 20 over 0.5 s
    assert out[3] == pytest.approx([(20 + 30 + 40) / 2.0, 9 / 2.0])  # steps 1..3 since t=0
    assert out[4] == pytest.approx([(30 + 40 + 50) / 2.0, 12 / 2.0])  # steps 2..4 since t=0.5
