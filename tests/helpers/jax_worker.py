"""One process of the real 2-process JAX job of tests/adapters/jax/test_jax.py (not run by
pytest): one ``jax.distributed`` job on loopback runs every scenario in turn, so the two
processes import JAX and meet once.

argv: output folder, jax.distributed coordinator port, chronica coordinator port (and the
next three, for the "train" scenario's two coordinators), the standalone coordinator's port
(the "kill" scenario), process id. Scenarios, in this order, each writing
``OUT/<scenario>.rank<R>.json``:

* "cover": a static iterator with rank and world from ``jax.process_index()`` /
  ``jax.process_count()`` for two epochs (every index it got), then one epoch as global
  arrays over a sharding spanning both processes (their shapes);
* "kill" and "train": kind="dynamic" (``jax_dynamic_worker.dynamic``), "kill" against the
  standalone coordinator the test kills mid-epoch.
"""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from jax_dynamic_worker import dynamic


def cover(out: Path) -> None:
    """Scenario "cover": every index a static iterator gives this process, per epoch."""
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
    out.write_text(
        json.dumps(
            {
                "rank": jax.process_index(),
                "world": jax.process_count(),
                "num_shapes": it.num_shapes,
                "global_shapes": global_shapes,
                "epochs": {str(e): steps for e, steps in epochs.items()},
            }
        )
    )


def main(out: str, jax_port: str, port: str, standalone: str, pid: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{jax_port}",
        num_processes=2,
        process_id=int(pid),
        initialization_timeout=60,
    )
    from jax._src.distributed import global_state

    folder = Path(out)
    cover(folder / f"cover.rank{pid}.json")
    os.environ["CHRONICA_COORDINATOR"] = f"127.0.0.1:{standalone}"
    dynamic("kill", folder / f"kill.rank{pid}.json", int(port), folder)
    del os.environ["CHRONICA_COORDINATOR"]
    dynamic("train", folder / f"train.rank{pid}.json", int(port), folder)
    global_state.client.wait_at_barrier("chronica-test-done", 60_000)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:6])
