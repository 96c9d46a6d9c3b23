"""Turn the benchmark JSON into ``docs/benchmarks.md`` and the PNG plots in ``docs/img/``.

Everything in the page comes from the JSON files, so the page can be regenerated without
rerunning anything: ``python -m benchmarks.report`` (reads ``benchmarks/results/*.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.catalog import PAGE_SECTIONS, REPRODUCE, load

__all__ = ["load_results", "render"]

HERE = Path(__file__).resolve().parent
# Floor of the log axes: a ratio of exactly 1.0 has no logarithm.
LOG_FLOOR = 1e-6
# Floor of the movement plot's log axis, in samples: 0 moved samples are drawn there.
MOVE_FLOOR = 1
PEER_NOTES = {
    "torch": "the real `torch.utils.data.DistributedSampler` (shuffle, seed, `set_epoch`), each "
    "rank's stream cut into local batches of B/W as a `DataLoader` does.",
    "upstream": "upstream Chronica 0.2.6 `static`, re-implemented: per step, each rank's B/W "
    "slots are filled one at a time with the remaining sample of the whole epoch pool whose "
    "cost is nearest to what the rank still lacks of round(mean cost · B/W); the steps are "
    "then shuffled. Changes step composition.",
    "flatflow": "FlatFlow's scheduler for identical machines, re-implemented from its source "
    "(`flatflow/scheduler`): the whole epoch pool, sorted by cost, is split into steps·W "
    "micro-batches of equal count by the Balanced Largest Differencing Method, micro-batches "
    "are shuffled (runs of equal cost kept together) and dealt W per step. One micro-batch "
    "per rank per step. Changes step composition.",
    "hf": "the partition shape of Hugging Face transformers' `BatchRebalanceSampler` "
    "(transformers pull request #47340, from its description): each global batch sorted "
    "by cost and cut into W contiguous groups of varying size. transformers balances a "
    "padded cost with an iterative loop; here the cut minimises the largest summed cost "
    "exactly, the best this shape can score on this metric. Ranks get unequal sample counts "
    "(the gradient then needs per-rank weights), so it is outside the equal-count targets.",
    "lpt": "within each global batch (the exact mode's batches): descending cost, each "
    "sample to the least-loaded rank with room left (equal counts).",
    "exact": '`ScheduleConfig(kind="static", exact=True)`: torch\'s global batches, each split '
    "between ranks by the numba kernel (LPT, then swap refinement).",
    "pool": '`ScheduleConfig(kind="static", exact=False)`: LPT over the whole epoch into '
    "equal-count local batches, local batches of similar cost grouped into steps.",
    "guided": '`ScheduleConfig(kind="guided")`: samples of similar cost share a step '
    "(sorted with seeded jitter), each step balanced.",
    "bound": "max(mean rank cost, largest sample cost)/mean of the global batches of the exact "
    "mode (and of torch and the within-batch methods): no split of those batches does better.",
    "bound_k": "max(mean, largest + (k-1) smallest)/mean on the same batches: the rank that "
    "holds the largest sample holds k-1 more, so no equal-count split does better "
    "(information, not a target).",
}
TRACE_STYLE = {
    "torch": ("tab:red", "-"),
    "upstream": ("tab:orange", "-"),
    "flatflow": ("tab:purple", "-"),
    "hf": ("tab:brown", "--"),
    "lpt": ("tab:gray", "-"),
    "exact": ("tab:blue", "-"),
    "pool": ("tab:cyan", "--"),
    "guided": ("tab:green", "--"),
}


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every ``<name>.json`` in ``results_dir``, keyed by name."""
    return {
        path.stem: json.loads(path.read_text()) for path in sorted(Path(results_dir).glob("*.json"))
    }


