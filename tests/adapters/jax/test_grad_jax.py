"""chronica.jax.ScheduledReducer on a real 2-process jax.distributed job on loopback: exactness
against a plain pmean + update for SGD with momentum and Adam, partitions that reassemble to
the exact mean, identical dispatch order on both processes, bounded bytes in flight, a loadable
timeline, agreed auto-tuning; plus forward_order, the single-process path and bad arguments."""

import json
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from partitions import assert_tiled, spans_by_tensor  # noqa: E402
from workers import HELPERS, ROOT, base_env, free_port, run_workers  # noqa: E402

import chronica.jax as cj  # noqa: E402

FORWARD = [
    "['stem']['w']",
    "['stem']['b']",
    "['norm']['scale']",
    "['norm']['bias']",
    "['big']['w']",
    "['big']['b']",
    "['head']['w']",
    "['head']['b']",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grad_jax")
    port = free_port()
    outs = [tmp / f"rank{r}.json" for r in range(2)]
    env = base_env(ROOT, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    for knob in ("CHRONICA_PARTITION_BYTES", "CHRONICA_CREDIT_BYTES", "CHRONICA_AUTOTUNE"):
        env.pop(knob, None)
    worker = str(HELPERS / "grad_jax_worker.py")
    trace = str(tmp / "trace.json")
    commands = [
        [sys.executable, worker, str(port), str(rank), "2", str(out), trace]
        for rank, out in enumerate(outs)
    ]
    run_workers(
        commands,
        env,
        timeout=180,
    )
    results = [json.loads(out.read_text()) for out in outs]
    assert sorted((r["rank"], r["world"]) for r in results) == [(0, 2), (1, 2)]
    return [r["results"] for r in sorted(results, key=lambda r: r["rank"])], tmp


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_parameters_equal_plain_pmean_then_update_bitwise(job, kind):
    results, _ = job
    for rank_result in results:
        scheduled, plain = rank_result[kind]["scheduled"], rank_result[kind]["plain"]
        # Two processes: every element is (a + b) / 2 in both runs, so the match is bitwise.
        assert scheduled["mean"] == plain["mean"]  # partitions reassemble to the exact mean
        assert scheduled["params"] == plain["params"]
        assert scheduled["params"] != {k: [0.0] * n for k, n in scheduled["sizes"].items()}
    assert results[0][kind]["scheduled"]["params"] == results[1][kind]["scheduled"]["params"]


def test_dispatch_sequence_identical_across_processes_and_ordered(job):
    results, _ = job
    sequences = {}
    for kind in ("sgd", "adam"):
        a, b = (r[kind]["scheduled"]["dispatch"] for r in results)
        assert a == b and len(a) == 4
        assert all(step == a[0] for step in a)
        sequences[kind] = a[0]
    # priority (adam): first layer first; fifo (sgd): backward order, last layer first, by
    # tensor (the slices of a cut tensor become ready together and go in order)
    prio = sequences["adam"]
    assert prio[0].startswith("['stem']['w']") and prio[-1].endswith("['head']['b']")
    assert sequences["sgd"] == [prio[5], *prio[1:5], prio[0]]
    for kind in ("sgd", "adam"):
        chunks = results[0][kind]["scheduled"]["chunks"]
        leaves = [path for chunk in chunks for path in chunk]
        assert sorted(leaves) == sorted(FORWARD)  # every leaf handed out exactly once
        assert leaves == (FORWARD if kind == "adam" else [*FORWARD[5:], FORWARD[4], *FORWARD[:4]])


def test_priority_is_forward_order_and_partitions_cover_every_leaf(job):
    results, _ = job
    rep = results[0]["adam"]["scheduled"]
    assert rep["priority"] == FORWARD
    parts = rep["partitions"]
    assert list(dict.fromkeys(path for part in parts for path, _, _ in part)) == FORWARD
    covered = spans_by_tensor(parts)
    assert set(covered) == set(rep["sizes"])
    assert_tiled(covered, rep["sizes"])
    assert any(len(part) > 1 for part in parts)  # small leaves fused
    assert len(covered["['big']['w']"]) == 4  # 8 KiB cut into 2 KiB partitions


def test_bytes_in_flight_bounded_by_credit_plus_one_partition(job):
    results, _ = job
    for r in results:
        for kind in ("sgd", "adam"):
            rep = r[kind]["scheduled"]
            # Every leaf is ready at once, so the credit is reached but never overrun.
            assert rep["credit"] <= rep["max_in_flight"] <= rep["credit"] + rep["partition"]


def test_timeline_is_valid_chrome_trace(job):
    results, tmp = job
    names = results[0]["adam"]["scheduled"]["dispatch"][0]
    for rank in range(2):
        events = json.loads((tmp / f"trace.rank{rank}.json").read_text())
        spans = [e for e in events if e["ph"] == "X"]
        assert {e["tid"] for e in spans} == {"queue", "communication"}
        assert all(e["dur"] >= 0 and e["pid"] == rank for e in spans)
        assert all({"name", "ts", "args"} <= set(e) for e in spans)
        # reduce, iterate, abandoned iterate, 4 applies: a queue and a communication span
        # per partition and step
        assert len(spans) == 2 * 7 * len(names)
        assert {e["name"] for e in spans} == set(names)


def test_auto_tune_agrees_across_processes_and_stays_exact(job):
    results, _ = job
    a, b = (r["auto"] for r in results)
    assert a["exact"] and b["exact"]
    assert a["knobs"] == b["knobs"]
    assert len({tuple(k) for k in a["knobs"]}) == 2  # tried both candidates of the grid


def test_auto_mode_searches_decides_alike_says_why_and_stays_exact(job):
    results, _ = job
    a, b = (r["mode-auto"] for r in results)
    for run in ("measured", "redecided", "never"):
        # Every worker's windows are gathered: the same decisions, switching at the same step.
        assert a[run]["decisions"] == b[run]["decisions"]
        assert a[run]["engines"] == b[run]["engines"]
        assert a[run]["exact"] and b[run]["exact"], run  # equal to pmean + update, bitwise
    measured = list(dict.fromkeys(a["measured"]["decisions"]))
    assert measured[0] == "" and measured[1].startswith(
        "trial: the ranks measured that priority scheduling could save"
    )
    assert measured[-1].startswith(a["measured"]["mode"] + ": ") and a["measured"]["decided"] == 1
    assert "bucketed windows" in measured[-1]
    for worker in (a, b):  # the link's busy time is measured, so the bound can use it
        assert "(the link is busy " in worker["measured"]["verdict"]
    assert {"bucketed", "scheduled"} <= set(a["measured"]["engines"])  # it searched
    redecided = a["redecided"]
    assert redecided["decided"] == 2 and "trial: reopened by the test" in redecided["decisions"]
    never = list(dict.fromkeys(a["never"]["decisions"]))
    assert a["never"]["mode"] == "bucketed" and set(a["never"]["engines"]) == {"bucketed"}
    assert len(never) == 2 and "min_saving=100%" in never[-1]
    assert "priority scheduling would save at most" in a["never"]["verdict"]
    assert "mode='auto'" in a["never"]["repr"] and "min_saving=1.0" in a["never"]["repr"]


# -- in-process: forward_order, one process, bad arguments -------------------------------


def _params():
    return {
        "head": {"w": jnp.ones((4, 2))},
        "stem": {"w": jnp.ones((3, 4)), "b": jnp.ones(4)},
        "block": {"w": jnp.ones((4, 4))},
        "unused": jnp.ones(2),
    }


def _loss(params, x):
    block = jax.jit(lambda w, h: jnp.tanh(h @ w))
    h = x @ params["stem"]["w"] + params["stem"]["b"]
    h = jax.lax.cond(h.sum() > 0, lambda h: block(params["block"]["w"], h), lambda h: h, h)
    return (h @ params["head"]["w"]).sum()


def test_forward_order_follows_first_use_through_jit_and_cond():
    params = _params()
    order = cj.forward_order(_loss, params, jnp.ones((2, 3)))
    assert order == [
        "['stem']['w']",
        "['stem']['b']",
        "['block']['w']",
        "['head']['w']",
        "['unused']",  # never read: after the others, in tree order
    ]
    tree_order = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(params)]
    assert sorted(order) == sorted(tree_order) and order != tree_order


def test_single_process_returns_grads_unchanged_and_updates_once(tmp_path):
    assert jax.process_count() == 1
    params = _params()
    grads = jax.tree.map(lambda p: 0.5 * p, params)
    priority = cj.forward_order(_loss, params, jnp.ones((2, 3)))
    trace = tmp_path / "trace.json"
    reducer = cj.ScheduledReducer(priority=priority, timeline=str(trace))
    assert reducer.reduce(grads) is grads
    (chunk,) = list(reducer.iterate(grads))
    assert list(chunk.paths) == priority
    calls = []

    def sgd(g, p):
        calls.append(len(g))
        return [pi - 0.1 * gi for gi, pi in zip(g, p, strict=True)]

    new = reducer.apply(grads, params, sgd)
    assert calls == [5]
    leaves = zip(jax.tree.leaves(new), jax.tree.leaves(params), jax.tree.leaves(grads), strict=True)
    for got, p, g in leaves:
        np.testing.assert_array_equal(got, p - 0.1 * g)
    reducer.close()
    assert not trace.exists()  # nothing to trace without communication


def test_per_leaf_matches_whole_tree_transformation():
    class Momentum:
        """An optax-protocol transformation: velocity per leaf."""

        def init(self, params):
            return jax.tree.map(jnp.zeros_like, params)

        def update(self, updates, state, params=None):
            velocity = jax.tree.map(lambda v, g: 0.9 * v + g, state, updates)
            return jax.tree.map(lambda v: -0.1 * v, velocity), velocity

    tx = Momentum()
    opt = cj.per_leaf(tx)
    params = _params()
    state, whole_state, whole = opt.init(params), tx.init(params), params
    reducer = cj.ScheduledReducer()
    for step in range(3):
        grads = jax.tree.map(lambda p, s=step: (s + 1.0) * p, params)
        params, state = reducer.apply(grads, params, opt.update, state)
        updates, whole_state = tx.update(grads, whole_state, whole)
        whole = jax.tree.map(lambda p, u: p + u, whole, updates)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(whole), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"partition_bytes": 0}, ValueError, "partition_bytes"),
        ({"partition_bytes": -5}, ValueError, "partition_bytes"),
        ({"credit_bytes": "lots"}, ValueError, "credit_bytes"),
        ({"credit_bytes": 0}, ValueError, "credit_bytes"),
        ({"order": "lifo"}, ValueError, "order"),
        ({"priority": "['w']"}, TypeError, "priority"),
        ({"priority": [3]}, TypeError, "priority"),
        ({"priority": ["['w']", "['w']"]}, ValueError, "more than once"),
        ({"mode": "ddp"}, ValueError, "mode='ddp' must be one of"),
        ({"mode": 1}, TypeError, "mode=1"),
        ({"min_saving": 2}, ValueError, "min_saving"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        cj.ScheduledReducer(**kwargs)


def test_bad_call_arguments():
    params = _params()
    reducer = cj.ScheduledReducer(priority=["['nope']"])
    with pytest.raises(ValueError, match="priority"):
        reducer.reduce(params)
    reducer = cj.ScheduledReducer()
    with pytest.raises(ValueError, match="floating point"):
        reducer.reduce({"w": jnp.ones(2), "n": jnp.arange(3)})
    with pytest.raises(TypeError, match="pass arrays"):
        reducer.reduce({"w": jnp.ones(2), "s": "text"})
    with pytest.raises(ValueError, match="params"):
        reducer.apply(params, {"w": jnp.ones(2)}, lambda g, p: p)
    with pytest.raises(TypeError, match="update"):
        reducer.apply(params, params, "sgd")
    with pytest.raises(ValueError, match="one new value per leaf"):
        reducer.apply(params, params, lambda g, p: p[:1])
    with pytest.raises(ValueError, match="state"):
        reducer.apply(params, params, lambda g, p, s: (p, s), state={"x": 1})
    with pytest.raises(TypeError, match="tx="):
        cj.per_leaf(object())
    with pytest.raises(TypeError, match="fn="):
        cj.forward_order("loss", params)
