"""Run every benchmark, store the results as JSON and regenerate ``docs/benchmarks.md``.

    PYTHONPATH=. python benchmarks/run_all.py            # full mode (several minutes)
    PYTHONPATH=. python benchmarks/run_all.py --quick    # under 5 minutes on 2 cores

Each benchmark module exposes ``run(quick) -> dict`` and ``format_table(result)``; its result
goes to ``benchmarks/results/<name>.json`` (with the mode and the machine added). The page
and its plots are then rebuilt from every JSON file in that folder (so ``--only planning``
keeps the last balance results on the page). Modules in ``SECTIONS`` also write their own
section of the page with ``render_markdown(result, img_dir)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

__all__ = ["BENCHMARKS", "SECTIONS", "main"]

HERE = Path(__file__).resolve().parent
# Modules that render their own section of the page, in page order.
SECTIONS = ("dynamic", "hetero_run", "adapters", "gradsched")
BENCHMARKS = ("balance", "planning", "movement", "quality", *SECTIONS)


def _prepare_imports() -> None:
    """Make the sibling modules importable, and chronica from this checkout if needed."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    if importlib.util.find_spec("chronica") is None:
        sys.path.insert(0, str(HERE.parent))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks named by ``--only`` (default: all); return 1 only with ``--strict``
    when a balance target fails."""
    parser = argparse.ArgumentParser(prog="run_all.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fast mode (< 5 min on 2 cores)")
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this one (repeatable)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the real lengths files (default: ../shared/data next to the repository)",
    )
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument(
        "--strict", action="store_true", help="exit with 1 when a balance target fails"
    )
    args = parser.parse_args(argv)
    _prepare_imports()
    report = importlib.import_module("report")
    common = importlib.import_module("common")

    args.results_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    for name in args.only or BENCHMARKS:
        module = importlib.import_module(name)
        print(f"== {name} ({'quick' if args.quick else 'full'})", flush=True)
        started = time.perf_counter()
        if name == "balance":
            result = module.run(args.quick, data_dir=args.data_dir)
        else:
            result = module.run(args.quick)
        result.setdefault("mode", "quick" if args.quick else "full")
        result.setdefault("machine", common.machine_info())
        print(module.format_table(result))
        if name == "balance":
            lines = module.check_targets(result)
            print("\n".join(lines))
            failed = not result["all_targets_hold"]
        path = args.results_dir / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(path)
        print(f"-> {path} ({time.perf_counter() - started:.0f} s)", flush=True)

    page = report.render(report.load_results(args.results_dir), args.docs_dir, sections=SECTIONS)
    print(f"-> {page}")
    if failed:
        print("some balance targets FAIL (see above and the Targets section of the page)")
    return 1 if (failed and args.strict) else 0


if __name__ == "__main__":
    raise SystemExit(main())
