"""Pytree helpers of the JAX gradient shim: the forward pass's first-use order of parameter
leaves (``forward_order``, the priority of ``ScheduledReducer``) and optax transformations in
per-leaf form (``per_leaf``) for ``ScheduledReducer.apply``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, jaxprs_in_params

__all__ = ["PerLeaf", "forward_order", "path_name", "per_leaf"]


class PerLeaf(NamedTuple):
    """An optimizer in ``ScheduledReducer.apply``'s per-leaf form (see ``per_leaf``)."""

    init: Callable[[Any], Any]
    update: Callable[[list, list, list], tuple[list, list]]


def path_name(path: Any) -> str:
    """A leaf path as ``jax.tree_util.keystr`` writes it (strings pass unchanged).

    Args:
        path: a ``keystr`` string or a key-path tuple.

    Example::

        >>> path_name((jax.tree_util.DictKey("w"),))
        "['w']"
    """
    if isinstance(path, str):
        return path
    if isinstance(path, tuple):
        return jax.tree_util.keystr(path)
    raise TypeError(
        f"priority= entries must be leaf paths: strings as jax.tree_util.keystr writes them "
        f"(e.g. \"['layer']['w']\") or key-path tuples; got {path!r}"
    )


def forward_order(fn: Callable[..., Any], params: Any, *args: Any, **kwargs: Any) -> list[str]:
    """Leaf paths of ``params`` in the order ``fn(params, *args, **kwargs)`` first reads them.

    Traces ``fn`` once to a jaxpr (nothing is computed) and walks its equations in program
    order, descending into nested jaxprs (``jit``, ``cond`` branches, ``scan``, ``remat``,
    custom derivatives); a parameter's position is the first equation that reads it.
    Parameters the forward pass never reads follow in tree order. Paths are
    ``jax.tree_util.keystr`` strings, ready for ``ScheduledReducer(priority=...)``.

    Args:
        fn: the loss (or forward) function, taking ``params`` first.
        params: the parameter pytree.
        *args: further positional arguments of ``fn`` (a batch).
        **kwargs: keyword arguments of ``fn``.

    Example::

        >>> forward_order(loss, params, x)   # doctest: +SKIP
        ["['stem']['w']", "['stem']['b']", "['head']['w']"]
    """
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the loss (or forward) function taking params first")
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    paths = [jax.tree_util.keystr(p) for p, _ in flat]
    closed = jax.make_jaxpr(fn)(params, *args, **kwargs)
    first: dict[int, None] = {}

    def walk(jaxpr: Any, env: dict[Any, int]) -> None:
        for eqn in jaxpr.eqns:
            used = [
                (k, env[v])
                for k, v in enumerate(eqn.invars)
                if not isinstance(v, Literal) and v in env
            ]
            if all(leaf in first for _, leaf in used):
                continue
            for sub in jaxprs_in_params(eqn.params):
                # Call-like primitives pass their operands 1:1 (jit, scan, remat); cond
                # prepends the branch index: align the sub-jaxpr with the trailing operands.
                offset = len(eqn.invars) - len(sub.invars)
                if offset >= 0:
                    walk(sub, {sub.invars[k - offset]: leaf for k, leaf in used if k >= offset})
            for _, leaf in used:
                first.setdefault(leaf)

    walk(closed.jaxpr, dict(zip(closed.jaxpr.invars[: len(flat)], range(len(flat)), strict=True)))
    return [paths[i] for i in first] + [p for i, p in enumerate(paths) if i not in first]


def per_leaf(tx: Any) -> PerLeaf:
    """Adapt an optax ``GradientTransformation`` (anything with ``init(params)`` and
    ``update(updates, state, params)``) to ``ScheduledReducer.apply``'s per-leaf form.

    ``opt = per_leaf(optax.adam(1e-3)); state = opt.init(params)`` then
    ``params, state = reducer.apply(grads, params, opt.update, state)``. Each leaf keeps its
    own optax state (the state's tree has the params' tree as a prefix), so updates can run
    partition by partition. Equal to applying ``tx`` to the whole tree for transformations
    that treat leaves independently (sgd, momentum, adam, adamw, rmsprop, ...), not for ones
    that couple leaves (``clip_by_global_norm``, path-dependent masks).

    Args:
        tx: the optax ``GradientTransformation``.

    Example::

        >>> opt = per_leaf(optax.adam(1e-3))   # doctest: +SKIP
        >>> state = opt.init(params)           # doctest: +SKIP
    """
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(f"tx={tx!r} is not an optax GradientTransformation (needs init and update)")

    def init(params: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        return treedef.unflatten([tx.init(leaf) for leaf in leaves])

    def update(grads: list, params: list, states: list) -> tuple[list, list]:
        new_params, new_states = [], []
        for g, p, s in zip(grads, params, states, strict=True):
            u, s = tx.update(g, s, p)
            # As optax.apply_updates: the sum keeps the parameter's dtype.
            new_params.append(jnp.asarray(p + u).astype(jnp.asarray(p).dtype))
            new_states.append(s)
        return new_params, new_states

    return PerLeaf(init, update)
