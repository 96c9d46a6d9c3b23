"""One process of a real 2-process ``jax.distributed`` job that trains on chronica's
``StepSource`` through Grain's ``DataLoader`` with ``worker_count=2``, started by
tests/adapters/jax/test_grain.py.

argv: jax.distributed coordinator port, process id, output JSON path, time-out (seconds).

The job: ``EPOCHS`` epochs of records (global_shape=True, Grain's own
``ShardByJaxProcess`` sharding); every record is assembled with the other process's into
one global batch (``jax.make_array_from_process_local_data``) and a jitted step over it
returns, for every row of the global batch, its real tokens and the sample its tokens
belong to (sample ``i``'s tokens all equal ``i``): what the training step received. After
``RESUME_AT`` records the loader's Grain state is taken; when the run ends, a new source
and a new loader restored from that state (``set_state``) train the rest again. The
output lists, per record, the position, the valid indices, what the step received and a
digest of the record's bytes, for both runs, and the Grain state.
"""

import hashlib
import json
import sys

import numpy as np
from absl import flags
from grain_data import BATCH, EPOCHS, RESUME_AT, samples


def _digest(record: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(record):
        h.update(key.encode())
        h.update(np.ascontiguousarray(record[key]).tobytes())
    return h.hexdigest()


def main(port: str, process_id: str, out_path: str, timeout: str) -> None:
    # grain <= 0.2.18 reads an absl flag when its worker processes start; outside absl.app
    # flags are unparsed (google/grain#1355).
    flags.FLAGS.mark_as_parsed()
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=int(process_id),
        initialization_timeout=int(float(timeout)),
    )
    import grain
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import chronica.jax as cj

    data, lengths = samples()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    by_rows = NamedSharding(mesh, PartitionSpec("data"))

    @jax.jit
    def train_step(inputs: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        tokens = mask.sum(axis=1)
        owner = jnp.where(mask[:, 0], inputs[:, 0], -1)  # the sample of the row's tokens
        return tokens, owner

    def loader() -> grain.DataLoader:
        steps = cj.StepSource(
            data,
            sizes=lengths,
            global_batch_size=BATCH,
            epochs=EPOCHS,
            bucket_boundaries=(16, 64, 256, 1024),
            global_shape=True,
        )
        return grain.DataLoader(
            data_source=steps,
            sampler=steps.sampler(),
            worker_count=2,
            shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
        )

    def train(record: dict) -> dict:
        arrays = [
            jax.make_array_from_process_local_data(by_rows, np.asarray(record[key]))
            for key in ("inputs", "mask")
        ]
        tokens, owner = train_step(*arrays)
        # Every process gets the whole global batch's rows back (as an all-gather would).
        tokens, owner = (
            jax.experimental.multihost_utils.process_allgather(x, tiled=True)
            for x in (tokens, owner)
        )
        return {
            "epoch": int(record["epoch"]),
            "step": int(record["step"]),
            "indices": record["indices"][record["valid"]].tolist(),
            "shape": list(record["inputs"].shape),
            "tokens": np.asarray(tokens).tolist(),
            "owner": np.asarray(owner).tolist(),
            "digest": _digest(record),
        }

    run, state = [], None
    it = iter(loader())
    for record in it:
        run.append(train(record))
        if len(run) == RESUME_AT:
            state = it.get_state()
    assert state is not None
    restored = iter(loader())
    restored.set_state(state)
    resumed = [train(record) for record in restored]
    with open(out_path, "w") as f:
        json.dump(
            {
                "rank": jax.process_index(),
                "world": jax.process_count(),
                "run": run,
                "resumed": resumed,
                "state": json.loads(state.decode()),
            },
            f,
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    import jax.experimental.multihost_utils  # noqa: F401  (jax.experimental's submodule)

    main(*sys.argv[1:5])
