"""``chronica demo``: the real 2-process run end to end (quick configuration), and its parts.

No timing is asserted: the machine running the tests may be slow or busy.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from chronica import demo


def _children() -> list[int]:
    """Live child processes of this test process (Linux /proc; empty elsewhere)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _table(out: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if re.match(r"(torch|chronica|dynamic)\s+\d", line)
    }


def test_quick_demo_trains_with_both_samplers_and_prints_the_table(capfd, tmp_path: Path):
    before = _children()
    assert demo.main(["--quick", "--json", str(tmp_path / "demo.json")]) == 0
    captured = capfd.readouterr()  # the ranks' progress goes to the process's stderr
    out = captured.out
    rows = _table(out)
    for name in ("torch", "chronica"):
        assert name in rows, out
        # measured and predicted per-step max/mean, then their difference and the worst step
        measured, predicted = float(rows[name][1]), float(rows[name][2])
        assert measured >= 1.0 and predicted >= 1.0, out
        assert rows[name][3].endswith("%"), out
    assert re.search(r"^speed-up of chronica: \d+\.\d+x in the slowest rank", out, re.M), out
    assert re.search(r"its measured balance gives [\d.]+ / [\d.]+ = \d+\.\d+x", out), out
    assert re.search(r"held-out loss chronica - torch: [+-]\d\.\d+ \(per seed", out), out
    assert "cost model (CPU seconds)" in out and "simulated, not measured" in out, out
    assert re.search(r"^  ranks\s+2\s+8$", out, re.M), out
    assert re.search(r"ranks (pinned to cores \d+, \d+|not pinned)", out), out
    # progress by default, with the run time estimated before training
    assert "estimated" in captured.err and "epoch 1/1" in captured.err
    saved = json.loads((tmp_path / "demo.json").read_text())
    speedup = saved["summary"]["samplers"]["chronica"]["speedup"]
    assert f"speed-up of chronica: {speedup:.2f}x" in out
    assert len(saved["results"]["torch"]["seeds"]) == saved["config"]["seeds"] == 2
    assert set(_children()) <= set(before)  # no rank left behind


def test_demo_with_an_emulated_slow_rank_runs_the_dynamic_sampler(capfd):
    before = _children()
    argv = ["--quick", "--quiet", "--speeds", "1,0.5", "--epochs", "2", "--seeds", "1"]
    assert demo.main(argv) == 0
    captured = capfd.readouterr()
    out = captured.out
    # --quiet: the report alone, no progress bar or status lines (clean when piped)
    assert "\r" not in captured.err and "chronica demo:" not in captured.err
    assert out.startswith("chronica demo: 2 processes")
    assert "dynamic" in _table(out), out
    assert "rank speeds 1,0.5" in out
    assert re.search(r"^speed-up of dynamic: \d+\.\d+x", out, re.MULTILINE), out
    assert "simulated, not measured" not in out  # no projection with emulated speeds
    assert set(_children()) <= set(before)


def test_timeout_stops_every_rank_and_reports_it(capsys):
    before = _children()
    assert demo.main(["--quick", "--no-progress", "--timeout", "0.5"]) == 1
    assert "did not finish within" in capsys.readouterr().err
    assert set(_children()) <= set(before)


def test_kernels_are_compiled_before_the_ranks_start_and_ranks_pin_only_when_asked():
    from chronica.demo.placement import pin_rank
    from chronica.demo.warmup import kernels_cached, warm_up

    config, _ = demo.parse_args(["--quick"])
    assert warm_up(config) >= 0 and kernels_cached()
    assert pin_rank(0, 2, wanted=False) == []
    assert pin_rank(0, 1 << 16, wanted=True) == []  # fewer cores than ranks: not pinned


