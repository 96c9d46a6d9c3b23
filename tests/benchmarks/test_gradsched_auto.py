"""benchmarks.gradsched's auto target, read from a result built here (no run, no timing): the
best fixed setting, auto over it round by round, the noise figure, the simulator's error,
each target's verdict, the page section, and the knobs of the fixed settings."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.grad_models import GRID, knobs_for  # noqa: E402
from benchmarks.grad_sim_validation import SCHEDULED_WARM, probe_steps  # noqa: E402
from benchmarks.gradsched import (  # noqa: E402
    AUTO_TARGET,
    PROBE_ROUNDS,
    SIM_DEFAULT,
    auto_rows,
    auto_table,
    probe_pairs,
    record_auto_target,
    render_markdown,
    simulated_setting,
    steady_steps,
)
from benchmarks.gradsched_paired import paired_to_best  # noqa: E402

QUANTITIES = ("variants", "cpu", "thread", "faults")


def model_result(ratios: dict[str, list[float]], ddp_s: float = 0.4) -> dict:
    """One model's rounds: DDP at ``ddp_s`` every round, each variant at ``ratios`` of it."""
    rounds = len(next(iter(ratios.values())))
    out: dict = {q: {"DDP": [ddp_s] * rounds} for q in QUANTITIES}
    out["ddp"] = {q: {} for q in QUANTITIES}
    for variant, values in ratios.items():
        for q in QUANTITIES:
            out[q][variant] = [ddp_s * r for r in values]
            out["ddp"][q][variant] = [ddp_s] * rounds
    out |= {"compute": [0.3], "comm": [0.38], "auto_warm_blocks": 11}
    out["stats"] = {"chronica auto": {"decision": "scheduled: it won", "setting": "s"}}
    out["sim"] = {"variant": "scheduled 256 KiB", "predicted": 0.90}
    return out


RATIOS = {
    "DDP again": [1.01, 0.99, 1.02],
    "chronica auto": [0.81, 0.83, 0.82],
    "scheduled 256 KiB": [0.80, 0.80, 0.80],
    "scheduled 1 MiB": [0.90, 0.92, 0.91],
    "scheduled 4 MiB": [0.97, 0.95, 0.96],
}


def result(ratios=RATIOS) -> dict:
    machine = {"processor": "x", "cpu_count": 2, "torch": "2", "date_utc": "today"}
    models = {"vgg": model_result(ratios)}
    return {
        "target": "auto",
        "machine": machine,
        "load_average": [[1.0] * 3, [2.0] * 3],
        "repeats": 3,
        "steps": 4,
        "command": "sudo python -m benchmarks.gradsched --target auto",
        "links": [{"link": "100mbit", "rate": "100mbit", "models": models}],
    }


def test_rows_find_the_best_fixed_setting_and_judge_every_target():
    (row,) = auto_rows(result())
    assert row["best"] == "scheduled 256 KiB" and row["best_ratio"] == pytest.approx(0.80)
    assert row["to_best"] == pytest.approx(np.median([0.81, 0.83, 0.82]) / 0.80)
    assert row["within_3"] and row["paired"] == pytest.approx(0.82 / 0.80)  # 1.025
    assert row["paired_picks"] == ["scheduled 256 KiB"] * 3
    assert row["speedup"] == pytest.approx(1 / 0.82)
    assert row["not_worse"] and row["noise"] >= 0.01
    assert row["sim_error"] == pytest.approx(0.90 / 0.80 - 1)
    assert "scheduled 256 KiB" in auto_table(result())


def test_the_links_bound_is_all_gradients_at_the_fitted_bandwidth_over_ddps_step(tmp_path):
    run = result()
    model = run["links"][0]["models"]["vgg"]
    model["param_bytes"], model["sim"]["bandwidth"] = 4_000_000, 12_500_000.0  # 320 ms
    (row,) = auto_rows(run)
    assert row["link_bound"] == pytest.approx(0.32 / 0.4)
    page = render_markdown(run, tmp_path)
    assert "| 0.800 | 1.250x |" in page and "the link's bound allows at most vgg 1.250x" in page
    assert "Settings outside the search" in page


