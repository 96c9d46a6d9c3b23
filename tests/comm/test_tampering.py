"""A wrong coordinator against real ranks: a fake one (real ZeroMQ ROUTER and PUB sockets in
this process, speaking chronica's protocol) attacks a real two-rank torch job (gloo on
127.0.0.1, tests/helpers/fault_worker.py "tampered") window after window (``SCHEDULE``);
the job runs once, and each attack's test reads its window.

A rank receives only its own part of a window; the ranks check the parts together by a
keyed multiset hash summed over their gloo group (chronica.runtime.window). Every attack
that would break exactly-once or hang a loop must end the same way: a warning, and the
static plan for that window on both ranks together, within the time-out; exactly-once
holds over every epoch, and the honest windows between the attacks are used. A window
whose parts still partition every step with runnable counts (two ranks' parts swapped) is
used: exactly-once holds with it. Each attack test is registered with ``@attack``
(tests/helpers/attacks.py) for SECURITY.md's count: "degraded" where the window it hits
loses its dynamic balancing (and, where the coordinator goes silent, the rank waits out its
time-out, 1 s here), "held" where it changes nothing that matters.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest
import zmq
from attacks import attack
from dynamic_job import WINDOW, check_exactly_once
from dynamic_job import static_plan as plan_of
from workers import HELPERS, ROOT, base_env, free_port, free_ports, start_workers, wait_workers

from chronica.comm.client import HELD_PLANS
from chronica.comm.protocol import MAX_REQUEST_BYTES, decode, encode, plan_message, topic

WORLD, GEN = 2, 7
static_plan = functools.cache(plan_of)  # the fake coordinator asks for it at every fetch
WORKER = HELPERS / "fault_worker.py"
Window = list[list[np.ndarray]]  # per step of a window, every rank's part


# The attack of every window (3 epochs of 5 windows); None: an honest window.
SCHEDULE: list[str | None] = [
    None,
    "duplicate samples",
    "empty rank",
    "swapped ranks",
    "unequal counts",
    "sample moved between steps",
    "mixed generations",
    "missing sample",
    "error answer",
    None,
    "error answer, no window",
    None,
    "stale window and garbage",
    None,
    "flood",
]
TIMED_OUT = {"error answer, no window", "stale window and garbage", "flood"}


def _windows(epoch: int) -> list[int]:
    return list(range(0, static_plan(WORLD, epoch).num_steps, WINDOW))


def _honest(epoch: int, first: int) -> Window:
    """A valid window other than the static plan's: the ranks' static parts swapped."""
    static = static_plan(WORLD, epoch)
    stop = min(first + WINDOW, static.num_steps)
    return [[static.local(s, 1), static.local(s, 0)] for s in range(first, stop)]


def _plan(epoch: int, first: int, whole: Window, rank: int, *, gen=GEN) -> list[list[bytes]]:
    """Rank ``rank``'s plan message of ``whole`` (its part), with the loss weights its
    counts imply, as a coordinator answers a fetch."""
    static = static_plan(WORLD, epoch)
    own = [step[rank] for step in whole]
    sizes = [static.bounds[s, -1] - static.bounds[s, 0] for s in range(first, first + len(own))]
    counts = np.array([len(o) for o in own])
    plan = plan_message(
        seq=0,
        gen=gen,
        epoch=epoch,
        first=first,
        indices=np.concatenate(own),
        offsets=np.concatenate([[0], np.cumsum(counts)]),
        weights=counts * WORLD / np.array(sizes),
        loads=np.ones(len(own)),
    )
    return [[plan]]


def _garbage(rng: np.random.Generator) -> bytes:
    return rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8).tobytes()


class FakeCoordinator:
    """A coordinator that welcomes every rank and answers its fetches (not its prefetches)
    with the messages ``answer(rank, epoch, first)`` gives, each a list of frames; where it
    gives ``None``, floods both sockets instead until the rank says hello again. Records
    the windows fetched, by rank."""

    def __init__(self, answer: Callable[[int, int, int], list[list[bytes]] | None]) -> None:
        self.answer = answer
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.pub = self.context.socket(zmq.PUB)
        port = free_ports(2)[0]
        self.router.bind(f"tcp://127.0.0.1:{port}")
        self.pub.bind(f"tcp://127.0.0.1:{port + 1}")
        self.port = port
        self.fetched: set[tuple[int, int, int]] = set()
        self.flooding: dict[int, bytes] = {}  # rank -> its ROUTER identity, while flooded
        self.sent_flood = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.router.close(0)
        self.pub.close(0)
        self.context.term()

    def _serve(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            if self.router.poll(0 if self.flooding else 20):
                identity, payload = self.router.recv_multipart()
                message = decode(payload, MAX_REQUEST_BYTES)
                rank = message.get("rank", -1)
                if message["t"] == "hello":
                    self.flooding.pop(rank, None)
                    welcome = encode("welcome", window=WINDOW, steps=0)
                    self.router.send_multipart([identity, welcome])
                elif message["t"] == "fetch" and not message.get("ahead"):
                    key = (rank, message["epoch"], message["first"])
                    self.fetched.add(key)
                    answer = self.answer(*key)
                    if answer is None:
                        self.flooding[rank] = identity
                    for frames in answer or []:
                        self.router.send_multipart([identity, *frames])
            for rank, identity in self.flooding.items():
                self._flood(rank, identity, rng)

    def _flood(self, rank: int, identity: bytes, rng: np.random.Generator) -> None:
        """A burst of garbage, three-frame messages, and plans of future windows (far
        epochs, and window starts of the next) on the rank's topic and its connection."""
        for i in range(64):
            epoch, first = 1 + i % 9, 4 * int(rng.integers(0, 1 << 20))
            plan = plan_message(0, GEN, epoch, first, np.arange(4), np.array([0, 4]), *_ones())
            for frames in ([_garbage(rng)], [plan], [b"a", b"b"]):
                self._send(rank, identity, topic(rank), frames)

    def _send(self, rank: int, identity: bytes, head: bytes, frames: list[bytes]) -> None:
        for sock, first in ((self.pub, head), (self.router, identity)):
            try:
                sock.send_multipart([first, *frames], zmq.NOBLOCK)
                self.sent_flood += 1
            except zmq.Again:
                pass