def test_lengths_file(tmp_path: Path):
    path = tmp_path / "lengths.txt"
    path.write_text("# tokens\n12\n\n300\n7.0\n")
    assert demo.load_lengths(path).tolist() == [12, 300, 7]
    assert demo.load_lengths(path, limit=2).tolist() == [12, 300]
    with pytest.raises(ValueError, match="more samples"):
        demo.load_lengths(path, limit=4)
    path.write_text("12\n0\n")
    with pytest.raises(ValueError, match=r"--lengths lengths.txt\[1\] is 0; .* integer >= 1"):
        demo.load_lengths(path)
    path.write_text("12\n2.5\n")
    with pytest.raises(ValueError, match=r"\[1\] is 2.5"):
        demo.load_lengths(path)
    # the reader of chronica simulate --sizes: .npy and a CSV column work too
    np.save(tmp_path / "lengths.npy", np.array([5, 9]))
    assert demo.load_lengths(tmp_path / "lengths.npy").tolist() == [5, 9]
    (tmp_path / "lengths.csv").write_text("id,tokens\n0,4\n1,6\n")
    assert demo.load_lengths(tmp_path / "lengths.csv", column="tokens").tolist() == [4, 6]
    (tmp_path / "blank.txt").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match=r"--lengths blank\.txt: no sizes found"):
        demo.load_lengths(tmp_path / "blank.txt")


def test_bad_arguments_fail_early_without_starting_processes(tmp_path: Path, capsys):
    assert demo.main(["--lengths", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--batch-size", "33"])  # not a multiple of the 2 ranks
    assert "multiple" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--seeds", "0"])
    assert "--seeds 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--calibration-steps", "1"])
    assert "--calibration-steps 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--simulate", "8,x"])
    assert "comma list" in capsys.readouterr().err


def test_parsing_imports_no_torch_and_the_default_is_the_documented_run():
    code = (
        "import sys; from chronica.demo import parse_args; c, _ = parse_args([]); "
        "assert 'torch' not in sys.modules; "
        "print(len(c.lengths), c.batch_size, c.epochs, c.seeds, c.cost, c.calibration_steps, "
        "c.simulate_worlds)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out.stdout = out.stdout.strip()
    assert out.stdout.split(maxsplit=5) == [
        "1024",
        "32",
        "4",
        "3",
        "quadratic",
        "24 (8, 64, 256, 1024)",
    ]


def test_generated_lengths_are_seeded_and_clipped():
    a = demo.make_lengths(4096, seed=3)
    assert a.dtype == np.int64 and a.min() >= 8 and a.max() <= 4096
    assert np.array_equal(a, demo.make_lengths(4096, seed=3))
    assert not np.array_equal(a, demo.make_lengths(4096, seed=4))


def test_packed_batch_and_model_pool_each_sequence_separately():
    data = demo.PackedTokens(np.array([3, 1, 5]), seed=1)
    assert len(data) == 3 and data.sizes.tolist() == [3, 1, 5]
    batch = demo.collate_packed([data[2], data[0]])
    assert batch.tokens.shape == (8,)
    assert batch.segments.tolist() == [0] * 5 + [1] * 3
    assert batch.lengths.tolist() == [5, 3]
    assert batch.labels.tolist() == [data.labels[2], data.labels[0]]
    for attention in (False, True):
        torch.manual_seed(0)
        model = demo.PackedClassifier(
            data.vocab, data.classes, dim=8, hidden=16, attention=attention
        )
        packed = model(batch.tokens, batch.segments, batch.lengths)
        alone = [
            model(tokens, torch.zeros(len(tokens), dtype=torch.int64), torch.tensor([len(tokens)]))
            for tokens in (data[2][0], data[0][0])
        ]
        # Packing must not let sequences see each other: same logits as one at a time.
        torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-6)


