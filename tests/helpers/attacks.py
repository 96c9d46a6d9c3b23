"""The registry of attack tests: ``@attack(outcome, what)`` on a test that attacks chronica.

``outcome`` is what the test shows: ``"held"`` (the attack gains nothing: training, coverage
and the coordinator carry on as if it did not happen) or ``"degraded"`` (training goes on
with exactly-once coverage, but the attack costs something: static plans for some windows,
slower steps, ranks saying hello again). ``what`` is one line for SECURITY.md's table.

``tests/comm/test_security.py::test_the_attack_table_is_current`` finds every decorated
test under ``tests/`` (by reading the source, so no test module needs importing) and checks
that SECURITY.md's table lists exactly them, with the counts it states. To add an attack:
decorate its test, then add its row to the table and update the counts.
"""

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

OUTCOMES = ("held", "degraded")


def attack(outcome: str, what: str) -> Callable[[F], F]:
    """Mark a test as an attack with its ``outcome`` (see the module docstring)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome={outcome!r} must be one of {OUTCOMES}")
    if not what or "|" in what or "\n" in what:
        raise ValueError("what must be one line without '|' (it is a table cell)")

    def mark(test: F) -> F:
        test.attack = (outcome, what)  # type: ignore[attr-defined]
        return test

    return mark
