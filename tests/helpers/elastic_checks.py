"""The exactly-once check of an elastic resume, shared by the core's elastic tests
(tests/core/test_elastic.py) and the faces' (tests/adapters/torch/test_torch_elastic.py,
tests/adapters/jax/test_jax_elastic.py)."""

from __future__ import annotations

from collections.abc import Sequence

from chronica.core import EpochPlan


def check_resume_exactly_once(
    n: int,
    consumed: Sequence[int],
    rest: Sequence[Sequence[Sequence[int]]],
    plan: EpochPlan,
    drop_last: bool,
) -> None:
    """Consumed and remainder are disjoint, cover the epoch (minus the new world's dropped
    tail) and repeat only the documented padding. ``consumed``: the samples taken before
    the state was saved; ``rest[r]``: new rank r's remaining batches; ``plan``: the resumed
    epoch's plan."""
    remainder = [i for steps in rest for batch in steps for i in batch]
    assert not set(consumed) & set(remainder)
    covered = set(consumed) | set(remainder)
    assert len(covered) == n - plan.num_dropped
    assert len(remainder) - len(set(remainder)) == plan.num_padded
    if drop_last:
        assert plan.num_padded == 0
    else:
        assert plan.num_dropped == 0 and covered == set(range(n))
