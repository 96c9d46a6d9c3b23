"""The kind="dynamic" scenarios of the 2-process ``jax.distributed`` job of
tests/adapters/jax/test_jax.py (the job of dynamic_job.py; the JAX twin of dynamic_worker.py),
run by jax_worker.py in each process once ``jax.distributed`` is initialised.

Scenarios: "train" (two epochs, variable batches, the last process emulated 3x slower,
loss-weighted gradients checked against the whole step's gradient; then one epoch as global
arrays over a sharding spanning both processes), "kill" (the test kills a standalone
coordinator, named by CHRONICA_COORDINATOR, after step 3 of epoch 0). The processes exchange
each step's indices and weighted gradient through the coordination service's key-value
store, as a gradient all-reduce would, so every step ends in lockstep.
"""

import json
from pathlib import Path

import jax
import numpy as np
from dynamic_job import KILL_AT, PER_RANK, WINDOW, N, features, kill_point, sizes
from workers import scaled

SLOW = 3.0


def whole_step_gradient(w, indices):
    """Gradient of the mean squared error over ``indices`` (numpy, closed form)."""
    x, y = features(indices)
    return 2.0 * x.T @ (x @ w - y) / len(indices)


def dynamic(scenario: str, out: Path, port: int, sync: Path) -> None:
    """Run ``scenario`` with chronica's coordinator on ``port`` (and the next three), the
    kill handshake's files in ``sync``; writes this process's result to ``out``."""
    import jax.numpy as jnp
    from jax._src.distributed import global_state

    import chronica.jax as cj
    from chronica.runtime import DynamicOptions

    kv = global_state.client
    world, rank = jax.process_count(), jax.process_index()
    lengths = sizes()
    it = cj.iterator(
        np.arange(N, dtype=np.float64)[:, None],  # sample i is the sequence [i]
        lengths,
        global_batch_size=PER_RANK * world,
        kind="dynamic",
        variable_batch=True,
        window=WINDOW,
        dynamic=DynamicOptions(port=port, timeout=scaled(3.0)),
        epochs=2,
    )
    w = np.array([0.3, -0.2, 0.5, 0.1])

    @jax.jit
    def weighted_grad(w, inputs, valid, loss_weight):
        # The usual masked local mean loss times the batch's loss weight.
        i = inputs[:, 0]
        x = jnp.stack([jnp.sin(i), jnp.cos(i * 0.7), i / N, jnp.ones_like(i)], 1)

        def loss(w):
            err = (x @ w - jnp.tanh(i * 0.01)) ** 2
            return (err * valid).sum() / jnp.maximum(valid.sum(), 1) * loss_weight

        return jax.grad(loss)(w)

    slow = SLOW if rank == world - 1 else 1.0
    epochs: list[list[list[int]]] = [[], []]
    weights: list[list[float]] = [[], []]
    grad_errors, rows = [], set()
    while True:
        epoch = it.epoch
        step = len(epochs[epoch]) if epoch < 2 else 0
        try:
            batch = next(it)
        except StopIteration:
            break
        if scenario == "kill" and (epoch, step) == KILL_AT:
            kill_point(sync, rank)
        indices = batch["indices"][batch["valid"]].tolist()
        rows.add(batch["inputs"].shape[0])
        weight = float(batch["loss_weight"])
        grad = weighted_grad(w, batch["inputs"], batch["valid"], batch["loss_weight"])
        epochs[epoch].append(indices)
        weights[epoch].append(weight)
        # The "all-reduce": every process publishes its part of the step, reads the others'.
        kv.key_value_set(
            f"{scenario}/step/{epoch}/{step}/{rank}",
            json.dumps({"indices": indices, "grad": np.asarray(grad).tolist()}),
        )
        parts = [
            json.loads(kv.blocking_key_value_get(f"{scenario}/step/{epoch}/{step}/{r}", 60_000))
            for r in range(world)
        ]
        average = np.mean([p["grad"] for p in parts], axis=0)
        whole = whole_step_gradient(w, [i for p in parts for i in p["indices"]])
        grad_errors.append(float(np.abs(average - whole).max()))
        it.report(float(lengths[indices].sum()) * 1e-6 * slow)
    session = it.stream.session
    it.close()
    global_shapes, local_counts = set(), []
    if scenario == "train":
        # One global array per step over both processes: equal shapes everywhere, every
        # process padded to the per-rank maximum whatever its share of the step.
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        placed = cj.iterator(
            np.arange(N, dtype=np.float64)[:, None],
            lengths,
            global_batch_size=PER_RANK * world,
            kind="dynamic",
            variable_batch=True,
            window=WINDOW,
            dynamic=DynamicOptions(port=port + 2, timeout=scaled(3.0)),
            as_jax=True,
            sharding=sharding,
        )
        for batch in placed:
            global_shapes.add(tuple(batch["inputs"].shape))
            real = batch["indices"][batch["indices"] >= 0]
            local_counts.append(len(real))
            placed.report(float(lengths[real].sum()) * 1e-6 * slow)
        placed.close()
    result = {
        "rank": rank,
        "epochs": epochs,
        "weights": weights,
        "rows": sorted(rows),
        "num_shapes": it.num_shapes,
        "grad_error": max(grad_errors),
        "dynamic_windows": session.windows_dynamic,
        "static_windows": session.windows_static,
        "global_shapes": sorted(global_shapes),
        "local_counts": local_counts,
    }
    out.write_text(json.dumps(result))
