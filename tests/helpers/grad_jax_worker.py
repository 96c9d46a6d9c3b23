"""One process of the 2-process jax.distributed job of tests/test_grad_jax.py.

argv: coordinator port, process id, number of processes, output JSON path, timeline path.
Trains a small MLP whose tree order (sorted dict keys) differs from its forward order, once
with ``ScheduledReducer`` (small partitions and credit) and once with a plain ``pmean`` of
the whole gradient tree followed by the same update, for SGD with momentum (``order="fifo"``,
a per-leaf update rule with state) and Adam (``order="priority"``, an optax-protocol
transformation through ``per_leaf``), and reports both; then runs a few auto-tuned steps,
and ``mode="auto"`` against the plain mean (a search of settings decided by measurements,
the same with a second decision after ``trial.reopen``, and ``min_saving=1``, which never
tries scheduling).
"""

import functools
import json
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from chronica.runtime import auto

STEPS = 4
# mode="auto" with min_saving=0: a bucketed window, two settings searched (each beside bucketed
# windows) and a window of the better one after the search (windows of MEASURE_STEPS + 1 steps,
# set below): decided by step 18, whatever it measured. A run goes on AFTER steps past each
# decision (the decided engine applies them); "redecided" then reopens the trial and decides
# again, the others stop. AUTO_STEPS only bounds a run that never decides (its checks fail).
AUTO_STEPS, AFTER, MEASURE_STEPS = 60, 3, 2


def put(x: np.ndarray) -> jax.Array:
    # Committed from the start, like every later value: no recompilation after step 0.
    return jax.device_put(x, jax.local_devices()[0])


def init_params() -> dict:
    # numpy, not jax.random: every XLA compilation costs the test time on a busy machine.
    rng = np.random.default_rng(0)

    def normal(scale: float, *shape: int) -> jax.Array:
        return put((scale * rng.standard_normal(shape)).astype(np.float32))

    def zeros(*shape: int) -> jax.Array:
        return put(np.zeros(shape, np.float32))

    return {
        "head": {"w": normal(0.1, 64, 3), "b": zeros(3)},
        "big": {"w": normal(0.1, 32, 64), "b": zeros(64)},
        "stem": {"w": normal(0.3, 8, 32), "b": zeros(32)},
        "norm": {"scale": put(np.ones(32, np.float32)), "bias": zeros(32)},
    }


