"""The scaling benchmark's arithmetic: the fitted exponent and the coordinator's wire bytes.

``benchmarks/scaling.py`` reports exponents from a log-log least-squares fit and bytes per
step from the coordinator's own encoder; these cases pin both to what they claim to be.
"""

import numpy as np
import pytest

from benchmarks import scaling
from chronica.comm.protocol import decode, topic
from chronica.core import ScheduleConfig, Scheduler


@pytest.mark.parametrize("exponent, prefactor", [(1.0, 2e-8), (1.5, 3.0), (0.0, 5.0), (-1.0, 7.0)])
def test_fit_recovers_a_power_law(exponent, prefactor):
    x = np.logspace(4, 8, 5)
    k, c = scaling.fit_exponent(x, prefactor * x**exponent)
    assert k == pytest.approx(exponent, abs=1e-9)
    assert c == pytest.approx(prefactor, rel=1e-6)


def test_fit_is_least_squares_on_log_log():
    x = np.array([1e4, 1e5, 1e6, 1e7])
    noise = np.array([1.1, 0.9, 1.05, 0.95])
    k, _ = scaling.fit_exponent(x, 3.0 * x**1.2 * noise)
    expected = np.polyfit(np.log(x), np.log(3.0 * x**1.2 * noise), 1)[0]
    assert k == pytest.approx(expected)
    assert abs(k - 1.2) < 0.05


@pytest.mark.parametrize(
    "x, y", [([1.0], [1.0]), ([2.0, 2.0], [1.0, 3.0]), ([1.0, 2.0], [0.0, 1.0])]
)
def test_fit_refuses_what_it_cannot_fit(x, y):
    with pytest.raises(ValueError):
        scaling.fit_exponent(x, y)


def test_window_bytes_are_the_published_messages():
    world, batch = 4, 32
    sizes = np.random.default_rng(0).lognormal(5, 1, 1000)
    config = ScheduleConfig(num_replicas=world, batch_size=batch, kind="dynamic", window=8)
    coordinator = scaling._offline_coordinator(Scheduler(sizes, config))
    plan = coordinator.planner.plan_window(0, 8)
    measured = scaling.window_bytes(coordinator, plan, seq=3)
    assert len(measured) == world
    for rank in range(world):
        # What Coordinator._publish sends: the rank's topic frame and this payload.
        payload = coordinator._part(plan, rank, 3)
        assert measured[rank] == len(topic(rank)) + len(payload)
        decoded = decode(payload, max_bytes=1 << 20)["plan"]
        assert decoded.first == 8 and decoded.num_steps == 8
        steps = [plan.indices[plan.bounds[s, rank] : plan.bounds[s, rank + 1]] for s in range(8)]
        np.testing.assert_array_equal(decoded.indices, np.concatenate(steps))
        # Indices travel as 8-byte integers: the message is at least that long.
        assert len(payload) > 8 * decoded.indices.shape[0]


def test_bytes_per_step_divide_the_window_by_its_steps():
    sizes = np.random.default_rng(1).lognormal(5, 1, 2000)
    out = scaling._coordinator_bytes(sizes, 4, 32)
    steps = out["window_steps"]
    assert steps == scaling.WINDOW
    assert out["bytes_per_step_total"] == pytest.approx(out["window_bytes_total"] / steps)
    assert out["bytes_per_step_per_rank"] == pytest.approx(out["window_bytes_total"] / steps / 4)
    # Each index is 8 bytes of int64, plus the per-step offsets, weights, loads and headers.
    assert out["bytes_per_index"] > 8
