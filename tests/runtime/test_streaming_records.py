"""RecordTable: records by global id as arrays; lookups, joins and selections keep every
record by reference, and a missing id is an error naming it."""

import numpy as np
import pytest

from chronica.runtime.streaming_records import RecordTable, objects


def test_take_returns_the_records_of_the_ids_in_the_order_asked():
    records = [{"id": i} for i in range(6)]
    table = RecordTable([40, 10, 30, 0, 50, 20], records)
    got = table.take([20, 40, 0])
    assert [r["id"] for r in got] == [5, 0, 3]
    assert got[0] is records[5]
    assert table.take([]).shape == (0,) and len(RecordTable.empty().take([])) == 0


def test_join_and_select_keep_records_by_reference():
    a = RecordTable([3, 1], ["c", "a"])
    b = RecordTable.of({7: "g", 5: "e"})
    joined = a.join(b)
    assert joined.ids.tolist() == [3, 1, 7, 5] and joined.records.tolist() == ["c", "a", "g", "e"]
    picked = joined.select([5, 9, 3])
    assert picked.ids.tolist() == [5, 3] and picked.records.tolist() == ["e", "c"]
    found, at = joined.positions([9, 1, 7])
    assert found.tolist() == [False, True, True] and joined.ids[at].tolist() == [1, 7]
    assert not RecordTable.empty().positions([4])[0].any()
    assert repr(joined) == "RecordTable(records=4)"


def test_records_that_are_sequences_stay_whole():
    records = [[1, 2], [3, 4]]
    table = RecordTable([0, 1], records)
    assert table.records.shape == (2,) and table.take([1])[0] is records[1]
    arrays = objects([np.zeros(3), np.ones(3)])
    assert arrays.shape == (2,) and objects(arrays) is arrays


def test_wrong_arguments_are_named():
    with pytest.raises(ValueError, match="as many"):
        RecordTable([1, 2], ["a"])
    with pytest.raises(KeyError, match=r"\[9\]"):
        RecordTable([1], ["a"]).take([1, 9])
