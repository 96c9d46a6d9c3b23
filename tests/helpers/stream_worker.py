"""One rank of a real gloo job over a streamed source (``chronica.torch.StreamingDataset``),
started by tests/adapters/torch/test_streaming_dist.py.

argv: out_dir, mode, cut, then one or more sources, run one after the other in the same
process group; a source is ``list`` or ``list-seq`` (the in-memory source, with or without
random access) or a format of ``stream_formats`` (the dataset lies in out_dir/<source>/data).
Modes:
``full``   one whole pass (an all-reduce after every micro-batch: unequal counts would
           hang), then a fresh dataset run for ``cut`` micro-batches whose
           ``StatefulDataLoader`` state rank 0 saves to out_dir/<source>/state.pt;
``resume`` a fresh dataset resumed from out_dir/<source>/state.pt to the end of the pass.
Writes every micro-batch's signature as JSON to out_dir/<source>/<mode>-<world>-<rank>.json.
"""

import hashlib
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from stream_formats import open_source
from stream_source import make_source
from torchdata.stateful_dataloader import StatefulDataLoader

from chronica.core.packing import Packing
from chronica.torch import StreamingDataset

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def signature(batch: dict) -> dict:
    tokens = batch["input_ids"].numpy().tobytes()
    return {
        "ids": batch["indices"].tolist(),
        "cu_seqlens": batch["cu_seqlens"].tolist(),
        "positions": batch["position_ids"].tolist()[:64],
        "tokens": hashlib.sha256(tokens).hexdigest(),
        "num_tokens": int(batch["num_tokens"]),
        "loss_weight": batch["loss_weight"],
        "step": batch["step"],
        "micro": batch["micro"],
        "num_micro": batch["num_micro"],
    }


def consume(loader, limit=None, sign=signature) -> list:
    """Every micro-batch's ``sign(batch)``, an all-reduce after each (unequal counts hang),
    stopping after ``limit``."""
    out = []
    for batch in loader:
        out.append(sign(batch))
        dist.all_reduce(torch.ones(1))
        if limit is not None and len(out) >= limit:
            break
    return out


def main(out_dir: str, mode: str, cut: str, *kinds: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
    for kind in kinds:
        run(Path(out_dir) / kind, mode, kind, int(cut))
    dist.destroy_process_group()


def run(folder: Path, mode: str, kind: str, cut: int) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    key = "input_ids"
    if kind.startswith("list"):
        source = make_source(random_access=kind == "list")
    else:
        source, key = open_source(kind, folder / "data")
    OPTIONS["key"] = key
    result = {}
    if mode == "full":
        result["full"] = consume(
            StatefulDataLoader(StreamingDataset(source, PACKING, **OPTIONS), batch_size=None)
        )
        dataset = StreamingDataset(source, PACKING, **OPTIONS)
        loader = StatefulDataLoader(dataset, batch_size=None)
        result["part"] = consume(loader, cut)
        if rank == 0:
            torch.save(loader.state_dict(), folder / "state.pt")
        dataset.close()  # the pass is left unfinished: stop planning before the group goes
    else:
        dataset = StreamingDataset(source, PACKING, **OPTIONS)
        loader = StatefulDataLoader(dataset, batch_size=None)
        loader.load_state_dict(torch.load(folder / "state.pt", weights_only=False))
        result["rest"] = consume(loader)
        result["bytes_sent"] = dataset.engine.stats.bytes_sent
    result["num_samples"] = sum(source.shard_size(s) for s in range(source.num_shards))
    dist.barrier()
    (folder / f"{mode}-{world}-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
