"""The gradient-communication model (``chronica simulate gradients``) against hand-computed
steps, its determinism, the profiles' sizes and its argument errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from chronica.core.priority import simulate_order
from chronica.runtime.dispatcher import SchedulingOptions
from chronica.sim import cli
from chronica.sim.grad_cli import parse_rate
from chronica.sim.grad_profiles import PROFILES, DeviceModel, profile_layers
from chronica.sim.gradients import (
    DEFAULT_CREDIT_BYTES,
    DEFAULT_PARTITION_BYTES,
    POLICIES,
    Layer,
    Link,
    Policy,
    plan,
    simulate_gradients,
    simulate_step,
)

# A link of 1 MB/s without latency at W = 2: an all-reduce of n bytes takes n µs.
SLOW = Link(1e6, 0.0, 2)
MS = 1e-3


def step_ms(layers: list[Layer], policy: str, slowdown: float = 0.0) -> float:
    return round(simulate_step(layers, SLOW, policy, slowdown).step_s / MS, 9)


def test_ring_cost_is_the_formula() -> None:
    link = Link(1e6, 1e-3, 4)
    # 2(W-1)/W · bytes/B + 2(W-1)·α = 1.5 · 8 ms + 6 ms
    assert link.seconds(8000) == pytest.approx(18e-3)
    assert Link(1e6, 0.0, 2).seconds(4000) == pytest.approx(4e-3)


def test_one_layer_every_policy_waits_for_its_only_gradient() -> None:
    # forward 10, backward 20, all-reduce 4, update 1: nothing can overlap the all-reduce
    layers = [Layer("a", (4000,), 10 * MS, 20 * MS, 1 * MS)]
    for policy in POLICIES:
        result = simulate_step(layers, SLOW, policy)
        assert result.step_s == pytest.approx(35 * MS), policy
        assert result.compute_s == pytest.approx(31 * MS)
        assert result.exposed_s == pytest.approx(4 * MS)
        assert result.collectives == 1


TWO = [Layer("a", (4000,), 10 * MS, 20 * MS), Layer("b", (4000,), 10 * MS, 20 * MS)]


def test_two_layers_overlap_by_hand() -> None:
    # Backward: b's gradient at 20 (reduced 20-24), a's at 40 (40-44).
    # none: 60 of compute + one 8 ms all-reduce after backward.
    assert step_ms(TWO, "none") == 68
    # fifo: a's forward waits until 44, b's gradient is long reduced: 44 + 20 of forward.
    assert step_ms(TWO, "fifo") == 64
    # DDP's first bucket (1 MiB) and the shim's 1 MiB partition fuse both layers into one
    # all-reduce after backward, as the real ones do.
    assert step_ms(TWO, "ddp") == 68
    assert step_ms(TWO, "priority") == 68
    # One bucket per layer: b's is reduced during a's backward; the optimizer waits for a's.
    assert step_ms(TWO, "ddp,first_bucket=4000,bucket=4000") == 64


def test_ddp_buckets_close_once_they_reach_their_cap() -> None:
    layers = [Layer(str(i), (3000,), MS, MS) for i in range(5)]
    layout, order, _ = plan(layers, SLOW, Policy("ddp", bucket_bytes=5000, first_bucket_bytes=2000))
    # gradient-ready order 4,3,2,1,0: {4} reaches 2000, {3,2} reaches 5000, {1,0}
    assert layout.part_ptr.tolist() == [0, 2, 4, 5]
    assert order.tolist() == [2, 1, 0]


@pytest.mark.parametrize("name", ["gpt2", "vgg16", "bert-base"])
def test_ddp_buckets_are_torchs(name: str) -> None:
    """The buckets are those torch's own assignment gives the tensors in gradient-ready
    order with DDP's default caps (as its Reducer rebuilds them after the first step)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    layers = profile_layers(name)
    nbytes = [b for layer in layers for b in layer.tensor_bytes]
    ready_order = [torch.empty(b // 4, device="meta") for b in reversed(nbytes)]
    buckets, _ = dist._compute_bucket_assignment_by_size(ready_order, [1 << 20, 25 << 20])
    last = len(nbytes) - 1
    expected = [sorted(last - i for i in bucket) for bucket in buckets]
    layout, order, _ = plan(layers, SLOW, Policy("ddp"))
    got = [list(range(layout.part_ptr[p], layout.part_ptr[p + 1])) for p in order]
    assert got == expected


# a: 4000 bytes, b: 40000 bytes; forward 1 ms, backward 2 ms each.
SMALL_FIRST = [Layer("a", (4000,), MS, 2 * MS), Layer("b", (40000,), MS, 2 * MS)]


def test_credit_lets_the_first_layer_overtake() -> None:
    spec = "priority,partition=4000,credit=4000"
    layout, order, credit = plan(SMALL_FIRST, SLOW, Policy.parse(spec))
    assert layout.num_partitions == 11 and credit == 4000
    # b's 10 slices are ready at 2 ms, a's at 4 ms: with one slice in flight, a's slice goes
    # second and the rest of b after it (the core's own order).
    assert order.tolist() == [1, 0, *range(2, 11)]
    ready = np.asarray([4e-3, 2e-3])
    rate = 44000 / (11 * 4e-3)
    assert order.tolist() == simulate_order(layout, ready, 4000, rate).tolist()
    # a reduced at 10 -> its forward 10-11; b's at 46 -> 46-47; then backward again.
    assert step_ms(SMALL_FIRST, spec) == 47
    # Unlimited credit dispatches all of b at once: a waits until 46, its forward 46-47,
    # b's forward 47-48.
    assert step_ms(SMALL_FIRST, "priority,partition=4000,credit=0") == 48
    # none: 6 of compute and 44 of all-reduce in a row
    assert step_ms(SMALL_FIRST, "none") == 50


def test_slowdown_stretches_compute_while_the_link_is_busy() -> None:
    # fifo on TWO: b's all-reduce (20-24) overlaps a's backward, which then advances at half
    # speed for 4 ms: a's gradient at 42, reduced 42-46, forward 46-66.
    assert step_ms(TWO, "fifo", slowdown=1.0) == 66
    # none: the all-reduce never overlaps compute
    assert step_ms(TWO, "none", slowdown=1.0) == 68


def test_updates_run_on_the_training_thread_as_the_shim_does() -> None:
    # fifo: b's gradient (30 ms on the link) is reduced 20-50, a's 50-54. step() at 40
    # finds nothing reduced; a's forward waits until 54, then one optimizer call updates
    # a and b (1 + 5 ms) before it computes: 54-70, b's forward 70-80, backward from 80.
    layers = [
        Layer("a", (4000,), 10 * MS, 20 * MS, 1 * MS),
        Layer("b", (30000,), 10 * MS, 20 * MS, 5 * MS),
    ]
    assert step_ms(layers, "fifo") == 80


def test_link_slowdown_stretches_communication_while_the_rank_computes() -> None:
    # fifo, b's all-reduce of 16 ms from 20: at half speed beside a's backward (20-40) it
    # does 10 ms of work, the last 6 at full speed (40-46, a's forward waits); a's 46-50,
    # forward 50-70.
    layers = [TWO[0], Layer("b", (16000,), 10 * MS, 20 * MS)]
    slowed = simulate_step(layers, SLOW, "fifo", link_slowdown=1.0).step_s
    assert round(slowed / MS, 9) == 70
    assert step_ms(layers, "fifo") == 64  # b's 20-36, a's 40-44, forward 44-64
    # none: its one all-reduce runs after backward, beside no compute
    assert simulate_step(layers, SLOW, "none", link_slowdown=1.0).step_s == pytest.approx(
        simulate_step(layers, SLOW, "none").step_s
    )


def test_queued_collectives_pay_the_queued_latency() -> None:
    # Backward of 1 ms per layer: b's gradient at 1 goes on an idle link (4 + 2·1 ms of
    # latency: 1-7); a's, ready at 2, is queued behind it: 7-11 with no latency, 7-13 with
    # the full one. Then both forwards (20 ms) and the next backward: a step of 11 + 20.
    layers = [Layer(name, (4000,), 10 * MS, 1 * MS) for name in "ab"]
    full = Link(1e6, 1e-3, 2)
    queued = Link(1e6, 1e-3, 2, queued_latency_s=0.0)
    assert queued.seconds(4000, queued=True) == pytest.approx(4e-3)
    assert full.seconds(4000, queued=True) == pytest.approx(6e-3)
    assert simulate_step(layers, queued, "fifo").step_s == pytest.approx(31 * MS)
    assert simulate_step(layers, full, "fifo").step_s == pytest.approx(33 * MS)
    # a credit of one partition issues a only once b is reduced: on an idle link again
    credit = "priority,partition=4000,credit=4000"
    assert simulate_step(layers, queued, credit).step_s == pytest.approx(33 * MS)


def test_deterministic_and_independent_of_the_other_policies() -> None:
    layers = profile_layers("gpt2")
    link = Link(parse_rate("--link", "25gbit"), 5e-6, 16)
    first = [r.to_dict() for r in simulate_gradients(layers, link)]
    again = [r.to_dict() for r in simulate_gradients(layers, link, tuple(reversed(POLICIES)))]
    assert first == list(reversed(again))
    # overlap never makes a step shorter than its compute or the all-reduces in a row
    total = sum(sum(layer.tensor_bytes) for layer in layers)
    for r in first:
        assert r["step_s"] >= r["compute_s"]
        assert r["step_s"] >= link.seconds(total)


def test_defaults_are_the_shims() -> None:
    shim = SchedulingOptions()
    assert (DEFAULT_PARTITION_BYTES, DEFAULT_CREDIT_BYTES) == (
        shim.partition_bytes,
        shim.credit_bytes,
    )


def test_profiles_hold_the_real_models_parameters() -> None:
    params = {
        name: sum(sum(layer.tensor_bytes) for layer in profile_layers(name)) // 4
        for name in PROFILES
    }
    assert params == {
        "vgg16": 138_357_544,
        "bert-base": 110_104_890,  # BertModel with pooler and masked-LM head
        "bert-large": 336_224_058,
        "gpt2": 124_439_808,
        "gpt2-medium": 354_823_168,
    }
    # compute scales with the device: twice the FLOP/s, half the forward
    slow = profile_layers("gpt2", DeviceModel(flops=50e12))
    fast = profile_layers("gpt2", DeviceModel(flops=100e12))
    assert [a.forward_s for a in slow] == pytest.approx([2 * b.forward_s for b in fast])


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Link(0.0, 0.0, 8), "bandwidth"),
        (lambda: Link(1e9, -1.0, 8), "latency"),
        (lambda: Link(1e9, 0.0, 1), "ranks"),
        (lambda: Policy("lifo"), "policy"),
        (lambda: Policy.parse("priority,parts=1MiB"), "--policy"),
        (lambda: Policy.parse("priority,credit=lots"), "--policy"),
        (lambda: Layer("x", (-4,), 0.0, 0.0), "tensor_bytes"),
        (lambda: Layer("x", (4,), float("nan"), 0.0), "forward_s"),
        (lambda: parse_rate("--link", "fast"), "--link"),
        (lambda: profile_layers("resnet"), "--profile"),
        (lambda: profile_layers("gpt2", batch=0), "--batch"),
        (lambda: simulate_step([], SLOW, "fifo"), "layers"),
        (lambda: simulate_step(TWO, SLOW, "fifo", slowdown=-1.0), "slowdown"),
        (lambda: simulate_step(TWO, SLOW, "fifo", link_slowdown=-1.0), "link_slowdown"),
        (lambda: Link(1e9, 0.0, 8, queued_latency_s=-1.0), "queued_latency"),
    ],
)
def test_bad_arguments_name_the_argument(make, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()


def test_cli_prints_simulated_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["gradients", "--profile", "gpt2", "--ranks", "8,64", "--link", "10gbit,100gbit"]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert table.startswith("SIMULATED") and table.count("priority") == 4
    assert cli.main([*argv, "--policy", "ddp", "--policy", "priority", "--json", "-"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["simulated"] is True
    assert [(c["ranks"], c["link"]) for c in payload["cases"]] == [
        (8, "10gbit"),
        (8, "100gbit"),
        (64, "10gbit"),
        (64, "100gbit"),
    ]
    assert [r["policy"] for r in payload["cases"][0]["results"]] == ["ddp", "priority"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--ranks", "1,8"], "--ranks"),
        (["--link", "10gbits"], "--link"),
        (["--profile", "alexnet"], "--profile"),
        (["--policy", "lifo"], "policy"),
        (["--tflops", "0"], "--tflops"),
        (["--link-slowdown", "-1"], "link_slowdown"),
        (["--queued-latency", "-1"], "queued_latency"),
        (["--layers", "missing.json"], "missing.json"),
    ],
)
def test_cli_errors_name_the_flag(argv, named, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gradients", *argv]) == 2
    assert named in capsys.readouterr().err


def test_cli_reads_measured_layers(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "layers.json"
    rows = [
        {"name": layer.name, "tensor_bytes": list(layer.tensor_bytes), **times}
        for layer, times in zip(
            TWO,
            [{"forward_s": 0.01, "backward_s": 0.02}] * 2,
            strict=True,
        )
    ]
    path.write_text(json.dumps(rows))
    argv = ["gradients", "--layers", str(path), "--ranks", "2", "--link", "8mbit", "--json", "-"]
    argv += ["--latency", "0", "--policy", "fifo"]
    assert cli.main(argv) == 0
    (result,) = json.loads(capsys.readouterr().out)["cases"][0]["results"]
    assert result["step_s"] == pytest.approx(0.064)


def _validation_module():
    # The repository's root, not its benchmarks folder: that folder's ``streaming.py`` would
    # shadow the ``streaming`` package for every later test of this worker.
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import grad_sim_validation

    return grad_sim_validation


def test_validation_fits_the_link_from_its_own_all_reduces() -> None:
    bench = _validation_module()
    bandwidth, alpha, queued = 1.25e7, 1e-4, 3e-4  # bytes/s; seconds per hop (2 at W=2)
    numel = [1, 1 << 16, 1 << 18, 1 << 20]
    seconds = [4 * n / bandwidth + 2 * alpha for n in numel]
    parts = bench.QUEUED_PARTS
    split = seconds[-1] + 2 * (parts - 1) * queued
    fit = bench.link_fit({"numel": numel, "seconds": seconds, "queued": [seconds[-1], split]})
    # the one-element all-reduce is all latency (its 4 bytes take 0.3 µs here)
    assert fit == pytest.approx((bandwidth, alpha + 2 / bandwidth, queued))
    # a split faster than the whole (noise) gives no negative latency
    assert bench.link_fit({"numel": numel, "seconds": seconds, "queued": [1.0, 0.9]})[2] == 0


def test_validation_scales_layers_to_the_slower_ranks_median_step() -> None:
    bench = _validation_module()
    # two ranks, three steps, two layers; each step one rank has a delay in some layer
    forward = [
        np.array([[1.0, 1.0], [5.0, 1.0], [1.0, 1.0]]),
        np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 5.0]]),
    ]
    ranks = [
        {
            "forward": f,
            "backward": np.ones((3, 2)),
            "update": np.full(3, 0.5),
            "reduce": np.asarray([]),
            "step_s": 20.0,
        }
        for f in forward
    ]
    out = bench._slowest(ranks)
    # per layer and step the slower rank: forward [[1,1],[5,1],[1,5]], medians 1 and 1;
    # the slower rank's totals per step 4, 8, 8: median 8 against 2 + 2 from the medians
    assert out["spread"] == pytest.approx(2.0)
    assert out["forward_s"] == pytest.approx([2.0, 2.0])
    assert out["backward_s"] == pytest.approx([2.0, 2.0])
    assert out["overhead_s"] == pytest.approx(20.0 - 8.0 - 0.5)
