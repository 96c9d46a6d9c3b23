"""The cluster simulator (``chronica.sim``, ``chronica simulate``): it plans with the real
scheduler, times steps as documented, and fails early on bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import reference

from chronica.cli import main as chronica_main
from chronica.core import CostModel, ScheduleConfig, Scheduler
from chronica.core.rng import Stream, derive_key, permutation
from chronica.core.shuffle import ShufflePolicy
from chronica.sim import (
    AllReduceModel,
    ComputeModel,
    SimOptions,
    SizeDistribution,
    Strategy,
    hl_speeds,
    parse_speeds,
    read_sizes,
    simulate,
)
from chronica.sim.cli import main as simulate_main
from chronica.sim.timing import evaluate_steps, shared_finish


def _sizes(n: int = 600, seed: int = 1) -> np.ndarray:
    return SizeDistribution("lognormal").draw(n, seed)


def _options(**kwargs) -> SimOptions:
    base = {"world": 4, "batch_size": 32, "compute": ComputeModel(1e-3), "epochs": 1}
    base.update(kwargs)
    return SimOptions(**base)


# -- the plans are the real scheduler's --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("static", {"kind": "static"}),
        ("pool", {"kind": "static", "exact": False}),
        ("guided", {"kind": "guided"}),
        ("static,shuffle=block,block_size=8", {"shuffle": ShufflePolicy.block(8)}),
        ("static,shuffle=local", {"shuffle": ShufflePolicy.local()}),
    ],
)
def test_assignment_is_the_schedulers_plan(spec: str, kwargs: dict) -> None:
    sizes = _sizes()
    strategy = Strategy.parse(spec)
    config = strategy.schedule_config(4, 32, 7, "linear", None)
    for epoch in (0, 1):
        got = strategy.assignment(Scheduler(sizes, config), 32, epoch)
        plan = Scheduler(
            sizes, ScheduleConfig(num_replicas=4, batch_size=32, seed=7, **kwargs)
        ).plan_epoch(epoch)
        np.testing.assert_array_equal(got.indices, plan.indices)
        np.testing.assert_array_equal(got.bounds, plan.bounds)


def test_torch_baseline_is_the_strided_split_of_the_padded_permutation() -> None:
    n, w, b, seed, epoch = 50, 4, 8, 3, 2
    sizes = _sizes(n)
    strategy = Strategy("torch")
    scheduler = Scheduler(sizes, strategy.schedule_config(w, b, seed, "linear", None))
    got = strategy.assignment(scheduler, b, epoch)
    order = permutation(n, derive_key(seed, epoch, Stream.ORDER))
    padded = np.concatenate([order, order[: 52 - n]])  # ceil(50/4)=13 per rank
    k = b // w
    for r in range(w):
        stream = padded[r::w]
        for s in range(got.bounds.shape[0]):
            local = got.indices[got.bounds[s, r] : got.bounds[s, r + 1]]
            np.testing.assert_array_equal(local, stream[s * k : (s + 1) * k])


def test_dynamic_windows_keep_every_steps_samples() -> None:
    sizes = _sizes()
    options = _options(strategies=("dynamic,window=2",), speeds="1,1,1,0.25")
    result = simulate(sizes, options, progress=False)
    static = Scheduler(sizes, ScheduleConfig(num_replicas=4, batch_size=32)).plan_epoch(0)
    assert result.result("dynamic,window=2").steps == static.num_steps


# -- the time model ----------------------------------------------------------------------------


def _reference(sizes, plan, spc, slowdown, allreduce_s):
    """Loop-by-loop step times and idle fraction of a plan (pure Python and numpy)."""
    steps, w = plan.bounds.shape[0], plan.num_replicas
    total = busy_mean = busy_max = 0.0
    for s in range(steps):
        times = []
        for r in range(w):
            local = plan.indices[plan.bounds[s, r] : plan.bounds[s, r + 1]]
            times.append(spc * float(sizes[local].sum()) * slowdown[r])
        total += max(times) + allreduce_s
        busy_mean += sum(times) / w
        busy_max += max(times)
    return total, 1.0 - busy_mean / busy_max


def test_step_time_and_idle_match_a_loop_reference() -> None:
    sizes = _sizes(300)
    allreduce = AllReduceModel(latency_s=1e-4, bandwidth=1e9, grad_bytes=4e6)
    options = _options(strategies=("static",), speeds="1,2,1,0.5", allreduce=allreduce, epochs=1)
    result = simulate(sizes, options, progress=False).result("static")
    plan = Scheduler(sizes, ScheduleConfig(num_replicas=4, batch_size=32)).plan_epoch(0)
    slowdown = np.array([2.0, 1.0, 2.0, 4.0])  # fastest speed (2) over each speed
    total, idle = _reference(sizes, plan, 1e-3, slowdown, allreduce.seconds(4))
    assert result.total_s == pytest.approx(total, rel=1e-12)
    assert result.idle_fraction == pytest.approx(idle, rel=1e-12)
    assert allreduce.seconds(4) == pytest.approx(2 * 3 / 4 * 4e6 / 1e9 + 2 * 3 * 1e-4)


def test_equal_speeds_and_sizes_give_speedup_exactly_one() -> None:
    sizes = np.full(640, 100.0)
    result = simulate(
        sizes,
        _options(strategies=("torch", "length-grouped", "static", "pool", "guided", "dynamic")),
        progress=False,
    )
    assert [r.speedup for r in result.results] == [1.0] * 6
    assert all(r.idle_fraction == 0.0 and r.padding == 0.0 for r in result.results)


def test_hl8_torch_step_is_the_slowest_ranks_compute() -> None:
    sizes = np.full(320, 10.0)
    allreduce = AllReduceModel(grad_bytes=0.0, latency_s=0.0)
    options = _options(strategies=("torch",), speeds="HL8", allreduce=allreduce)
    result = simulate(sizes, options, progress=False).result("torch")
    slowest = 32.0 / 4.0  # HL8 = (6, 6, 4, 32): the rank of speed 4 is 8x the fastest
    np.testing.assert_allclose(result.step_s, 1e-3 * 8 * 10.0 * slowest)


def test_dynamic_beats_static_when_a_rank_slows_down() -> None:
    sizes = _sizes(1600)
    options = _options(
        strategies=("static", "dynamic,window=4"), speeds="slowdown:2@10*3", epochs=2
    )
    result = simulate(sizes, options, progress=False)
    static, dynamic = result.result("static"), result.result("dynamic,window=4")
    assert dynamic.total_s < 0.8 * static.total_s
    assert dynamic.idle_fraction < static.idle_fraction


def test_length_grouping_pads_less_and_local_shuffle_moves_nothing() -> None:
    sizes = _sizes(2000)
    options = _options(
        world=8,
        batch_size=64,
        epochs=2,
        strategies=("torch", "length-grouped", "static,shuffle=local"),
    )
    result = simulate(sizes, options, progress=False)
    torch, grouped = result.result("torch"), result.result("length-grouped")
    assert grouped.padding < 0.5 * torch.padding
    assert result.result("static,shuffle=local").moved_per_epoch == 0
    assert torch.moved_fraction > 0.8  # a global reshuffle moves about N(1 - 1/W)


def test_packed_steps_train_every_token_once_balanced_with_less_padding() -> None:
    sizes = np.minimum(np.rint(_sizes(3000, seed=4)), 1024)
    options = _options(
        world=8,
        batch_size=256,
        epochs=2,
        cost=CostModel.quadratic(0, 256, 1),
        strategies=(
            "torch",
            "static",
            "packed,max_tokens=1024,row_length=512,long_documents=split",
        ),
    )
    result = simulate(sizes, options, progress=False)
    torch, static = result.result("torch"), result.result("static")
    packed = result.results[-1]
    assert packed.label.startswith("packed")
    assert packed.steps == static.steps  # the same global batches
    assert packed.load_ratio < min(static.load_ratio, 1.01)
    assert packed.padding < 0.5 * torch.padding
    assert packed.total_s < static.total_s < torch.total_s
    with pytest.raises(ValueError, match="packed needs max_tokens="):
        simulate(sizes, _options(strategies=("packed",)), progress=False)


def test_hl_levels_have_the_named_spread() -> None:
    for level in range(1, 9):
        speeds = hl_speeds(level)
        assert max(speeds) / min(speeds) == pytest.approx(level)
    profile = parse_speeds("HL4", 8, 10)
    np.testing.assert_array_equal(profile.speeds(0), [9, 9, 6, 24, 9, 9, 6, 24])
    assert parse_speeds("slowdown", 4, 100).speeds(50)[0] == 0.5


@pytest.mark.parametrize(
    "spec",
    [
        "constant",
        "HL8",
        "hl2",
        "HL1,HL8@10",
        "drifting:5:0.2",
        "slowdown",
        "slowdown:1@3*2",
        "straggler:1@3*2",
        "1,0.5",
        "6,6,4,32",
    ],
)
def test_demo_and_simulate_share_one_speeds_grammar(spec) -> None:
    from chronica.demo.config import DemoConfig

    profile = parse_speeds(spec, 8, 40)
    config = DemoConfig(
        lengths=[8] * 128, lengths_source="test", batch_size=16, epochs=5, world_size=8, speeds=spec
    )
    config.validate()
    assert config.profile() == profile


def test_speed_profiles_changing_and_straggler() -> None:
    profile = parse_speeds("HL1,HL8@100", 4, 200)
    np.testing.assert_array_equal(profile.speeds(99), [12, 12, 12, 12])
    np.testing.assert_array_equal(profile.speeds(100), [6, 6, 4, 32])
    assert parse_speeds("straggler:2@10*4", 4, 100).slowdown(10)[2] == 4.0
    for bad in ("HL9", "HL1,HL8", "straggler", "HL4"):
        with pytest.raises(ValueError, match=r"--speeds .* not understood"):
            parse_speeds(bad, 6 if bad == "HL4" else 4, 10)


# -- sizes files -------------------------------------------------------------------------------


def test_size_files(tmp_path) -> None:
    values = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    (tmp_path / "s.txt").write_text("# lengths\n3\n1\n\n4\n1\n5\n")
    np.save(tmp_path / "s.npy", values)
    (tmp_path / "s.csv").write_text(
        "id,tokens\n" + "".join(f"{i},{v:g}\n" for i, v in enumerate(values))
    )
    np.testing.assert_array_equal(read_sizes(tmp_path / "s.txt"), values)
    np.testing.assert_array_equal(read_sizes(tmp_path / "s.npy"), values)
    np.testing.assert_array_equal(read_sizes(tmp_path / "s.csv", "tokens"), values)


def test_parquet_column(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"tokens": [3, 1, 4]}), tmp_path / "s.parquet")
    np.testing.assert_array_equal(read_sizes(tmp_path / "s.parquet", "tokens"), [3, 1, 4])


def test_parquet_without_pyarrow_names_the_fix(tmp_path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ModuleNotFoundError:
        (tmp_path / "s.parquet").write_bytes(b"PAR1")
        with pytest.raises(ValueError, match="pip install pyarrow"):
            read_sizes(tmp_path / "s.parquet", "tokens")
    else:
        pytest.skip("pyarrow is installed")


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("3\n-1\n", [], r"--sizes s.txt\[1\] is .*-1\.0.*; sizes must be non-negative"),
        ("3\nnan\n", [], r"--sizes s.txt\[1\] is .*nan.*; sizes must be finite"),
        ("3\n4\n", ["--world", "0"], "--world 0 must be an int >= 1"),
        ("3\n4\n", ["--world", "4", "--batch-size", "30"], "--batch-size 30 .* multiple of"),
        ("3\n4\n", ["--speeds", "HL9"], "--speeds 'HL9' not understood"),
        ("3\n4\n", ["--config", "fast"], "--config 'fast' is not one of"),
        ("3\n4\n", ["--config", "dynamic,speed=2"], "unknown option 'speed'"),
        ("3\n4\n", ["--column", "x"], "--column 'x' only applies to .csv"),
        ("3\n4\n", ["--samples", "100000000000"], "--samples 100,000,000,000 is above the"),
        ("3\n4\n", ["--epochs", "1000000000"], "--epochs 1000000000 is above the simulator's"),
        ("3\n4\n", ["--samples", "10000000", "--epochs", "1000"], "x --epochs 1,000 is above"),
    ],
)
def test_bad_input_fails_early_naming_the_argument(tmp_path, capsys, content, args, message):
    (tmp_path / "s.txt").write_text(content)
    assert simulate_main(["--sizes", str(tmp_path / "s.txt"), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chronica simulate: error:")
    assert re.search(message, err), err


def test_a_plot_without_matplotlib_stops_before_simulating(tmp_path, capsys, monkeypatch):
    import chronica.sim.cli as cli

    real = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name)
    )
    monkeypatch.setattr(cli, "simulate", lambda *a, **k: pytest.fail("simulated"))
    (tmp_path / "s.txt").write_text("3\n4\n")
    assert simulate_main(["--sizes", str(tmp_path / "s.txt"), "--plot", "x.png"]) == 2
    assert "--plot draws with matplotlib, which is not installed" in capsys.readouterr().err


def test_the_table_is_printed_before_a_plot_that_fails(tmp_path, capsys, monkeypatch):
    import chronica.sim.cli as cli

    def fails(result, path):
        raise OSError(f"cannot write {path}")

    monkeypatch.setattr(cli, "plot", fails)
    (tmp_path / "s.txt").write_text("\n".join(str(n) for n in range(1, 65)))
    args = ["--sizes", str(tmp_path / "s.txt"), "--world", "2", "--batch-size", "8"]
    assert simulate_main([*args, "--plot", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert "speed-up" in captured.out and "cannot write" in captured.err


def test_missing_file_and_empty_column(tmp_path, capsys) -> None:
    assert simulate_main(["--sizes", str(tmp_path / "none.txt"), "--quiet"]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "t.csv").write_text("tokens,other\n")
    assert simulate_main(["--sizes", str(tmp_path / "t.csv"), "--column", "tokens"]) == 2
    assert "no sizes found" in capsys.readouterr().err
    assert simulate_main(["--sizes", str(tmp_path / "t.csv")]) == 2
    assert "--column NAME" in capsys.readouterr().err


# -- the command line ----------------------------------------------------------------------------


def test_cli_end_to_end_writes_json_and_png(tmp_path, capsys) -> None:
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    code = chronica_main(
        [
            "simulate",
            "--dist",
            "bimodal:32:512:0.2",
            "--samples",
            "3000",
            "--world",
            "8",
            "--epochs",
            "2",
            "--speeds",
            "HL4",
            "--noise",
            "0.05",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "speed-up" in printed and "length-grouped" in printed and str(out_png) in printed
    data = json.loads(out_json.read_text())
    labels = [r["label"] for r in data["results"]]
    assert labels == ["torch", "length-grouped", "static", "pool", "guided", "dynamic"]
    assert data["results"][0]["speedup"] == 1.0
    assert len(data["results"][0]["step_s"]) == data["results"][0]["steps"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
def test_shared_processors_match_an_event_by_event_reference(cores):
    rng = np.random.default_rng(cores)
    work = rng.lognormal(0, 1, (20, 6))
    work[3] = 1.0  # ties
    got = shared_finish(work, cores)
    for row, finish in zip(work, got, strict=True):
        np.testing.assert_allclose(finish, reference.shared_finish(row, cores), rtol=1e-9)
    assert (got >= work - 1e-12).all()
    # No schedule beats either bound (processors idle once fewer ranks than cores work).
    bound = np.maximum(work.max(axis=1), work.sum(axis=1) / cores)
    assert (got.max(axis=1) >= bound * (1 - 1e-12)).all()


def test_coordinator_work_shares_the_cores_but_ends_no_step():
    indices = np.arange(8)
    bounds = np.array([[0, 2, 4, 6, 8]])
    costs = np.array([1.0, 1, 2, 2, 1, 1, 3, 3])
    ones = np.ones((1, 4))
    model = ComputeModel(1.0, cores=2, coordinator_s=5.0)
    shared = evaluate_steps(indices, bounds, costs, costs, ones, ones, model, 0.0, host_work=5.0)
    alone = evaluate_steps(indices, bounds, costs, costs, ones, ones, model, 0.0)
    work = np.array([2.0, 4.0, 2.0, 6.0, 5.0])  # four ranks and the coordinator
    np.testing.assert_allclose(shared.compute[0], reference.shared_finish(work, 2)[:4])
    assert (shared.compute > alone.compute).all()
    assert shared.step_s[0] == shared.compute[0].max()  # the coordinator's end is not waited for