def zeros_like(tree: Any) -> Any:
    return jax.tree.map(lambda x: put(np.zeros(x.shape, x.dtype)), tree)


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["stem"]["w"] + params["stem"]["b"])
    h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    h = h * params["norm"]["scale"] + params["norm"]["bias"]
    h = jax.nn.relu(h @ params["big"]["w"] + params["big"]["b"])
    logits = h @ params["head"]["w"] + params["head"]["b"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


def batch(rank: int, step: int) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    return put(x), put(rng.integers(0, 3, 16).astype(np.int32))


GRAD = jax.jit(jax.grad(loss))


@jax.jit
def _momentum_leaf(g: jax.Array, p: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    v = 0.9 * v + g
    return p - 0.05 * v, v


def sgd_momentum(grads: list, params: list, states: list) -> tuple[list, list]:
    """SGD with momentum 0.9, learning rate 0.05, leaf by leaf; the state is the velocity."""
    out = [_momentum_leaf(g, p, v) for g, p, v in zip(grads, params, states, strict=True)]
    return [p for p, _ in out], [v for _, v in out]


class AdamState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any


class Adam(NamedTuple):
    """An optax-protocol Adam (init / update(updates, state, params)) over any pytree."""

    init: Any
    update: Any


@jax.jit
def _adam_leaf(g: jax.Array, m: jax.Array, v: jax.Array, count: jax.Array) -> tuple:
    b1, b2, lr, eps = 0.9, 0.999, 1e-2, 1e-8
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    c1, c2 = 1 - b1 ** count.astype(jnp.float32), 1 - b2 ** count.astype(jnp.float32)
    return -lr * (m / c1) / (jnp.sqrt(v / c2) + eps), m, v


def adam() -> Adam:
    """Adam (lr 1e-2) over any pytree, one compiled kernel per leaf shape."""

    def init(params: Any) -> AdamState:
        zeros = zeros_like(params)
        return AdamState(put(np.zeros((), np.int32)), zeros, zeros)

    def update(grads: Any, state: AdamState, params: Any = None) -> tuple[Any, AdamState]:
        count = state.count + 1
        leaves, treedef = jax.tree.flatten(grads)
        mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
        outs = [_adam_leaf(*gmv, count) for gmv in zip(leaves, mus, nus, strict=True)]
        updates, mu, nu = (treedef.unflatten([o[k] for o in outs]) for k in range(3))
        return updates, AdamState(count, mu, nu)

    return Adam(init, update)


@functools.cache
def _pmean() -> tuple[Any, NamedSharding]:
    devices = [
        min((d for d in jax.devices() if d.process_index == i), key=lambda d: d.id)
        for i in range(jax.process_count())
    ]
    mesh = Mesh(np.array(devices), ("p",))
    spec = PartitionSpec("p")
    pmean = jax.shard_map(
        lambda t: jax.lax.pmean(t, "p"), mesh=mesh, in_specs=spec, out_specs=PartitionSpec()
    )
    return jax.jit(pmean), NamedSharding(mesh, spec)


def plain_mean(grads: Any) -> Any:
    """The unscheduled reduction: one pmean of the whole tree across processes."""
    pmean, sharding = _pmean()
    world = jax.process_count()

    def to_global(g: jax.Array) -> jax.Array:
        g = g if g.ndim else g.reshape(1)
        return jax.make_array_from_single_device_arrays(
            (world * g.shape[0], *g.shape[1:]), sharding, [g]
        )

    out = pmean(jax.tree.map(to_global, grads))
    return jax.tree.map(lambda o, g: o.addressable_data(0).reshape(g.shape), out, grads)


def flat(tree: Any) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(v).ravel().tolist() for p, v in leaves}


def train(kind: str, scheduled: bool, rank: int, timeline: str | None) -> dict:
    import chronica.jax as cj

    params = init_params()
    grad_fn = GRAD
    report: dict = {"dispatch": []}
    x0, y0 = batch(rank, 0)
    order = "fifo" if kind == "sgd" else "priority"
    if kind == "sgd":
        update, state = sgd_momentum, zeros_like(params)
    else:
        tx = adam()
        opt = cj.per_leaf(tx)
        update, state = opt.update, (opt.init(params) if scheduled else tx.init(params))
    if scheduled:
        reducer = cj.ScheduledReducer(
            priority=cj.forward_order(loss, params, x0, y0),
            partition_bytes=2048,
            credit_bytes=3000,
            order=order,
            timeline=timeline,
        )
    for step in range(STEPS):
        x, y = batch(rank, step)
        grads = grad_fn(params, x, y)
        if not scheduled:
            mean = plain_mean(grads)
            if kind == "sgd":
                leaves, treedef = jax.tree.flatten(mean)
                new = update(leaves, treedef.flatten_up_to(params), treedef.flatten_up_to(state))
                params, state = treedef.unflatten(new[0]), treedef.unflatten(new[1])
            else:
                updates, state = tx.update(mean, state, params)
                params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates)
            if step == 0:
                report["mean"] = flat(mean)
            continue
        if step == 0:
            report["mean"] = flat(reducer.reduce(grads))
            report["chunks"] = [list(c.paths) for c in reducer.iterate(grads)]
            for _ in reducer.iterate(grads):
                break  # abandoned: must still finish its collectives, or the next ones mismatch
        params, state = reducer.apply(grads, params, update, state)
        report["dispatch"].append(reducer.last_dispatch)
    if scheduled:
        reducer.close()
        report.update(
            priority=reducer.priority,
            max_in_flight=reducer.max_in_flight_bytes,
            credit=reducer.credit_bytes,
            partition=reducer.partition_bytes,
            partitions=reducer.partition_shapes(),
        )
    report["params"] = flat(params)
    report["sizes"] = {k: len(v) for k, v in flat(params).items()}
    return report


