"""Extreme sizes and costs against every planning kernel: 1e308, subnormals, integers too
large for any float, booleans, with every cost model and every planning kind. Each input is
either refused with a ``ValueError``/``TypeError`` naming the argument, or planned correctly
(every sample once, dynamic windows holding the static plan's samples); never a crash.

The kernels are compiled code: a bad input could kill the process (SIGSEGV) instead of
raising. So the plans are made in a child process that serves one case after another; a
child that dies fails the test with the case that killed it, instead of taking pytest down.
"""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from chronica.comm.protocol import REPORT_LOAD, REPORT_SECONDS
from chronica.core import CostModel, ScheduleConfig, Scheduler, validate_sizes
from chronica.core.cost import MAX_COST
from chronica.core.sizes import MAX_SIZE
from tests.helpers.workers import scaled

# The child: reads pickled cases from stdin, answers ("ok", None), ("refused", message) or
# ("wrong", what) for each; only a crash ends it early.
_CHILD = r"""
import pickle, struct, sys
import numpy as np
from chronica.core import ScheduleConfig, Scheduler
from chronica.core.dynamic import DynamicPlanner
from chronica.core.packing import Packing


def check(case):
    sizes, cost, kind, exact, packed, reports = case
    options = dict(num_replicas=4, batch_size=8, cost=cost, kind=kind, exact=exact)
    if packed:
        options["packing"] = Packing(max_tokens=64, long_documents="truncate")
    scheduler = Scheduler(sizes, ScheduleConfig(**options))
    plan = scheduler.plan_epoch(0)
    n = scheduler.num_samples
    if not packed and sorted(set(plan.indices.tolist())) != list(range(n)):
        return "the static plan does not hold every sample"
    if packed and sorted(set(plan.micro.pieces.tolist())) != list(range(n)):
        return "the packed plan does not hold every document"
    if kind != "dynamic":
        return None
    planner = DynamicPlanner(scheduler)
    for step, (load, seconds) in enumerate(reports):
        work = np.array([1.0, load, load]) if packed else None
        planner.observe(step % 4, step, load, seconds, work)
    got = []
    for first in range(0, planner.num_windows(0) * planner.window, planner.window):
        window = planner.plan_window(0, first)
        got += (window.micro.pieces if packed else window.indices).tolist()
        if not np.isfinite(window.loads).all():
            return f"window {first} has non-finite loads"
    want = (plan.micro.pieces if packed else plan.indices).tolist()
    if sorted(got) != sorted(want):
        return "the windows do not hold the static plan's samples, each once"
    return None


read, write = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = read.read(4)
    if len(head) < 4:
        break
    case = pickle.loads(read.read(struct.unpack("<I", head)[0]))
    try:
        wrong = check(case)
        answer = ("ok", None) if wrong is None else ("wrong", wrong)
    except (ValueError, TypeError) as exc:
        answer = ("refused", f"{type(exc).__name__}: {exc}")
    data = pickle.dumps(answer)
    write.write(struct.pack("<I", len(data)) + data)
    write.flush()
"""


class Planner:
    """One child process planning case after case; ``ask`` returns its answer, or fails
    the test naming the case when the child died on it (the next case gets a new child)."""

    def __init__(self) -> None:
        self.proc = self._start()

    @staticmethod
    def _start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def ask(self, case: tuple[Any, ...]) -> tuple[str, Any]:
        if self.proc.poll() is not None:
            self.proc = self._start()
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        data = pickle.dumps(case)
        try:
            stdin.write(struct.pack("<I", len(data)) + data)
            stdin.flush()
            head = stdout.read(4)
        except BrokenPipeError:
            head = b""
        if len(head) < 4:
            code = self.proc.wait(timeout=scaled(60))
            pytest.fail(f"the planner died (exit status {code}) on {case!r}")
        answer: tuple[str, Any] = pickle.loads(stdout.read(struct.unpack("<I", head)[0]))
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=scaled(60))


