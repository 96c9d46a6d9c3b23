"""The key-value store of TensorFlow's coordination service, for the ranks' agreement.

With ``kind="dynamic"`` the ranks vote on every window (``chronica.runtime.agreement``);
under ``MultiWorkerMirroredStrategy`` (started from ``TF_CONFIG``) they vote over the store
TensorFlow's coordination service already runs, so no other channel is opened.
"""

from __future__ import annotations

import os

from chronica.runtime.agreement import KeyValueStore

__all__ = ["coordination_store"]


def coordination_store(world: int) -> KeyValueStore | None:
    """The ``(set, get, delete)`` calls of TensorFlow's coordination service, when
    ``TF_CONFIG`` started one; ``None`` otherwise.

    Args:
        world: the replicas that vote; a cluster of another number of tasks is an error.

    Raises ``ValueError`` when the cluster's task count differs from ``world``.

    Example::

        >>> coordination_store(2) is None  # outside a TF_CONFIG cluster
        True
    """
    if not os.environ.get("TF_CONFIG"):
        return None
    from tensorflow.python.eager import context

    ctx = context.context()
    service = ctx.coordination_service
    if not service:
        return None
    tasks = sum(job.num_tasks for job in service.coordinated_job_list)
    if tasks and tasks != world:
        raise ValueError(
            f"num_replicas={world} differs from the {tasks} tasks of the TensorFlow cluster "
            f"(TF_CONFIG); kind='dynamic' needs one replica per worker"
        )

    def get(key: str, timeout_ms: int) -> str:
        return ctx.get_config_key_value(key, timeout_in_ms=timeout_ms)

    return ctx.set_config_key_value, get, ctx.delete_config_key_value
