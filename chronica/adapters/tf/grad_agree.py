"""How the TF gradient shim's workers agree on a few numbers: ``worker_rank`` and
``agree`` (one all-reduce of a few float64 numbers over the strategy's replicas), used by
``ScheduledAllReduce``'s ``mode="auto"`` so that every worker feeds the same window to
``chronica.runtime.auto.AutoTrial``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from chronica.runtime.auto import Window

__all__ = ["agree", "agreed_window", "worker_rank"]


def worker_rank() -> int:
    """This worker's task id in the current strategy's cluster (0 without a cluster).

    Example::

        >>> worker_rank()   # doctest: +SKIP
        0
    """
    resolver = getattr(tf.distribute.get_strategy(), "cluster_resolver", None)
    return int(getattr(resolver, "task_id", None) or 0)


def agree(values: list[float], ctx: Any, strategy: Any, chief_only: bool = True) -> list[float]:
    """Rank 0's ``values`` on every worker, or (``chief_only=False``) their sum over the
    replicas: one all-reduce of a few numbers.

    Args:
        values: this replica's numbers.
        ctx: the replica context when called inside ``strategy.run``, else ``None``.
        strategy: the strategy to run the all-reduce under when ``ctx`` is ``None``.
        chief_only: send rank 0's values only (the others send zeros, so the sum is exact).

    Example::

        >>> agree([0.1, 0.2], ctx, strategy)   # doctest: +SKIP
        [0.1, 0.2]
    """
    chief = 1.0 if worker_rank() == 0 or not chief_only else 0.0
    tensor = tf.constant(values, tf.float64) * chief
    if ctx is not None:
        return [float(v) for v in ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensor).numpy()]

    def reduce() -> tf.Tensor:
        replica = tf.distribute.get_replica_context()
        return replica.all_reduce(tf.distribute.ReduceOp.SUM, tensor)

    with strategy.scope():
        out = strategy.experimental_local_results(strategy.run(reduce))[0]
    return [float(v) for v in out.numpy()]


def agreed_window(mine: Window, replicas: int, ctx: Any, strategy: Any) -> Window:
    """The mean over the replicas of their windows, as rank 0 computed it: the sum, then
    rank 0's mean, so every worker gets the same floats.

    Args:
        mine: this replica's window.
        replicas: the number of replicas in sync.
        ctx: as for ``agree``.
        strategy: as for ``agree``.

    Example::

        >>> agreed_window(Window(0.1), 2, ctx, strategy)   # doctest: +SKIP
        Window(step_time=0.1, cpu_time=0.0, after_backward=0.0, link_busy=0.0)
    """
    summed = agree(mine.values(), ctx, strategy, chief_only=False)
    return Window.agreed([agree([v / replicas for v in summed], ctx, strategy)])
