"""One process of a real 2-process JAX job on loopback, started by tests/test_jax.py.

argv: coordinator port, process id, number of processes, output JSON path. Takes rank and
world from ``jax.process_index()`` / ``jax.process_count()`` and writes every index it got.
"""

import json
import sys

import jax
import numpy as np


def main(port: str, process_id: str, num_processes: str, out_path: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(num_processes),
        process_id=int(process_id),
        initialization_timeout=60,
    )
    import chronica.jax as cj

    lengths = np.random.default_rng(0).lognormal(3, 1, 203).astype(int) + 1
    data = [np.arange(n, dtype=np.int32) for n in lengths]
    it = cj.iterator(data, global_batch_size=8 * jax.process_count(), epochs=2)
    epochs: dict[int, list[list[int]]] = {}
    for _ in range(2 * it.steps_per_epoch):
        epoch = it.epoch
        batch = next(it)
        epochs.setdefault(epoch, []).append(batch["indices"][batch["valid"]].tolist())
    # A global array over both processes: equal shapes everywhere, (16, bucket) globally.
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    placed = cj.iterator(data, global_batch_size=16, as_jax=True, sharding=sharding)
    global_shapes = [list(batch["inputs"].shape) for batch in placed]
    with open(out_path, "w") as f:
        json.dump(
            {
                "rank": jax.process_index(),
                "world": jax.process_count(),
                "num_shapes": it.num_shapes,
                "global_shapes": global_shapes,
                "epochs": {str(e): steps for e, steps in epochs.items()},
            },
            f,
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:5])
