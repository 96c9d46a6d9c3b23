"""Progress bars for long work: planning a large epoch shows a tqdm bar on stderr.

The core plans without I/O and reports progress through a callback
(``Scheduler.plan_epoch(epoch, progress=...)``); this module turns that into a bar where a
person watches: only on a terminal, only for epochs of at least ``LARGE_EPOCH`` samples, and
only once planning has taken longer than ``delay`` seconds (a cached plan never shows one).
"""

from __future__ import annotations

from typing import IO

from tqdm import tqdm

from chronica.core.checks import check_int, check_number
from chronica.core.plan import EpochPlan
from chronica.core.scheduler import Scheduler

__all__ = ["LARGE_EPOCH", "plan_epoch"]

# About half a second of planning on one core; smaller epochs plan too fast for a bar.
LARGE_EPOCH = 5_000_000


def plan_epoch(
    scheduler: Scheduler,
    epoch: int,
    *,
    min_samples: int = LARGE_EPOCH,
    delay: float = 0.5,
    file: IO[str] | None = None,
    disable: bool | None = None,
) -> EpochPlan:
    """``scheduler.plan_epoch(epoch)``, with a progress bar over its steps while it runs.
    The plan is the same bytes either way; a plan the scheduler already holds returns at
    once, without a bar.

    Args:
        scheduler: the scheduler that plans.
        epoch: the epoch to plan.
        min_samples: data sets smaller than this plan without a bar.
        delay: seconds of planning before the bar appears (tqdm's ``delay``).
        file: where the bar is written (default stderr).
        disable: as tqdm's: ``None`` shows the bar on a terminal only, ``False`` always.

    Example::

        >>> plan = plan_epoch(scheduler, 3)  # a bar on stderr if planning takes > 0.5 s
    """
    check_int("min_samples", min_samples, 0)
    check_number("delay", delay, 0.0, hint=" (seconds)")
    # A held plan returns at once: no bar to set up (samplers ask for it every step).
    if scheduler.sizes.shape[0] < min_samples or scheduler.has_plan(epoch):
        return scheduler.plan_epoch(epoch)
    with tqdm(
        desc=f"chronica: planning epoch {epoch}",
        unit="step",
        file=file,
        delay=delay,
        disable=disable,
        leave=False,
    ) as bar:

        def advance(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return scheduler.plan_epoch(epoch, progress=advance)
