"""The shape every chronica message has, checked on the raw bytes before msgpack decodes
them: one map of at most ``MAX_ENTRIES`` entries, string keys, scalar values (nil, bool,
int, float, str, bin). No message holds an array or a nested map, so a value that is one
is refused at its first byte: a frame of nested containers (each within msgpack's limits,
hundreds of thousands deep) costs the check a few header reads, never work or memory
proportional to its size.
"""

from __future__ import annotations

__all__ = ["MAX_ENTRIES", "flat_map_problem"]

# The most entries a message map has (a packed plan has 13); more is no chronica message.
MAX_ENTRIES = 32

# What each first byte of a msgpack item is: (bytes of header before any length field,
# bytes of the length field (0: the item has a fixed size, the header), whether a string).
# Containers, ext types and the unused byte are absent: no chronica message holds them.
_ITEMS: dict[int, tuple[int, int, bool]] = {}
for _byte in range(0x00, 0x80):  # positive fixint
    _ITEMS[_byte] = (1, 0, False)
for _byte in range(0xE0, 0x100):  # negative fixint
    _ITEMS[_byte] = (1, 0, False)
for _byte in (0xC0, 0xC2, 0xC3):  # nil, false, true
    _ITEMS[_byte] = (1, 0, False)
for _byte, _size in ((0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9)):
    _ITEMS[_byte] = (_size, 0, False)  # float32/64, uint8..64
for _byte, _size in ((0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
    _ITEMS[_byte] = (_size, 0, False)  # int8..64
for _byte, _width in ((0xC4, 1), (0xC5, 2), (0xC6, 4)):  # bin8/16/32
    _ITEMS[_byte] = (1, _width, False)
for _byte, _width in ((0xD9, 1), (0xDA, 2), (0xDB, 4)):  # str8/16/32
    _ITEMS[_byte] = (1, _width, True)
_FIXSTR = range(0xA0, 0xC0)

_NAMES = {
    **dict.fromkeys(range(0x80, 0x90), "a map"),
    **dict.fromkeys(range(0x90, 0xA0), "an array"),
    0xDC: "an array",
    0xDD: "an array",
    0xDE: "a map",
    0xDF: "a map",
    0xC1: "the unused byte 0xc1",
}


def flat_map_problem(frame: bytes | bytearray | memoryview) -> str | None:
    """What keeps ``frame`` from being one flat msgpack map, or ``None`` when it is one.

    Reads only the map's header and each entry's header (at most ``2 · MAX_ENTRIES`` of
    them), whatever the frame's size: a container or an ext value is named at its first
    byte, before anything is decoded.

    Args:
        frame: a message's bytes.

    Example::

        >>> import msgpack
        >>> flat_map_problem(msgpack.packb({"v": 3, "t": "fetch"})) is None
        True
        >>> flat_map_problem(msgpack.packb({"v": [[[]]]}))
        "field 'v' holds an array; no chronica message nests containers"
    """
    data = memoryview(frame).cast("B")
    size = data.nbytes
    if size == 0:
        return "an empty message"
    first = data[0]
    if 0x80 <= first <= 0x8F:
        entries, at = first & 0x0F, 1
    elif first == 0xDE and size >= 3:
        entries, at = int.from_bytes(data[1:3], "big"), 3
    else:
        return "a message must be a msgpack map"
    if entries > MAX_ENTRIES:
        return f"a map of {entries} entries; a message has at most {MAX_ENTRIES}"
    key = ""
    for item in range(2 * entries):
        if at >= size:
            return "the message ends inside its map"
        byte = data[at]
        is_key = item % 2 == 0
        if byte in _FIXSTR:
            header, length, text = 1, byte & 0x1F, True
        else:
            kind = _ITEMS.get(byte)
            if kind is None:
                what = _NAMES.get(byte, "an ext value")
                where = "a key" if is_key else f"field {key!r}"
                return f"{where} holds {what}; no chronica message nests containers"
            header, width, text = kind
            if width:
                if at + 1 + width > size:
                    return "the message ends inside a header"
                length = int.from_bytes(data[at + 1 : at + 1 + width], "big")
                header += width
            else:
                length = 0
        if is_key:
            if not text:
                return "map keys must be strings"
            key = bytes(data[at + header : at + header + min(length, 64)]).decode(
                "utf-8", "replace"
            )
        at += header + length
    if at > size:
        return "the message ends inside a value"
    if at < size:
        return f"{size - at} bytes follow the message's map"
    return None
