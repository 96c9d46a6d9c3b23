"""``chronica demo``: the real 2-process run end to end (quick configuration), and its parts.

No timing is asserted: the machine running the tests may be slow or busy.
"""

import os
import re
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


def test_quick_demo_trains_with_both_samplers_and_prints_the_table(capsys):
    before = _children()
    assert demo.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if re.match(r"(torch|chronica)\s+\d", line)
    }
    for name in ("torch", "chronica"):
        assert name in rows, out
        # measured mean/worst, predicted mean/worst: per-step max/mean ratios are >= 1
        ratios = [float(x) for x in rows[name][1:5]]
        assert all(r >= 1.0 for r in ratios), out
    predicted_torch, predicted_chronica = float(rows["torch"][3]), float(rows["chronica"][3])
    assert predicted_chronica <= predicted_torch, out  # sizes-only: deterministic, not timing
    assert re.search(r"^speed-up .*: \d+\.\d+x$", out, re.MULTILINE), out
    assert set(_children()) <= set(before)  # no rank left behind


def test_demo_with_an_emulated_slow_rank_runs_the_dynamic_sampler(capsys):
    before = _children()
    assert demo.main(["--quick", "--no-progress", "--speeds", "1,0.5", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^dynamic\s+\d", out, re.MULTILINE), out
    assert "rank speeds 1,0.5" in out
    assert re.search(r"^speed-up of dynamic .*: \d+\.\d+x$", out, re.MULTILINE), out
    assert set(_children()) <= set(before)


def test_timeout_stops_every_rank_and_reports_it(capsys):
    before = _children()
    assert demo.main(["--quick", "--no-progress", "--timeout", "0.5"]) == 1
    assert "did not finish within" in capsys.readouterr().err
    assert set(_children()) <= set(before)


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
