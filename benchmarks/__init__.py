"""chronica's benchmarks: one module per benchmark, run from a source checkout.

``python -m benchmarks [--quick] [--only NAME ...]`` (or ``chronica bench ...``) runs them,
stores each result in ``benchmarks/results/<name>.json`` and regenerates
``docs/benchmarks.md``; ``python -m benchmarks.report`` rebuilds the page alone from the
JSON. The list of benchmarks is ``benchmarks.catalog``. Not part of the installed package:
nothing here is imported by ``chronica``.
"""