def auto_tuned(rank: int) -> dict:
    """Nine auto-tuned steps: two candidates of four steps each, then their second trials."""
    import chronica.jax as cj

    params = init_params()
    grads = GRAD(params, *batch(rank, 0))
    reducer = cj.ScheduledReducer(auto_tune=True)
    knobs, same = [], True
    expected = flat(plain_mean(grads))
    for _ in range(9):
        same &= flat(reducer.reduce(grads)) == expected
        knobs.append([reducer.partition_bytes, reducer.credit_bytes])
    return {"knobs": knobs, "exact": bool(same)}


def auto_mode(rank: int, min_saving: float, reopen: bool) -> dict:
    """``mode="auto"`` SGD with momentum beside the plain mean and the same update."""
    import chronica.jax as cj

    params = plain = init_params()
    state, plain_state = zeros_like(params), zeros_like(params)
    reducer = cj.ScheduledReducer(
        mode="auto", min_saving=min_saving, partition_bytes=2048, credit_bytes=3000
    )
    decisions, engines, decided_at = [], [], []
    for step in range(AUTO_STEPS):
        x, y = batch(rank, step)
        params, state = reducer.apply(GRAD(params, x, y), params, sgd_momentum, state)
        leaves, treedef = jax.tree.flatten(plain_mean(GRAD(plain, x, y)))
        new = sgd_momentum(leaves, treedef.flatten_up_to(plain), treedef.flatten_up_to(plain_state))
        plain, plain_state = treedef.unflatten(new[0]), treedef.unflatten(new[1])
        stats = reducer.stats()
        decisions.append(stats.decision)
        engines.append(stats.mode)
        trial = reducer.trial  # agreed by every worker: all reopen and stop at the same step
        if trial.decisions > len(decided_at):
            decided_at.append(step)
        if decided_at and step == decided_at[-1] + AFTER:
            if not reopen or trial.decisions > 1:
                break
            trial.reopen("reopened by the test")
    stats = reducer.stats()
    return {
        "decisions": decisions,
        "decided": reducer.trial.decisions if reducer.trial is not None else 0,
        "engines": engines,
        "mode": stats.mode,
        "verdict": stats.verdict,
        "repr": repr(reducer),
        "exact": flat(params) == flat(plain),
        "dispatch": reducer.last_dispatch,
    }


def main(port: str, process_id: str, num_processes: str, out_path: str, timeline: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(num_processes),
        process_id=int(process_id),
        initialization_timeout=60,
    )
    rank = jax.process_index()
    results = {}
    for kind in ("sgd", "adam"):
        results[kind] = {
            "scheduled": train(kind, True, rank, timeline if kind == "adam" else None),
            "plain": train(kind, False, rank, None),
        }
    results["auto"] = auto_tuned(rank)
    results["mode-auto"] = {
        "measured": auto_mode(rank, 0.0, False),
        "redecided": auto_mode(rank, 0.0, True),
        "never": auto_mode(rank, 1.0, False),
    }
    multihost_utils.sync_global_devices("chronica grad test done")
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "world": jax.process_count(), "results": results}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    # The trial at its shortest: windows of MEASURE_STEPS measured steps, one window of the
    # survivor after the search, no extra ones where the noise cannot tell (bounds the unit
    # tests of chronica.runtime.auto cover), so that the steps below always decide. Set here,
    # not at import: a test that imports this module must not change its process.
    auto.MEASURE_STEPS = MEASURE_STEPS
    auto.MIN_WINDOWS_KEPT = auto.MAX_WINDOWS_KEPT = 1
    main(*sys.argv[1:6])
