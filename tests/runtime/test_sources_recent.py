"""RecentlyUsed: the last values by count or by weight, shared between threads, copied
empty."""

import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

from chronica.runtime.sources.recent import RecentlyUsed


def test_recently_used_keeps_the_last_values_and_copies_empty():
    recent: RecentlyUsed[int] = RecentlyUsed(2)
    made = []
    for key in ("a", "b", "a", "c", "b"):
        recent.get(key, lambda k=key: made.append(k) or len(made))
    assert made == ["a", "b", "c", "b"] and len(recent) == 2  # "b" was dropped for "c"
    assert len(pickle.loads(pickle.dumps(recent))) == 0
    with ThreadPoolExecutor(4) as pool:  # shared between threads
        values = list(pool.map(lambda i: recent.get(i % 3, lambda: i % 3), range(300)))
    assert values == [i % 3 for i in range(300)] and len(recent) == 2
    with pytest.raises(ValueError, match="capacity=0"):
        RecentlyUsed(0)


def test_recently_used_by_weight_keeps_the_last_values_under_the_capacity():
    rows: RecentlyUsed[list[int]] = RecentlyUsed(5, weight=len)
    for key, size in (("a", 2), ("b", 2), ("a", 2), ("c", 1), ("d", 9)):
        rows.get(key, lambda n=size: [0] * n)
        if key == "c":
            assert sorted(rows._items) == ["a", "b", "c"]  # 5 rows
    assert list(rows._items) == ["d"]  # over the capacity alone: still kept
    copy = pickle.loads(pickle.dumps(rows))
    assert len(copy) == 0 and repr(copy) == "RecentlyUsed(capacity=5, weight=len, kept=0)"
    copy.get("e", lambda: [1, 2, 3])
    copy.get("f", lambda: [1, 2, 3])
    assert list(copy._items) == ["f"]
    with pytest.raises(TypeError, match="weight=3"):
        RecentlyUsed(5, weight=3)