def test_labels_are_learnable_from_token_content():
    data = demo.PackedTokens(np.full(400, 64), seed=0)
    band = data.vocab // data.classes
    guesses = [
        int(np.bincount(data[i][0].numpy() // band, minlength=data.classes).argmax())
        for i in range(len(data))
    ]
    assert np.mean(np.array(guesses) == np.array(data.labels)) > 0.9


def test_cost_model_matches_the_model():
    assert demo.cost_model_for("linear", 128, 512).to_tuple() == (0.0, 1.0, 0.0)
    assert demo.cost_model_for("quadratic", 128, 512).to_tuple() == (0.0, 768.0, 1.0)
    with pytest.raises(ValueError, match="linear"):
        demo.cost_model_for("cubic", 128, 512)


def test_fit_cost_recovers_the_coefficients_despite_disturbed_measurements():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 2048, size=(200, 16)).astype(float)
    rows = np.column_stack(
        [np.full(200, 16.0), lengths.sum(axis=1), (lengths**2).sum(axis=1), np.zeros(200)]
    )
    true = demo.CostModel(2e-4, 5e-6, 1.2e-8)
    rows[:, 3] = demo.predict(true, rows) * np.exp(0.02 * rng.standard_normal(200))
    rows[:10, 3] *= 1.8  # steps another process disturbed
    cost, quality = demo.fit_cost(rows)
    assert cost.b == pytest.approx(true.b, rel=0.15) and cost.c == pytest.approx(true.c, rel=0.05)
    assert quality["kept"] <= 190 and quality["rms_error"] < 0.03
    with pytest.raises(ValueError, match="at least 2"):
        demo.fit_cost(rows[:1])


def test_calibration_batches_mix_random_and_similar_lengths():
    lengths = demo.make_lengths(1024, seed=1)
    batches = demo.calibration_batches(lengths, 16, 8, seed=0, rank=1)
    assert len(batches) == 8 and all(len(set(b.tolist())) == 16 for b in batches)
    again = demo.calibration_batches(lengths, 16, 8, seed=0, rank=1)
    assert all(np.array_equal(x, y) for x, y in zip(batches, again, strict=True))
    other = demo.calibration_batches(lengths, 16, 8, seed=0, rank=0)
    assert not np.array_equal(batches[0], other[0])  # each rank its own batches
    rank_of = np.argsort(np.argsort(lengths, kind="stable"), kind="stable")
    for band in batches[1::2]:  # samples whose lengths are neighbours in sorted order
        assert np.ptp(rank_of[band]) < 64


def test_projection_simulates_the_calibrated_job_on_more_ranks():
    lengths = demo.make_lengths(1024, seed=0)
    cost = demo.CostModel(1.7e-4, 5.3e-6, 1.1e-8)
    assert demo.packed_max_tokens(lengths, 16) == 4096
    rows = demo.project(lengths, cost, 16, (2, 8))
    assert [row["world"] for row in rows] == [2, 8]
    for row in rows:
        assert row["torch_ratio"] > row["chronica_ratio"] >= 1.0
        assert row["chronica_speedup"] > 1.0 and row["packed_speedup"] > 1.0
    assert rows[1]["torch_ratio"] > rows[0]["torch_ratio"]  # more ranks, a slower slowest


def test_summary_speed_up_is_the_slowest_ranks_compute_and_matches_the_balance():
    config = demo.DemoConfig(lengths=[10] * 64, lengths_source="test", seeds=2, epochs=1)

    def record(cpu: list[list[float]], loss: float) -> dict:
        return {
            "compute_cpu": cpu,
            "predicted": cpu,
            "wall": [1.0] * len(cpu),
            "loss": loss,
            "accuracy": 0.9,
        }

    torch_seeds = [record([[1.0, 1.5], [2.0, 1.0]], 0.10), record([[1.0, 1.2]], 0.12)]
    chronica_seeds = [record([[1.2, 1.3], [1.5, 1.5]], 0.11), record([[1.1, 1.1]], 0.12)]

    def pooled(seeds: list[dict]) -> dict:
        return {
            "seeds": seeds,
            **{
                k: [row for s in seeds for row in s[k]]
                for k in ("compute_cpu", "predicted", "wall")
            },
        }

    summary = demo.summarize(
        config, {"torch": pooled(torch_seeds), "chronica": pooled(chronica_seeds)}
    )
    row = summary["samplers"]["chronica"]
    assert row["speedup"] == pytest.approx((1.5 + 2.0 + 1.2) / (1.3 + 1.5 + 1.1))
    assert row["speedup_per_seed"] == pytest.approx([3.5 / 2.8, 1.2 / 1.1])
    assert row["loss_difference"] == pytest.approx([0.01, 0.0])
    assert summary["noise"] == pytest.approx(0.0, abs=1e-12)  # measured = predicted here
    assert demo.noise_floor(0.0, 2) == 1.0
    assert demo.noise_floor(0.04, 2) == pytest.approx(1 + 0.04 / np.sqrt(np.pi), rel=0.05)
