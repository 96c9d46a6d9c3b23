"""One process of a real 2-process ``jax.distributed`` streaming job (``chronica.jax.stream``),
started by tests/adapters/jax/test_jax_streaming.py, not by pytest.

argv: jax.distributed coordinator port, process id, OUT.json, CUT. Over the in-memory source
without random access (samples travel by the all-to-all, through the coordination service's
key-value store) it runs one whole pass, then a second stream for ``CUT`` items whose
``state_dict()`` (through JSON) a third, fresh stream resumes to the end of the pass. Writes
every item's signature per run to OUT.json.
"""

import hashlib
import json
import sys

import jax
from stream_source import make_source

import chronica.jax
from chronica.core.packing import Packing

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def signature(item: dict) -> dict:
    ids = item["ids"]
    return {
        "ids": ids[ids >= 0].tolist(),
        "tokens": hashlib.sha256(item["tokens"].tobytes()).hexdigest(),
        "step": int(item["step"]),
        "micro": int(item["micro"]),
        "num_micro": int(item["num_micro"]),
        "loss_weight": float(item["loss_weight"]),
    }


def main(port: str, pid: str, out: str, cut: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=int(pid),
        initialization_timeout=60,
    )
    source = make_source(random_access=False)
    full = [signature(item) for item in chronica.jax.stream(source, PACKING, **OPTIONS)]
    batches = chronica.jax.stream(source, PACKING, **OPTIONS)
    part = [signature(next(batches)) for _ in range(int(cut))]
    state = json.loads(json.dumps(batches.state_dict()))
    batches.close()
    resumed = chronica.jax.stream(source, PACKING, **OPTIONS)
    resumed.load_state_dict(state)
    rest = [signature(item) for item in resumed]
    with open(out, "w") as f:
        json.dump({"full": full, "part": part, "rest": rest}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:5])