def test_ddp_is_the_best_fixed_setting_when_no_schedule_beats_it():
    slow = {**RATIOS, **{v: [1.1, 1.1, 1.1] for v in GRID}, "chronica auto": [1.0, 1.0, 1.0]}
    (row,) = auto_rows(result(slow))
    assert row["best"] == "DDP" and row["within_3"] and row["to_best"] == pytest.approx(1.0)


def test_page_section_states_targets_decisions_and_the_command(tmp_path):
    page = render_markdown(result(), tmp_path)
    assert page.startswith('## Gradient scheduling: `mode="auto"` against the best fixed')
    assert "sudo python -m benchmarks.gradsched --target auto" in page
    assert "- 100mbit, vgg: scheduled: it won" in page
    assert (
        "| 100mbit | vgg | scheduled 256 KiB | 0.900 | 0.800 [0.800, 0.800] | +12.5% | **no** |"
        in page
    )
    assert "the same round's block of the best fixed setting" in page  # how it is computed
    assert "| 1.025 [1.012, 1.037] (scheduled 256 KiB) | yes" in page  # paired, judged against
    kept = result()
    kept["links"][0]["models"]["vgg"]["stats"]["chronica auto"]["setting"] = (
        "scheduled (256 KiB partitions, 1 MiB credit)"
    )
    assert "(auto kept that same setting)" in render_markdown(kept, tmp_path)
    assert "(auto kept that same setting)" not in page


def test_paired_figure_judges_each_round_against_the_setting_the_other_rounds_chose():
    # 256 KiB is lucky in rounds 0 and 1, 1 MiB in rounds 2 and 3: chosen on all rounds,
    # either is 0.80 and auto (0.80 every round) reads 1.0 over the luckier minimum. Left
    # out, a round is judged against the setting the other rounds chose, never on its own
    # luck: round 0 against 1 MiB (0.70 over rounds 1-3), and so on.
    ratios = {
        **RATIOS,
        "DDP again": [1.0] * 4,
        "scheduled 256 KiB": [0.70, 0.70, 0.90, 0.90],
        "scheduled 1 MiB": [0.90, 0.90, 0.70, 0.70],
        "scheduled 4 MiB": [0.95] * 4,
        "chronica auto": [0.80] * 4,
    }
    (row,) = auto_rows(result(ratios))
    assert row["paired_picks"] == ["scheduled 1 MiB"] * 2 + ["scheduled 256 KiB"] * 2
    assert row["paired"] == pytest.approx(0.80 / 0.90) and row["within_3"]
    assert row["to_best"] == pytest.approx(0.80 / 0.80)  # the old figure, beside it
    with pytest.raises(ValueError, match="one block per round"):
        paired_to_best([1.0], {"DDP": [1.0, 1.0]}, [1.0])
    assert paired_to_best([0.5], {"DDP": [1.0]}, [1.0])["ratio"] == 0.5  # one round: itself


def test_auto_over_best_is_the_quotient_of_the_two_figures_the_table_shows():
    # round by round the quotients are 1.0, 1.171, 1.0, 1.0 (median 1.0), while the figures
    # the table shows are auto 0.81 and best 0.79 (medians over rounds against DDP)
    ratios = {
        **RATIOS,
        "chronica auto": [0.80, 0.82, 0.90, 0.78],
        "scheduled 256 KiB": [0.80, 0.70, 0.90, 0.78],
        "DDP again": [1.0] * 4,
        "scheduled 1 MiB": [0.9] * 4,
        "scheduled 4 MiB": [0.95] * 4,
    }
    (row,) = auto_rows(result(ratios))
    assert row["best"] == "scheduled 256 KiB" and row["best_ratio"] == pytest.approx(0.79)
    assert row["to_best"] == pytest.approx(0.81 / 0.79)
    low, high = row["to_best_interval"]
    assert low <= row["to_best"] <= high


