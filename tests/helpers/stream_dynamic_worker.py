"""One rank of a real gloo job over a ``kind="dynamic"`` stream
(``chronica.torch.StreamingDataset``), started by
tests/adapters/torch/test_streaming_dynamic.py.

The training step's *workload* is a sleep proportional to the micro-batch's tokens, three
times longer on rank 1 than on rank 0 (a slower rank); every rank measures its own
compute time of each step and reports it (``dataset.report``), and an all-reduce after
every micro-batch stands for the gradient's (unequal counts would hang) and is left out of
the time reported, which is the rank's own.

argv: out_dir, mode, cut. ``full``: one whole pass, then a fresh dataset run for ``cut``
micro-batches whose ``StatefulDataLoader`` state every rank saves to
out_dir/state-<rank>.pt; ``resume``: a fresh dataset resumed from the rank's own state to
the end of the pass. Writes out_dir/<mode>-<rank>.json.
"""

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from stream_source import make_source
from torchdata.stateful_dataloader import StatefulDataLoader

from chronica import Packing, StreamOptions
from chronica.torch import StreamingDataset

PACKING = Packing(max_tokens=1024, row_length=512)
STREAM = StreamOptions(window_steps=1, buffer_size=6)
SLOWNESS = (1.0, 3.0)
SECONDS_PER_TOKEN = 4e-6


def train(loader, dataset, rank, limit=None) -> list:
    out, compute = [], 0.0
    for batch in loader:
        started = time.perf_counter()
        time.sleep(SLOWNESS[rank] * SECONDS_PER_TOKEN * int(batch["num_tokens"]))  # workload
        compute += time.perf_counter() - started  # the rank's own time, not the all-reduce's
        if batch["last"]:
            dataset.report(compute)
            compute = 0.0
        dist.all_reduce(torch.ones(1))
        ids = batch["indices"].tolist()
        out.append([ids, int(batch["num_tokens"]), batch["step"], batch["num_micro"]])
        if limit is not None and len(out) >= limit:
            break
    return out


def main(out_dir: str, mode: str, cut: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    folder = Path(out_dir)
    source = make_source(shards=8, mean=60)

    def dataset():
        return StreamingDataset(
            source, PACKING, batch_size=16, seed=3, kind="dynamic", stream=STREAM
        )

    result = {"num_samples": sum(source.shard_size(s) for s in range(source.num_shards))}
    if mode == "full":
        whole = dataset()
        result["full"] = train(StatefulDataLoader(whole, batch_size=None), whole, rank)
        result["speeds"] = whole.state_dict()["speeds"]
        part = dataset()
        loader = StatefulDataLoader(part, batch_size=None)
        result["part"] = train(loader, part, rank, int(cut))
        torch.save(loader.state_dict(), folder / f"state-{rank}.pt")
        part.close()
    else:
        resumed = dataset()
        loader = StatefulDataLoader(resumed, batch_size=None)
        loader.load_state_dict(torch.load(folder / f"state-{rank}.pt", weights_only=False))
        result["rest"] = train(loader, resumed, rank)
    dist.barrier()
    dist.destroy_process_group()
    (folder / f"{mode}-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