def _fmt(value: float | None, digits: int = 5) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _plot_balance(result: dict, path: Path) -> None:
    cases = [c for c in result["cases"] if not c.get("skipped")]
    methods = list(result["methods"].items())
    keys = [k for k, _ in methods]
    cols = 2
    rows = -(-len(cases) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(11, 2.5 * rows), squeeze=False, sharex=True, sharey=True
    )
    for ax, case in zip(axes.ravel(), cases, strict=False):
        means = [max(case["methods"][k]["mean"] - 1, LOG_FLOOR) for k in keys]
        worsts = [max(case["methods"][k]["worst"] - 1, LOG_FLOOR) for k in keys]
        colors = [TRACE_STYLE.get(k, ("black", "-"))[0] for k in keys]
        y = range(len(keys))
        ax.barh(y, means, color=colors, alpha=0.8, label="mean over steps")
        ax.scatter(worsts, y, color="black", marker="|", s=120, zorder=3, label="worst step")
        ax.set_xscale("log")
        ax.set_xlim(LOG_FLOOR, 100)
        ax.set_title(case["name"], fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_yticks(list(range(len(keys))))
    axes[0, 0].set_yticklabels([label for _, label in methods])
    axes[0, 0].invert_yaxis()
    for ax in axes.ravel()[len(cases) :]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.supxlabel("per-step max/mean rank cost − 1  (log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_trace(result: dict, path: Path) -> None:
    trace = result["trace"]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for key, (color, style) in TRACE_STYLE.items():
        values = [max(v - 1, LOG_FLOOR) for v in trace["ratio"][key]]
        ax.plot(
            range(len(values)), values, style, color=color, lw=1.2, label=result["methods"][key]
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(f"max/mean rank cost − 1 (log; {LOG_FLOOR:g} = exactly 1)")
    ax.set_title(f"{trace['case']}: every step of epoch {trace['epoch']}, seed {trace['seed']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_movement(result: dict, path: Path) -> None:
    """Samples moved per epoch, per policy and W: both splits as bars, analytic as ticks."""
    sizes = result["world_sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.8), sharey=True)
    axes = list(axes) if len(sizes) > 1 else [axes]
    for ax, w in zip(axes, sizes, strict=True):
        cases = [c for c in result["cases"] if c["num_replicas"] == w]
        y = list(range(len(cases)))
        for offset, split, color, name in (
            (-0.2, "unbalanced", "tab:red", "batch_size=None (torch split)"),
            (0.2, "balanced", "tab:blue", "balanced, exact, B=32·W"),
        ):
            values = [max(c[split]["samples"], MOVE_FLOOR) for c in cases]
            ax.barh([i + offset for i in y], values, height=0.4, color=color, alpha=0.8, label=name)
        analytic = [max(c["balanced"]["analytic_samples"], MOVE_FLOOR) for c in cases]
        ax.scatter(analytic, y, color="black", marker="|", s=200, zorder=3, label="analytic")
        ax.set_xscale("log")
        ax.set_xlim(MOVE_FLOOR / 2, result["num_samples"] * 2)
        ax.set_title(f"W={w} nodes", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].set_yticks(list(range(len(result["policies"]))))
    axes[0].set_yticklabels(list(result["policies"].values()))
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper center", ncol=3)
    fig.supxlabel(
        f"samples fetched per epoch, all nodes (log; 0 is drawn at {MOVE_FLOOR}), "
        f"N={result['num_samples']:,}"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_quality(result: dict, path: Path) -> None:
    """Test accuracy per policy: mean ± std bars and every seed as a dot."""
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.4))
    y = range(len(rows))
    ax.barh(
        y,
        [row["mean"] for row in rows],
        xerr=[row["std"] for row in rows],
        color="tab:blue",
        alpha=0.7,
        capsize=4,
    )
    for i, row in enumerate(rows):
        ax.scatter(row["accuracy"], [i] * len(row["accuracy"]), color="black", s=8, zorder=3)
    ax.set_yticks(list(y))
    ax.set_yticklabels([row["label"] for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("test accuracy (bar: mean ± std over seeds; dots: seeds)")
    ax.set_title(
        f"digits, W={result['num_replicas']} emulated ranks, B={result['batch_size']}, "
        f"{result['epochs']} epochs, {len(result['seeds'])} seeds"
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine(info: dict) -> list[str]:
    return [
        f"- date: {info['date_utc']}",
        f"- CPU: {info['processor']} ({info['cpu_count']} logical cores), {info['machine']}",
        f"- OS: {info['platform']}",
        f"- Python {info['python']}, numpy {info['numpy']}, numba {info['numba']}, "
        f"torch {info['torch']}",
    ]


def _balance_section(result: dict, img: str) -> list[str]:
    out = [
        "## Balance",
        "",
        f"Mode `{result['mode']}`: seeds {result['seeds']} × epochs {result['epochs']} per "
        f"case ({result['seconds']:.0f} s). Every figure is the **median over those "
        "repeats**. *mean* is the per-step max/mean rank cost averaged over the epoch's "
        "steps, *worst* its largest step, *padding* the share of padded local batches that "
        "is padding when each sample is padded to the longest of its local batch. 1.00000 "
        "is perfect balance. Costs: `linear` = size, `quadratic` = size². Lognormal data "
        f"are integer sizes drawn with seed {result['data_seed']}.",
        "",
        f"![balance per case]({img}/balance.png)",
        "",
        f"![every step of one epoch]({img}/balance_steps.png)",
        "",
    ]
    for case in result["cases"]:
        out.append(
            f"### {case['name']}: {case['label']}, W={case['num_replicas']}, "
            f"B={case['batch_size']}, {case['cost']} cost"
        )
        out.append("")
        if case.get("skipped"):
            out += [f"Skipped: {case['skipped']}.", ""]
            continue
        out += [
            f"{case['num_samples']} samples, {case['num_steps']} steps per epoch.",
            "",
            "| method | mean | worst | padding |",
            "|---|---:|---:|---:|",
        ]
        for key, label in result["methods"].items():
            m = case["methods"][key]
            out.append(
                f"| {label} | {_fmt(m['mean'])} | {_fmt(m['worst'])} | {_fmt(m['padding'], 3)} |"
            )
        out.append("")
    return out


def _targets_section(result: dict) -> list[str]:
    out = [
        "## Targets",
        "",
        "Checked on every case; a failure is reported here, never hidden by changing the metric.",
        "",
        "- **exact ≈ bound**: chronica exact's mean within 0.1% of the exact bound's mean "
        "(median over repeats; the worst repeat and the gap to the equal-count bound are "
        "shown for information);",
        "- **exact ≤ LPT**: chronica exact's mean and worst no worse than sorted LPT on the "
        "same global batches, in every repeat (steps where LPT is better are counted);",
        "- **pool/guided ≥ peers**: chronica pool and guided at least as good as upstream "
        "Chronica and FlatFlow, mean and worst (medians).",
        "",
        "Reading the first column: the exact bound, max(mean, largest sample)/mean, ignores "
        "that every rank gets the same number of samples. When a step's largest sample plus "
        "the k-1 smallest ones (k = samples per rank) outweighs the mean rank load, no "
        "equal-count split reaches it; the equal-count bound accounts for that, and the gap "
        "to it (second figure) is the part of the gap a better split could still close.",
        "",
        "| case | exact ≈ bound: gap (worst repeat); gap to equal-count bound (worst) | "
        "exact ≤ LPT | "
        "pool ≥ upstream | pool ≥ FlatFlow | guided ≥ upstream | guided ≥ FlatFlow |",
        "|---|---|---|---|---|---|---|",
    ]
    failures = 0
    for case in result["cases"]:
        if case.get("skipped"):
            continue
        ch = case["checks"]

        def mark(check: dict) -> str:
            return "pass" if check["ok"] else "**FAIL**"

        bound = ch["exact_within_0.1pct_of_bound"]
        lpt = ch["exact_not_worse_than_lpt"]
        cells = [
            f"{mark(bound)} {bound['median_gap']:.3%} ({bound['worst_gap']:.3%}); "
            f"{bound['median_gap_to_equal_count_bound']:.3%} "
            f"({bound['worst_gap_to_equal_count_bound']:.3%})",
            f"{mark(lpt)} (LPT better on {lpt['steps_where_lpt_is_better']}"
            f"/{lpt['steps_total']} steps)",
        ]
        for mode in ("pool", "guided"):
            for peer in ("upstream", "flatflow"):
                check = ch[f"{mode}_at_least_{peer}"]
                failing = ", ".join(check["failing"])
                cells.append(mark(check) + (f" ({failing})" if failing else ""))
        failures += sum(not c["ok"] for c in ch.values())
        out.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    out += ["", f"{failures} failed check(s)." if failures else "All targets hold.", ""]
    return out


def _movement_section(result: dict, img: str) -> list[str]:
    n = result["num_samples"]
    out = [
        "## Data movement and label skew",
        "",
        f"Mode `{result['mode']}`: N={n:,} lognormal(5,1) sizes (seed {result['data_seed']}), "
        f"{result['bytes_per_token']} bytes per token, {result['num_classes']} random classes "
        f"(seed {result['label_seed']}); median over epochs {result['epochs']} "
        f"({result['seconds']:.0f} s). *Moved* is `chronica.core.movement`: the samples "
        "every node trains on in an epoch and does not hold, summed over nodes. A node "
        "holds its own partition under `local`/`partial`, otherwise what it trained on the "
        "previous epoch. Here every rank is a node (no `groups`). *Analytic*: f·N(1−1/W), "
        "f = 1 for policies that reshuffle everything, q for `partial(q)`, 0 for `local` and "
        "`none`; *ratio* = measured/analytic. Each policy is planned with "
        "`batch_size=None` (each rank takes torch's strided share of the order) and "
        f"balanced (exact mode, B={result['per_rank_batch']}·W), which moves samples "
        "between the ranks of a global batch by size. *Skew* is `chronica.core.label_skew` "
        "of the balanced plan: the Jensen–Shannon divergence (base 2, 0 = same label "
        "frequencies as the data set) of every global batch and of every node's epoch share.",
        "",
        "Reading the `block` rows: when the block size is a multiple of W and the blocks are "
        "full, torch's strided split gives rank r the samples whose index is r modulo W in "
        "every epoch, only in another order, so with `batch_size=None` nothing moves; "
        "balancing reassigns samples within each global batch and restores full movement.",
        "",
        f"![movement per policy]({img}/movement.png)",
        "",
        "| W | policy | moved, torch split | moved, balanced | analytic | ratio, torch split "
        "| ratio, balanced | MB moved, balanced | skew, batches | skew, nodes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in result["cases"]:
        un, bal = case["unbalanced"], case["balanced"]
        cells = [
            str(case["num_replicas"]),
            case["label"],
            f"{un['samples']:,.0f}",
            f"{bal['samples']:,.0f}",
            f"{bal['analytic_samples']:,.0f}",
            _fmt(un["ratio"], 4),
            _fmt(bal["ratio"], 4),
            f"{bal['bytes'] / 1e6:.1f}",
            f"{bal['batch_skew']:.4f}",
            f"{bal['node_skew']:.5f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    bal = result["balance"]
    out += [
        "",
        f"### Balance of partitioned data sets (W={bal['num_replicas']}, B={bal['batch_size']})",
        "",
        "Per-step max/mean rank cost (median over the same epochs) of `local` plans, whose "
        "ranks can only train on their node's partition, next to the unpartitioned `global` "
        "policy on the same sizes in the same run. With one node of 4 ranks, balancing "
        "happens among the node's 4 ranks; with one node per rank, exact mode has nothing to "
        "exchange within a step, and only pool mode (`exact=False`, which picks which of a "
        "rank's samples share a step) can even out the steps.",
        "",
        "| plan | mean | worst |",
        "|---|---:|---:|",
    ]
    for row in bal["rows"]:
        out.append(f"| {row['label']} | {_fmt(row['mean'])} | {_fmt(row['worst'])} |")
    out.append("")
    return out


def _quality_section(result: dict, img: str) -> list[str]:
    out = [
        "## Training quality by shuffle policy",
        "",
        f"Mode `{result['mode']}` ({result['seconds']:.0f} s): scikit-learn's digits, "
        f"{result['num_train']:,} training images (= {result['num_replicas']} ranks × "
        f"{result['num_train'] // result['num_replicas']}, so every plan covers each image "
        f"exactly once, which the benchmark checks) and {result['num_test']} test images "
        f"(split seed {result['split_seed']}). The training set is **sorted by label**, so "
        "contiguous partitions are label-skewed. "
        f"W={result['num_replicas']} data-parallel ranks are emulated: each step, the union "
        f"of the ranks' local batches (global batch B={result['batch_size']}) updates one "
        f"model ({result['model']}) with its mean gradient, as synchronous data-parallel SGD "
        f"does. Test accuracy after {result['epochs']} epochs, mean ± std (sample std) over "
        f"seeds {result['seeds']} (the seed sets the initial weights and chronica's seed). "
        "*Skew* is the mean Jensen–Shannon divergence of label frequencies (base 2) of the "
        "global batches and of the ranks' epoch shares, averaged over epochs and seeds.",
        "",
        "Reading the table: with synchronous updates the model only sees the global batch, "
        "and under `local` every global batch takes B/W samples from every rank's "
        "partition, so its label frequencies stay close to the data set's even when each "
        "partition holds one or two classes (compare the two skew columns). `none` on "
        "label-sorted data feeds whole runs of one class and fails. Methods that act on a "
        "rank's local batch alone (batch normalisation, local SGD, asynchronous updates) are "
        "not covered by this emulation.",
        "",
        f"![accuracy per policy]({img}/quality.png)",
        "",
        "| policy | test accuracy | min–max over seeds | skew, global batches | skew, ranks |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        out.append(
            f"| {row['label']} | {row['mean']:.4f} ± {row['std']:.4f} | "
            f"{min(row['accuracy']):.4f}–{max(row['accuracy']):.4f} | "
            f"{row['batch_skew']:.4f} | {row['node_skew']:.4f} |"
        )
    out.append("")
    return out


def render(
    results: dict[str, dict],
    docs_dir: Path,
    img_dir: Path | None = None,
    sections: tuple[str, ...] = (),
) -> Path:
    """Write the plots and ``benchmarks.md`` into ``docs_dir`` (plots into ``img_dir``,
    default ``docs_dir/img``); returns the page's path. ``sections`` name benchmark modules
    whose ``render_markdown(result, img_dir)`` writes their own part, appended in order."""
    docs_dir = Path(docs_dir)
    img_dir = docs_dir / "img" if img_dir is None else Path(img_dir)
    img_dir.mkdir(parents=True, exist_ok=True)
    img = Path(img_dir).resolve().relative_to(docs_dir.resolve()).as_posix()
    modes = sorted({r["mode"] for r in results.values()})
    quick = " --quick" if modes == ["quick"] else ""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json; "
        "do not edit by hand. -->",
        "",
        "How evenly chronica spreads each step's work over the ranks, next to the samplers "
        "people use today, how long planning an epoch takes, and what the shuffle policies "
        "cost in data movement and training quality. The balance metric: in each step, the "
        "cost of the slowest rank over the mean rank cost (a rank's cost is the sum of its "
        "samples' costs), so 1.00 means no rank waits; a synchronous step "
        "lasts as long as its slowest rank.",
        "",
        "Reproduce (from the repository root; the real lengths files are read from "
        "`../shared/data`, or `--data-dir DIR`; the `bench` extra adds what the quality "
        "benchmark needs):",
        "",
        "```sh",
        'pip install -e ".[torch,tf,jax,dev,bench]"',
        f"{REPRODUCE}{quick}        # or: chronica bench{quick}",
        "```",
        "",
        "`benchmarks` is a package of the source checkout, not of the installed `chronica`: "
        "`python -m benchmarks --only NAME` reruns one benchmark (`--help` lists them), "
        "`python -m benchmarks.report` rebuilds this page from the JSON alone, and "
        "`chronica bench ARGS` runs `python -m benchmarks ARGS` of the checkout its "
        "`chronica` is installed from (editable install); installed from a wheel, it stops "
        "and says so.",
        "",
        f"Mode{'s' if len(modes) > 1 else ''}: {', '.join(modes)}. "
        "`--quick` runs fewer repeats and plans N=1,000,000 instead of 10,000,000.",
        "",
        "Machine:",
        "",
    ]
    first = next(iter(results.values()))
    lines += _machine(first["machine"]) + [""]
    if "balance" in results:
        balance = results["balance"]
        _plot_balance(balance, img_dir / "balance.png")
        if balance.get("trace"):
            _plot_trace(balance, img_dir / "balance_steps.png")
        lines += _targets_section(balance)
        lines += _balance_section(balance, img)
        lines += [
            "## The methods",
            "",
            "Every method balances the same per-sample cost (size for `linear`, size² for "
            "`quadratic`); the peers are re-implemented in `benchmarks/peers.py` from their "
            "published descriptions and source, except torch's sampler, which is the real one.",
            "",
        ]
        for key, label in balance["methods"].items():
            lines.append(f"- **{label}**: {PEER_NOTES[key]}")
        lines.append("")
    if "planning" in results:  # the module renders its own section
        lines += [load("planning").render_markdown(results["planning"], img_dir)]
    if "movement" in results:
        _plot_movement(results["movement"], img_dir / "movement.png")
        lines += _movement_section(results["movement"], img)
    if "quality" in results:
        _plot_quality(results["quality"], img_dir / "quality.png")
        lines += _quality_section(results["quality"], img)
    for name in sections:
        if name in results:
            lines += [load(name).render_markdown(results[name], img_dir)]
    page = docs_dir / "benchmarks.md"
    page.write_text("\n".join(lines))
    return page


def main(argv: list[str] | None = None) -> int:
    """Regenerate the page and plots from the JSON already on disk."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    args = parser.parse_args(argv)
    results = load_results(args.results_dir)
    if not results:
        raise SystemExit(f"no JSON results in {args.results_dir}; run python -m benchmarks")
    print(render(results, args.docs_dir, sections=PAGE_SECTIONS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