@pytest.fixture(scope="module")
def planner():
    child = Planner()
    yield child
    child.close()


EXTREMES = [0.0, 5e-324, 2.2e-308, 1e-300, 1.0, 7.0, MAX_SIZE, MAX_SIZE * 2, 1e200, 1e308]
COSTS = [
    None,
    "quadratic",
    (1.0, 2.0, 3.0),
    (1e300, 0.0, 0.0),
    (0.0, 1e300, 0.0),
    (0.0, 0.0, 1e-300),
    (5e-324, 5e-324, 5e-324),
    CostModel.attention(4096),
    CostModel.transformer(768, 12, 12, vocab=50257),
]
KINDS = [
    ("static", True, False),
    ("static", False, False),
    ("guided", True, False),
    ("dynamic", True, False),
    ("static", True, True),
    ("dynamic", True, True),
]
# Reports as the coordinator accepts them: 0 or within the protocol's ranges.
REPORTS = st.lists(
    st.tuples(
        st.one_of(st.just(0.0), st.sampled_from(REPORT_LOAD), st.floats(*REPORT_LOAD)),
        st.one_of(st.just(0.0), st.sampled_from(REPORT_SECONDS), st.floats(*REPORT_SECONDS)),
    ),
    max_size=24,
)
SIZES = st.lists(
    st.one_of(
        st.sampled_from(EXTREMES),
        st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
        st.integers(min_value=0, max_value=2**80),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    sizes=SIZES,
    cost=st.sampled_from(COSTS),
    kind=st.sampled_from(KINDS),
    reports=REPORTS,
    whole=st.booleans(),
)
def test_extreme_sizes_are_refused_or_planned_never_a_crash(
    planner, sizes, cost, kind, reports, whole
):
    values = np.floor(np.array(sizes, dtype=object).astype(float)) if whole else sizes
    status, detail = planner.ask((values, cost, *kind, reports))
    event(status)
    assert status != "wrong", detail
    if status == "refused":
        assert "sizes" in detail or "cost" in detail, detail


@pytest.mark.parametrize(
    "sizes,cost,match",
    [
        ([1e308] * 64, None, r"sizes\[0\] is 1e\+308; sizes must be at most 2\*\*53"),
        ([1e200] * 100, "quadratic", r"sizes\[0\] is 1e\+200; sizes must be at most"),
        ([2**70, 1], None, r"sizes\[0\] is 1\.18.*e\+21; sizes must be at most"),
        ([2**2000], None, r"sizes\[0\] is an integer of 2001 bits"),
        ([1e15] * 8, (0.0, 0.0, 1e9), r"cost=CostModel.*sizes\[0\]=1000000000000000.0 .* 1e\+39"),
    ],
)
def test_overflowing_inputs_are_a_value_error_naming_the_argument(sizes, cost, match):
    with pytest.raises(ValueError, match=match):
        Scheduler(sizes, ScheduleConfig(4, 8, cost=cost)).plan_epoch(0)


@pytest.mark.parametrize(
    "sizes",
    [np.array([True, False]), np.array([1 + 2j]), np.array(["1"]), np.array([None, 1])],
)
def test_sizes_that_are_not_numbers_are_a_type_error(sizes):
    with pytest.raises(TypeError, match=r"^sizes must hold integers or floats"):
        validate_sizes(sizes)


def test_the_largest_inputs_accepted_plan_with_finite_loads():
    sizes = np.full(16, MAX_SIZE)
    coefficient = MAX_COST / MAX_SIZE**2
    plan = Scheduler(sizes, ScheduleConfig(4, 8, cost=(0.0, 0.0, coefficient))).plan_epoch(0)
    assert np.isfinite(plan.loads).all() and plan.loads.max() == 2 * MAX_COST
    assert sorted(plan.indices.tolist()) == list(range(16))
