"""Deterministic randomness keyed by (seed, epoch, stream), identical on every platform.

chronica does not use numpy's or a framework's generators for decisions: their algorithms may
change between releases. Everything random is derived from SplitMix64 (Steele, Lea and Flood,
2014), a 64-bit integer mixer whose output depends only on integer arithmetic, so every rank,
adapter and release computes the same bytes for the same key.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["Stream", "derive_key", "permutation", "uniform_at", "uniforms"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


class Stream:
    """Names of the independent random streams drawn for one (seed, epoch).

    Example::

        >>> key = derive_key(seed=0, epoch=3, stream=Stream.ORDER)
    """

    ORDER = 1  # the epoch's sample permutation
    JITTER = 2  # size jitter that varies step composition between epochs (pool, guided)
    STEPS = 3  # the order of steps (pool, guided)
    PARTITION = 4  # the fixed pre-shuffle that base partitions are cut from
    EXCHANGE = 5  # which samples of each partition are exchanged (partial)
    DEAL = 6  # where exchanged samples go (partial)
    SPEED = 7  # emulated rank speeds of drifting heterogeneity profiles


@njit(cache=True)
def _mix64(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def derive_key(seed: int, epoch: int, stream: int, *more: int) -> np.uint64:
    """The 64-bit key of one stream (``more`` tells apart sub-streams, e.g. one per
    partition); any integer seed is accepted (taken modulo 2**64).

    Args:
        seed: the run's seed.
        epoch: the epoch.
        stream: one of ``Stream``'s names.
        more: sub-stream numbers (e.g. a partition's).

    Example::

        >>> derive_key(0, 1, Stream.ORDER) == derive_key(0, 1, Stream.ORDER)
        True
    """
    key = np.uint64(seed & _MASK64)
    for part in (epoch, stream, *more):
        key = _mix64(np.uint64((int(key) + int(_GOLDEN) * (part + 1)) & _MASK64))
    return key


@njit(cache=True)
def _permutation_into(out: np.ndarray, key: np.uint64) -> None:
    # Fisher-Yates with unbiased bounded draws (rejection of the top partial range).
    n = out.shape[0]
    for i in range(n):
        out[i] = i
    state = key
    top = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(n - 1, 0, -1):
        bound = np.uint64(i + 1)
        while True:
            state += _GOLDEN
            r = _mix64(state)
            v = r % bound
            if r - v <= top - (bound - np.uint64(1)):
                break
        j = np.int64(v)
        tmp = out[i]
        out[i] = out[j]
        out[j] = tmp


def permutation(n: int, key: np.uint64, out: np.ndarray | None = None) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` (int64) fixed by ``key``; written into
    ``out`` (any integer dtype that holds ``n``, length ``n``) when given, else returned.

    Args:
        n: the permuted count, ``>= 0``.
        key: the stream's key (``derive_key``).
        out: an integer buffer of length ``n``, or ``None``.

    Example::

        >>> sorted(permutation(5, derive_key(1, 0, Stream.ORDER)).tolist())
        [0, 1, 2, 3, 4]
    """
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    if out is None:
        out = np.empty(int(n), dtype=np.int64)
    elif out.shape != (n,):
        raise ValueError(f"out has shape {out.shape}; it must hold n={n} entries")
    _permutation_into(out, np.uint64(key))
    return out


@njit(cache=True)
def uniform_at(key: np.uint64, i: int) -> float:
    """Element ``i`` of ``uniforms(n, key)``, for numba kernels that draw one at a time.

    Args:
        key: the stream's key as ``numpy.uint64`` (a Python int would be compiled as a
            signed integer and draw other numbers).
        i: the element's position.

    Example::

        >>> key = np.uint64(derive_key(0, 0, Stream.JITTER))
        >>> bool(uniform_at(key, 2) == uniforms(3, key)[2])
        True
    """
    r = _mix64(key + _GOLDEN * np.uint64(i + 1))
    return np.float64(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)  # 2**-53


@njit(cache=True, nogil=True)
def _uniforms_kernel(n: int, key: np.uint64) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        out[i] = uniform_at(key, i)
    return out


def uniforms(n: int, key: np.uint64) -> np.ndarray:
    """``n`` floats uniform on [0, 1) fixed by ``key``; element i depends only on (key, i).

    Args:
        n: how many.
        key: the stream's key.

    Example::

        >>> values = uniforms(4, derive_key(0, 0, Stream.JITTER))
        >>> bool(((values >= 0) & (values < 1)).all())
        True
    """
    return _uniforms_kernel(int(n), np.uint64(key))
