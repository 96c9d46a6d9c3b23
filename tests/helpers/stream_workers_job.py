"""One rank of a real gloo job over MDS shards or parquet files read by ``DataLoader``
workers (``chronica.torch.StreamingDataset.loader``), started by
tests/adapters/torch/test_streaming_workers_dist.py.

argv: kind (``stream_formats``: ``mds`` or ``parquet``), data_dir, out_dir, mode, cut,
workers. Modes:
``full``   one whole pass through ``loader(num_workers=workers)`` (an all-reduce after every
           micro-batch: unequal counts would hang) and one through the single-process
           ``DataLoader(dataset, batch_size=None)``; then a fresh dataset's loader run for
           ``cut`` micro-batches, whose ``dataset.state_dict()`` rank 0 saves to
           out_dir/state.json;
``resume`` a fresh dataset resumed from out_dir/state.json, through the loader to the end
           of the pass (at any world size).
Writes every micro-batch's signature as JSON to out_dir/<mode>-<world>-<rank>.json.
"""

import hashlib
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from stream_formats import open_source
from stream_worker import consume
from torch.utils.data import DataLoader

from chronica.core.packing import Packing
from chronica.torch import StreamingDataset

PACKING = Packing(max_tokens=1024, row_length=512)
OPTIONS = {"batch_size": 12, "buffer_size": 6, "window_steps": 2, "seed": 3}


def signature(batch: dict) -> dict:
    digest = hashlib.sha256()
    for field in ("input_ids", "position_ids", "labels", "cu_seqlens", "segment_ids"):
        digest.update(batch[field].numpy().tobytes())
    return {
        "ids": batch["indices"].tolist(),
        "bytes": digest.hexdigest(),
        "num_tokens": int(batch["num_tokens"]),
        "loss_weight": batch["loss_weight"],
        "step": batch["step"],
        "micro": batch["micro"],
        "num_micro": batch["num_micro"],
    }


def main(kind: str, data: str, out_dir: str, mode: str, cut: str, workers: str) -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
    world, rank, out = dist.get_world_size(), dist.get_rank(), Path(out_dir)
    source, _ = open_source(kind, Path(data))
    result = {"num_samples": sum(source.shard_size(s) for s in range(source.num_shards))}
    if mode == "full":
        result["full"] = consume(
            StreamingDataset(source, PACKING, **OPTIONS).loader(int(workers)), sign=signature
        )
        result["single"] = consume(
            DataLoader(StreamingDataset(source, PACKING, **OPTIONS), batch_size=None),
            sign=signature,
        )
        dataset = StreamingDataset(source, PACKING, **OPTIONS)
        result["part"] = consume(dataset.loader(int(workers)), int(cut), signature)
        if rank == 0:
            (out / "state.json").write_text(json.dumps(dataset.state_dict()))
        dataset.close()  # the pass is left unfinished: stop planning before the group goes
    else:
        dataset = StreamingDataset(source, PACKING, **OPTIONS)
        dataset.load_state_dict(json.loads((out / "state.json").read_text()))
        result["rest"] = consume(dataset.loader(int(workers)), sign=signature)
    dist.barrier()
    (out / f"{mode}-{world}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
