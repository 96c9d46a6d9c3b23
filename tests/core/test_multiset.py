"""The keyed multiset hash: SipHash-2-4 against its published test vector and a pure-Python
reference, the kernel's sums against the reference's, and what a multiset hash must do."""

from __future__ import annotations

import numpy as np

from chronica.core.multiset import HASH_WORDS, KEY_WORDS, MODULUS, multiset_hash, siphash24

MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _sipround(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def siphash_reference(key: bytes, message: bytes) -> int:
    """SipHash-2-4 as its paper specifies it, for any message length."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D]
    v += [k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    tail = len(message) % 8
    blocks = [message[i : i + 8] for i in range(0, len(message) - tail, 8)]
    last = message[len(message) - tail :] + bytes(7 - tail) + bytes([len(message) & 0xFF])
    for block in [*blocks, last]:
        m = int.from_bytes(block, "little")
        v[3] ^= m
        _sipround(v)
        _sipround(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        _sipround(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def hash_reference(pairs: list[tuple[int, int]], key: list[int]) -> list[int]:
    """The multiset hash of ``pairs`` (step, item) under ``key`` (unsigned 64-bit words)."""
    out = [0] * HASH_WORDS
    for step, item in pairs:
        message = step.to_bytes(8, "little") + item.to_bytes(8, "little")
        for j in range(KEY_WORDS // 2):
            k = key[2 * j].to_bytes(8, "little") + key[2 * j + 1].to_bytes(8, "little")
            h = siphash_reference(k, message)
            out[2 * j] = (out[2 * j] + (h >> 32)) % MODULUS
            out[2 * j + 1] = (out[2 * j + 1] + (h & 0xFFFFFFFF)) % MODULUS
    return out


def test_reference_matches_the_published_vector():
    # The SipHash paper's appendix A: key 00..0f, message 00..0e.
    assert siphash_reference(bytes(range(16)), bytes(range(15))) == 0xA129CA6149BE45E5


def test_kernel_matches_the_reference():
    rng = np.random.default_rng(0)
    for _ in range(20):
        k0, k1, m0, m1 = (int(x) for x in rng.integers(0, 1 << 63, 4, dtype=np.uint64) * 2 + 1)
        key = k0.to_bytes(8, "little") + k1.to_bytes(8, "little")
        message = m0.to_bytes(8, "little") + m1.to_bytes(8, "little")
        got = siphash24(np.uint64(k0), np.uint64(k1), np.uint64(m0), np.uint64(m1))
        assert int(got) == siphash_reference(key, message)


def _key(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(1 << 63), 1 << 63, KEY_WORDS, dtype=np.int64)


def test_multiset_hash_matches_the_reference():
    key = _key(1)
    items = np.array([5, 3, 3, 900, 0, 7, 2**40])
    starts, ends = np.array([0, 3, 3]), np.array([3, 3, 7])
    got = multiset_hash(items, starts, ends, 11, key)
    pairs = [(11, 5), (11, 3), (11, 3), (13, 900), (13, 0), (13, 7), (13, 2**40)]
    assert got.tolist() == hash_reference(pairs, [int(w) & MASK for w in key])
    assert got.dtype == np.int64 and ((got >= 0) & (got < MODULUS)).all()


def test_it_is_a_multiset_hash():
    """Order and split do not matter, sums add up modulo the prime, and any change of the
    multiset (a repeat, a swap between steps, a missing item) changes every word."""
    key = _key(2)
    items = np.arange(40) * 3
    whole = multiset_hash(items, np.array([0, 20]), np.array([20, 40]), 4, key)
    shuffled = np.concatenate([items[:20][::-1], np.roll(items[20:], 5)])
    assert (multiset_hash(shuffled, np.array([0, 20]), np.array([20, 40]), 4, key) == whole).all()
    halves = [
        multiset_hash(items, np.array([0, 20]), np.array([8, 31]), 4, key),
        multiset_hash(items, np.array([8, 31]), np.array([20, 40]), 4, key),
    ]
    assert ((halves[0] + halves[1]) % MODULUS == whole).all()
    changed = [items.copy() for _ in range(3)]
    changed[0][1] = changed[0][0]  # a repeat (and a missing item)
    changed[1][[0, 20]] = changed[1][[20, 0]]  # two items swapped between steps
    changed[2] = changed[2][:-1]
    for other in changed:
        ends = np.array([20, other.shape[0]])
        assert (multiset_hash(other, np.array([0, 20]), ends, 4, key) != whole).all()
    assert (multiset_hash(items, np.array([0, 20]), np.array([20, 40]), 4, _key(3)) != whole).all()
