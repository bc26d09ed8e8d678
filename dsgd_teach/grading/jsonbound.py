"""Bound a JSON text before anything parses it: its size, nesting depth, and number of containers and elements.

`check` counts over the bytes with every string blanked out (one regular-expression pass and a few `bytes.count`
calls, no Python object per token), so a text holding millions of empty objects is refused at the cost of one
copy of itself instead of the gigabytes a parser would build. What passes can be parsed into a bounded number of
objects: at most `max_containers` dicts and lists and about `max_elements` items in them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class TooLarge(ValueError):
    """The text breaks one of the bounds; the message says which."""


@dataclass(frozen=True)
class Bounds:
    """The largest JSON text a reader accepts: bytes, dicts and lists, items (commas), nesting depth."""

    max_bytes: int
    max_containers: int
    max_elements: int
    max_depth: int


def check(data: bytes, bounds: Bounds, what: str = "the text") -> None:
    """Raise TooLarge unless data is within bounds (strings count as one element whatever their length)."""
    if len(data) > bounds.max_bytes:
        raise TooLarge(f"{what} is larger than {_size(bounds.max_bytes)}")
    bare = _STRING.sub(b'""', data)
    containers = bare.count(b"{") + bare.count(b"[")
    if containers > bounds.max_containers:
        raise TooLarge(f"{what} holds more than {bounds.max_containers:,} JSON objects and arrays")
    if bare.count(b",") > bounds.max_elements:
        raise TooLarge(f"{what} holds more than {bounds.max_elements:,} JSON elements")
    depth = 0
    for byte in bare.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        if depth > bounds.max_depth:
            raise TooLarge(f"{what} is nested more than {bounds.max_depth} levels deep")


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n:,} bytes"
