"""A keyed multiset hash of (step, item) pairs: sums of a keyed PRF modulo a prime.

``multiset_hash(items, starts, ends, first, key)`` hashes the multiset of pairs
``(first + i, items[p])`` for ``p`` in ``starts[i] .. ends[i] - 1``: ``HASH_WORDS`` words,
word ``2j`` (``2j + 1``) the sum modulo ``MODULUS`` of the high (low) 32 bits of
SipHash-2-4 under the ``j``-th 128-bit key of ``key`` of the 16-byte message
``step || item`` (little-endian int64s). Being a sum, the hash of a union of multisets is
the sum of their hashes modulo ``MODULUS``, in any order and over any split.

Why it tells multisets apart: two different multisets differ in the multiplicity ``c`` of
some pair, ``0 < |c| < MODULUS`` when both hold fewer than ``MODULUS`` pairs; with the key
drawn uniformly after both were fixed, that pair's PRF words are (up to SipHash being a
PRF) uniform and independent of the rest, so each word of the two hashes agrees with
probability at most ``1/MODULUS + 2**-32`` and all ``HASH_WORDS`` with at most ``2**-250``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["HASH_WORDS", "KEY_WORDS", "MODULUS", "multiset_hash", "siphash24"]

# The largest prime below 2**32: every word and the sum of 2**16 of them fit an int64.
MODULUS = 4294967291
KEY_WORDS = 8  # four SipHash keys of two 64-bit words
HASH_WORDS = 8  # two words (high and low 32 bits) per SipHash output

_V0 = np.uint64(0x736F6D6570736575)
_V1 = np.uint64(0x646F72616E646F6D)
_V2 = np.uint64(0x6C7967656E657261)
_V3 = np.uint64(0x7465646279746573)
_LENGTH = np.uint64(16 << 56)  # the final block of a 16-byte message: its length, no bytes
_FF = np.uint64(0xFF)
_LOW = np.uint64(0xFFFFFFFF)
_P = np.uint64(MODULUS)


@njit(cache=True, inline="always")
def _rotl(x: np.uint64, b: int) -> np.uint64:
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@njit(cache=True, inline="always")
def _rounds(
    v0: np.uint64, v1: np.uint64, v2: np.uint64, v3: np.uint64, n: int
) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:
    for _ in range(n):
        v0 += v1
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 += v3
        v3 = _rotl(v3, 16) ^ v2
        v0 += v3
        v3 = _rotl(v3, 21) ^ v0
        v2 += v1
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True)
def siphash24(k0: np.uint64, k1: np.uint64, m0: np.uint64, m1: np.uint64) -> np.uint64:
    """SipHash-2-4 (Aumasson and Bernstein, 2012) under the key ``k0 || k1`` of the
    16-byte message ``m0 || m1`` (each word little-endian).

    Args:
        k0: the key's first 64-bit word.
        k1: the key's second 64-bit word.
        m0: the message's first word.
        m1: the message's second word.

    Example::

        >>> h = siphash24(np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4))
        >>> h == siphash24(np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4))
        True
    """
    v0, v1, v2, v3 = k0 ^ _V0, k1 ^ _V1, k0 ^ _V2, k1 ^ _V3
    for m in (m0, m1, _LENGTH):
        v3 ^= m
        v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, 2)
        v0 ^= m
    v2 ^= _FF
    v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, 4)
    return v0 ^ v1 ^ v2 ^ v3


@njit(cache=True)
def _hash_kernel(
    items: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    first: np.uint64,
    key: np.ndarray,
    out: np.ndarray,
) -> None:
    for i in range(starts.shape[0]):
        step = first + np.uint64(i)
        for p in range(starts[i], ends[i]):
            item = np.uint64(items[p])
            for j in range(KEY_WORDS // 2):
                h = siphash24(key[2 * j], key[2 * j + 1], step, item)
                out[2 * j] = (out[2 * j] + (h >> np.uint64(32)) % _P) % _P
                out[2 * j + 1] = (out[2 * j + 1] + (h & _LOW) % _P) % _P


def multiset_hash(
    items: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: int, key: np.ndarray
) -> np.ndarray:
    """The hash (module docstring) of the pairs ``(first + i, items[starts[i]:ends[i]])``
    under ``key`` (``KEY_WORDS`` 64-bit words): ``HASH_WORDS`` int64 in ``[0, MODULUS)``.

    Args:
        items: the items of every step, step after step.
        starts: where every step's items start in ``items``.
        ends: where they end.
        first: the number of the first step.
        key: ``KEY_WORDS`` 64-bit words (any 8-byte integer dtype).

    Example::

        >>> key = np.arange(KEY_WORDS, dtype=np.uint64)
        >>> a = multiset_hash(np.array([5, 7]), np.array([0]), np.array([2]), 3, key)
        >>> b = multiset_hash(np.array([7, 5]), np.array([0]), np.array([2]), 3, key)
        >>> bool((a == b).all())  # a multiset: the order within a step does not count
        True
    """
    out = np.zeros(HASH_WORDS, np.uint64)
    _hash_kernel(
        np.ascontiguousarray(items, np.int64),
        np.ascontiguousarray(starts, np.int64),
        np.ascontiguousarray(ends, np.int64),
        np.uint64(first),
        np.ascontiguousarray(key).view(np.uint64),
        out,
    )
    return out.astype(np.int64)