def _ones() -> tuple[np.ndarray, np.ndarray]:
    return np.ones(1), np.ones(1)


def _sent(kind: str | None, epoch: int, first: int) -> Window | None:
    """Every rank's part, step by step, of the window a plan attack ``kind`` (or an honest
    window, ``None``) sends; ``None`` for the attacks that send no usable plan."""
    static = static_plan(WORLD, epoch)
    stop = first + len(_honest(epoch, first))
    a = [static.local(s, 0) for s in range(first, stop)]
    b = [static.local(s, 1) for s in range(first, stop)]
    if kind in (None, "mixed generations"):
        return _honest(epoch, first)
    if kind == "duplicate samples":
        return [[x, x] for x in a]
    if kind == "empty rank":
        return [[np.concatenate([x, y]), y[:0]] for x, y in zip(a, b, strict=True)]
    if kind == "swapped ranks":
        # The ranks' parts swapped at the window's first step only: still a partition.
        return [[b[0], a[0]], *([x, y] for x, y in zip(a[1:], b[1:], strict=True))]
    if kind == "unequal counts":
        return [[np.concatenate([x, y[:1]]), y] for x, y in zip(a, b, strict=True)]
    if kind == "sample moved between steps":
        # Rank 0's first samples of the first two steps traded: every step keeps its count
        # and the window its samples, but two steps train a sample of the other.
        moved = [x.copy() for x in a]
        moved[0][0], moved[1][0] = a[1][0], a[0][0]
        return [[x, y] for x, y in zip(moved, b, strict=True)]
    if kind == "missing sample":
        return [[x, y[:-1]] for x, y in zip(a, b, strict=True)]
    return None