def test_page_says_what_ran_beside_the_run(tmp_path):
    quiet = {**result(), "quiet": True, "machine_state": "a job ran for 4 minutes"}
    quiet["started_utc"] = "dawn"
    page = render_markdown(quiet, tmp_path)
    assert "with nothing else running" in page and "a job ran for 4 minutes" in page
    assert "dawn to today" in page
    assert "shared with other work" in render_markdown(result(), tmp_path)
    assert set(AUTO_TARGET) >= set(GRID)


def test_fixed_settings_cut_as_auto_cuts_them():
    model = torch.nn.Linear(512, 512)  # 1 MiB + 2 KiB of gradients
    total = 4 * (512 * 512 + 512)
    assert knobs_for("scheduled 256 KiB", model) == {
        "mode": "scheduled",
        "partition_bytes": 256 << 10,
        "credit_bytes": 1 << 20,
    }
    assert knobs_for("scheduled 4 MiB", model)["partition_bytes"] == total
    assert knobs_for("scheduled 4 MiB", model)["credit_bytes"] == 4 * total
    assert knobs_for("DDP", model) == {}
    assert knobs_for("scheduled 256 KiB (credit 8)", model)["credit_bytes"] == 8 * (256 << 10)


def test_probed_runs_measure_steps_past_the_scheduled_engines_replans():
    from chronica.runtime.gradients import PLAN_STEPS

    # The first step discovers the priority; the engine re-plans (draining the link) after
    # its first scheduled step and from the medians of its first PLAN_STEPS: the warm-up half
    # must hold all of them.
    assert SCHEDULED_WARM >= 1 + PLAN_STEPS
    for steps in (1, 3, 6, 20):
        count = probe_steps(steps)
        assert count // 2 >= SCHEDULED_WARM and count - count // 2 >= steps


def test_the_simulators_probe_measures_the_rounds_steps(tmp_path):
    # Blocks of the rounds' own runners, DDP and the best setting alternating first as the
    # rounds' pairs do, each block without its first step (nothing in flight before it).
    pairs = probe_pairs("scheduled 1 MiB", PROBE_ROUNDS)
    assert len(pairs) == PROBE_ROUNDS >= 4
    assert [p[0] for p in pairs[:2]] == ["DDP", "scheduled 1 MiB"]
    assert all(set(p) == {"DDP", "scheduled 1 MiB"} for p in pairs)
    block = {"forward": [[9.0, 9.0], [1.0, 2.0]], "backward": [[0.0], [3.0]], "update": [5, 1]}
    assert steady_steps(block) == {"forward": [[1.0, 2.0]], "backward": [[3.0]], "update": [1]}
    run = result()
    run["links"][0]["models"]["vgg"]["sim"] |= {"probed": 0.81, "probe_blocks": PROBE_ROUNDS}
    page = render_markdown(run, tmp_path)
    assert f"The probe: {PROBE_ROUNDS} pairs of blocks of the rounds' own models" in page


def test_record_keeps_an_auto_run_beside_the_main_results(tmp_path):
    path = tmp_path / "gradsched.json"
    path.write_text('{"links": [], "command": "main"}')
    record_auto_target(result(), path)
    kept = json.loads(path.read_text())
    assert kept["command"] == "main" and kept["auto_target"] == result()
    with pytest.raises(ValueError, match="target auto"):
        record_auto_target({**result(), "target": None}, path)


def test_the_simulated_setting_is_chosen_without_the_rounds():
    # auto's kept setting where it kept one of the grid, else the shim's default setting
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    assert simulated_setting("scheduled (256 KiB partitions, 1 MiB credit)", model) == (
        "scheduled 256 KiB"
    )
    assert simulated_setting("scheduled (4 MiB partitions, 16 MiB credit)", model) == (
        "scheduled 4 MiB"
    )
    assert simulated_setting("bucketed", model) == SIM_DEFAULT == "scheduled 1 MiB"
    assert simulated_setting("scheduled (512 KiB partitions, 2 MiB credit)", model) == SIM_DEFAULT
