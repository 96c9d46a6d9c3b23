"""Run every benchmark, store the results as JSON and regenerate ``docs/benchmarks.md``.

    python -m benchmarks                          # full mode (tens of minutes)
    python -m benchmarks --quick                  # under 5 minutes on 2 cores
    chronica bench [--quick] [--only NAME ...]    # the same, from a source checkout

Run it from the repository root: ``python -m`` puts the current folder first on the path,
so both ``benchmarks`` and ``chronica`` are that checkout's. ``chronica bench`` finds the
checkout from where its ``chronica`` was imported (an editable install) and calls ``main``.
The benchmarks are listed in ``benchmarks.catalog``; each module exposes ``run(quick) ->
dict`` and ``format_table(result)``; its result goes to ``benchmarks/results/<name>.json``
with the mode, the machine, the command that reproduces it and the wall time added. The
page and its plots are then rebuilt from every JSON file in that folder (so ``--only
planning`` keeps the last balance results on the page). Modules in ``SECTIONS`` also write
their own section of the page with ``render_markdown(result, img_dir)``.

A benchmark that fails (or whose module is missing) is reported and skipped: the others
still run, its previous JSON stays as it was, and the exit status is 1. Progress goes to
stdout and to the ``chronica`` logger; on a terminal, a bar over the benchmarks is drawn on
stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from benchmarks.catalog import (
    BENCHMARKS,
    DATA_DIR_BENCHMARKS,
    PAGE_SECTIONS,
    load,
    reproduce_command,
)
from benchmarks.common import machine_info

__all__ = ["main"]

logger = logging.getLogger("chronica")

HERE = Path(__file__).resolve().parent
DESCRIPTION = (
    "Run the benchmarks, store each result as JSON and regenerate docs/benchmarks.md "
    "with its plots."
)
EPILOG = """\
benchmarks, in run order:
  {names}

examples:
  chronica bench --quick                       every benchmark, quick settings
  chronica bench --only scaling --only planning
  chronica bench --quick --only dynamic --results-dir /tmp/r --docs-dir /tmp/d
                                               leave the committed results and page alone

`chronica --log-level INFO bench ...` also logs each benchmark's start and end (and the
scaling points) through the "chronica" logger.

Each results JSON records "mode", "machine", "command" (how to reproduce it) and
"wall_seconds". gradsched shapes a veth pair in network namespaces when run as root
(both modes) and falls back to unshaped loopback otherwise.
"""


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG.format(names=", ".join(BENCHMARKS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats and smaller problems: every benchmark together in under 5 "
        "minutes on 2 cores (default: full mode, the settings behind the published page)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        metavar="NAME",
        help="run only this benchmark (repeatable; default: all). NAME is one of: "
        + ", ".join(BENCHMARKS),
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the real lengths files used by balance, packing and lockstep (default: "
        "../shared/data "
        "next to the repository)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=HERE / "results",
        help="where each benchmark's <name>.json is written, and the page is built from "
        "(default: benchmarks/results)",
    )
    parser.add_argument(
        "--docs-dir",
        type=Path,
        default=HERE.parent / "docs",
        help="where benchmarks.md is written, with its plots in DOCS_DIR/img (default: docs)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit with 1 when a balance target fails"
    )
    return parser


def _run_one(name: str, args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Run benchmark ``name``; its result (mode, machine, command added) and extra lines."""
    module = load(name)
    if name in DATA_DIR_BENCHMARKS:
        result = module.run(args.quick, data_dir=args.data_dir)
    elif name == "simulate":  # calibrates on the hetero_run result beside it
        result = module.run(args.quick, results_dir=args.results_dir)
    else:
        result = module.run(args.quick)
    result.setdefault("mode", "quick" if args.quick else "full")
    result.setdefault("machine", machine_info())
    result.setdefault("command", reproduce_command(name, args.quick, args.data_dir))
    lines = [module.format_table(result)]
    if name == "balance":
        lines += module.check_targets(result)
    return result, lines


def main(argv: list[str] | None = None, prog: str = "chronica bench") -> int:
    """Run the benchmarks named by ``--only`` (default: all), store their JSON and rebuild
    the page. Returns 1 when a benchmark failed, or with ``--strict`` when a balance target
    fails; else 0.

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).
        prog: the program name the help and usage messages show.

    Example::

        >>> main(["--quick", "--only", "planning", "--docs-dir", "/tmp/docs"])  # doctest: +SKIP
        0
    """
    args = _parser(prog).parse_args(argv)
    from tqdm import tqdm

    from benchmarks import report  # matplotlib: only once the arguments are good

    names = list(dict.fromkeys(args.only or BENCHMARKS))
    mode = "quick" if args.quick else "full"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(
        total=len(names),
        file=sys.stderr,
        unit="benchmark",
        disable=not sys.stderr.isatty(),
        dynamic_ncols=True,
    )

    def say(text: str) -> None:
        if bar.disable:
            print(text, flush=True)
        else:
            tqdm.write(text, file=sys.stdout)

    targets_failed = False
    crashed: list[str] = []
    timings: dict[str, float] = {}
    started_all = time.perf_counter()
    logger.info("chronica bench: %d benchmark(s), %s mode: %s", len(names), mode, names)
    try:
        for i, name in enumerate(names, start=1):
            bar.set_description(name)
            say(
                f"== [{i}/{len(names)}] {name} ({mode}), "
                f"{_clock(time.perf_counter() - started_all)} elapsed"
            )
            logger.info("chronica bench: [%d/%d] %s started", i, len(names), name)
            started = time.perf_counter()
            try:
                result, lines = _run_one(name, args)
            except Exception:
                seconds = time.perf_counter() - started
                logger.exception("chronica bench: %s failed after %.0f s", name, seconds)
                say(f"-> {name} FAILED after {seconds:.0f} s (its previous JSON is kept)")
                crashed.append(name)
                bar.update()
                continue
            seconds = time.perf_counter() - started
            timings[name] = seconds
            result["wall_seconds"] = seconds
            say("\n".join(lines))
            if name == "balance":
                targets_failed = not result["all_targets_hold"]
            path = args.results_dir / f"{name}.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(result, indent=1))
            tmp.replace(path)
            say(f"-> {path} ({seconds:.0f} s; {_clock(time.perf_counter() - started_all)} elapsed)")
            logger.info("chronica bench: %s done in %.1f s", name, seconds)
            bar.update()
    finally:
        bar.close()

    total = time.perf_counter() - started_all
    if len(timings) > 1:
        say(
            "times: "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
            + f"; total {_clock(total)}"
        )
    results = report.load_results(args.results_dir)
    if results:
        page = report.render(results, args.docs_dir, sections=PAGE_SECTIONS)
        say(f"-> {page}")
    logger.info("chronica bench: finished in %.1f s (%d failed)", total, len(crashed))
    if crashed:
        say(f"FAILED: {', '.join(crashed)} (see the log above)")
    if targets_failed:
        say("some balance targets FAIL (see above and the Targets section of the page)")
    return 1 if crashed or (targets_failed and args.strict) else 0