def _answer(rank: int, epoch: int, first: int) -> list[list[bytes]] | None:
    """What the fake coordinator sends rank ``rank`` for window ``(epoch, first)``."""
    kind = SCHEDULE[epoch * len(_windows(0)) + first // WINDOW]
    rng = np.random.default_rng(rank)
    whole = _sent(kind, epoch, first)
    if whole is not None:
        return _plan(epoch, first, whole, rank, gen=GEN + rank * (kind == "mixed generations"))
    if kind == "error answer":
        return [[encode("error", code="protocol", msg="refused", epoch=epoch, first=first)]]
    if kind == "error answer, no window":
        return [[encode("error", code="protocol", msg="refused")]]
    if kind == "stale window and garbage":
        # The window before: a plan the rank no longer needs.
        stale = _plan(epoch, first - WINDOW, _honest(epoch, first - WINDOW), rank)
        return [*stale, [_garbage(rng)], [b"x", b"y", b"z"]]
    assert kind == "flood"
    return None


@pytest.fixture(scope="module")
def attacked_job(tmp_path_factory):
    """The two-rank job of fault_worker.py "tampered" against the fake coordinator: every
    rank's result, the log of both, and the windows each rank fetched."""
    folder = tmp_path_factory.mktemp("tampered")
    for epoch in range(3):  # planned before the ranks ask, so every answer comes at once
        static_plan(WORLD, epoch)
    fake = FakeCoordinator(_answer)
    try:
        env = base_env(
            ROOT,
            WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            CHRONICA_COORDINATOR=f"127.0.0.1:{fake.port}",
        )
        outputs = [folder / f"rank{rank}.json" for rank in range(WORLD)]
        procs = start_workers(
            [[sys.executable, str(WORKER), str(out), "tampered"] for out in outputs],
            [{**env, "RANK": str(rank)} for rank in range(WORLD)],
        )
        logs = wait_workers(procs, timeout=150)
    finally:
        fake.close()
    results = [json.loads(out.read_text()) for out in outputs]
    return results, logs, fake


def _window_names() -> list[tuple[int, int]]:
    return [(epoch, first) for epoch in range(3) for first in _windows(epoch)]


@pytest.mark.timeout(200)
def test_exactly_once_holds_and_honest_windows_are_used(attacked_job):
    results, _, fake = attacked_job
    check_exactly_once(results, WORLD, epochs=3)
    windows = _window_names()
    assert len(windows) == len(SCHEDULE)
    # Every attack met the rank: each rank fetched every window.
    assert fake.fetched == {(r, e, f) for r in range(WORLD) for e, f in windows}
    agreed = [[a for _, a in r["votes"]] for r in results]
    assert agreed[0] == agreed[1]  # one source per window on both ranks
    for n, ((epoch, first), kind) in enumerate(zip(windows, SCHEDULE, strict=True)):
        if kind is None and (n == 0 or SCHEDULE[n - 1] not in TIMED_OUT):
            assert agreed[0][n], n  # used, unless the rank was still saying hello again
        for r in results:
            if agreed[0][n]:
                sent = _sent(kind, epoch, first)
                assert sent is not None
                steps = r["epochs"][epoch][first : first + len(sent)]
                assert steps == [p[r["rank"]].tolist() for p in sent]


def _fell_back_together(attacked_job, kind: str) -> list[str]:
    """Check that the window ``kind`` attacked took the static plan on both ranks, each
    saying so (a time-out, or this window named), and return both ranks' logs."""
    results, logs, _ = attacked_job
    n = SCHEDULE.index(kind)
    epoch, first = _window_names()[n]
    static = static_plan(WORLD, epoch)
    stop = first + len(_honest(epoch, first))
    for r, log in zip(results, logs, strict=True):
        rank = r["rank"]
        assert r["votes"][n][1] is False
        steps = r["epochs"][epoch][first:stop]
        assert steps == [static.local(s, rank).tolist() for s in range(first, stop)]
        silent = f"rank {rank}: the coordinator sent no plan for epoch {epoch} step {first}"
        if kind in TIMED_OUT:
            assert silent in log
        else:
            assert silent not in log  # no wait for the time-out
        if kind not in TIMED_OUT and kind != "error answer":
            # This rank refused the window, or heard that the other did.
            window = f"epoch {epoch} steps {first}..{stop - 1}"
            lines = log.splitlines()
            assert any(f"rank {rank}: " in line and window in line for line in lines)
    return logs


def _do_not_fit(logs: list[str]) -> bool:
    return all("do not fit together" in log for log in logs)


@attack("degraded", "a coordinator gives two ranks of a step the same samples: static plan")
def test_duplicate_samples_across_ranks(attacked_job):
    assert _do_not_fit(_fell_back_together(attacked_job, "duplicate samples"))


@attack("degraded", "a coordinator leaves a rank of a step empty: static plan")
def test_an_empty_rank(attacked_job):
    logs = _fell_back_together(attacked_job, "empty rank")
    assert "gives rank 1 0 samples, outside [1, 16]" in logs[1]
    assert _do_not_fit(logs[:1])


@attack("held", "a coordinator swaps two ranks' parts of a step (still a partition): used")
def test_two_ranks_swapped(attacked_job):
    """Swapped parts are still a partition of every step with runnable counts: the window
    is used (``test_exactly_once_holds_and_honest_windows_are_used`` checks that each rank
    trained the part it was sent, and exactly-once over the epochs)."""
    results, _, _ = attacked_job
    n = SCHEDULE.index("swapped ranks")
    assert [r["votes"][n][1] for r in results] == [True, True]


@attack("degraded", "a coordinator gives a step one sample too many (a repeat): static plan")
def test_unequal_counts(attacked_job):
    assert _do_not_fit(_fell_back_together(attacked_job, "unequal counts"))


@attack("degraded", "a coordinator moves a sample to another step of the window: static plan")
def test_a_sample_moved_between_steps(attacked_job):
    assert _do_not_fit(_fell_back_together(attacked_job, "sample moved between steps"))


@attack("degraded", "a coordinator sends one window under two generations: static plan")
def test_mixed_generations(attacked_job):
    results, _, _ = attacked_job
    n = SCHEDULE.index("mixed generations")
    assert [r["gens"][n] for r in results] == [GEN, GEN + 1]
    assert _do_not_fit(_fell_back_together(attacked_job, "mixed generations"))


@attack("degraded", "a coordinator leaves a sample of a step out of every part: static plan")
def test_a_missing_sample(attacked_job):
    assert _do_not_fit(_fell_back_together(attacked_job, "missing sample"))


@attack("degraded", "a coordinator answers a fetch with an error naming it: static plan, no wait")
def test_an_error_answer_falls_back_at_once(attacked_job):
    logs = _fell_back_together(attacked_job, "error answer")
    assert all("refused a request (protocol): refused" in log for log in logs)
    results, _, _ = attacked_job
    assert all(r["client"]["refused_fetches"] == 1 for r in results)


@attack("degraded", "a coordinator answers a fetch with an error naming no window: time-out")
def test_an_error_answer_naming_no_window_falls_back_after_the_time_out(attacked_job):
    _fell_back_together(attacked_job, "error answer, no window")


@attack("degraded", "a coordinator answers another window, garbage, 3 frames: time-out")
def test_a_stale_window_and_garbage(attacked_job):
    _fell_back_together(attacked_job, "stale window and garbage")
    results, _, _ = attacked_job
    assert all(r["client"]["rejected"] >= 2 for r in results)


@attack("degraded", "a coordinator floods PUB and ROUTER with garbage and future plans: time-out")
def test_a_flood_falls_back_after_the_time_out_holding_few_plans(attacked_job):
    _fell_back_together(attacked_job, "flood")
    results, _, fake = attacked_job
    assert fake.sent_flood > 1000
    for r in results:
        client = r["client"]
        assert client["held_most"] <= HELD_PLANS and client["dropped"] > 0
        assert client["rejected"] > 100
