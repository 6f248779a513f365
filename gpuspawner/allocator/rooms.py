"""Entries kept in order of room (pure): one short sorted list per room value.

The index keeps thousands of (room, ...) entries in order (shared devices by
room, hosts by their k-th largest room). In one sorted list each change
moves half the list; here rooms are whole milli-shares (at most 1000
values), so a change touches one room's short list, and the room values
themselves are a list of at most 1000 that changes only when a room's list
empties or starts.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

__all__ = ["Rooms", "first_of"]


class Rooms:
    """(room, key) entries in order of room, then key; equal when their entries are."""

    __slots__ = ("by_room", "values")

    def __init__(self) -> None:
        self.by_room: dict[int, list[Any]] = {}  # room -> its keys, sorted
        self.values: list[int] = []  # the rooms that have keys, sorted

    def add(self, room: int, key: Hashable) -> None:
        keys = self.by_room.get(room)
        if keys is None:
            self.by_room[room] = [key]
            bisect.insort(self.values, room)
        else:
            bisect.insort(keys, key)

    def remove(self, room: int, key: Hashable) -> bool:
        """Take the entry out; True when none are left."""
        keys = self.by_room[room]
        if len(keys) == 1:
            del self.by_room[room]
            del self.values[bisect.bisect_left(self.values, room)]
            return not self.values
        del keys[bisect.bisect_left(keys, key)]
        return False

    def move(self, old: int, new: int, key: Hashable) -> None:
        """The key's room went from ``old`` to ``new`` (both with an entry)."""
        by_room = self.by_room
        keys = by_room[old]
        if len(keys) == 1:
            del by_room[old]
            del self.values[bisect.bisect_left(self.values, old)]
        else:
            del keys[bisect.bisect_left(keys, key)]
        to = by_room.get(new)
        if to is None:
            by_room[new] = [key]
            bisect.insort(self.values, new)
        else:
            bisect.insort(to, key)

    def largest(self) -> int:
        """The largest room (0: no entries)."""
        return self.values[-1] if self.values else 0

    def first(self, least: int) -> tuple[int, Any] | None:
        """The entry of least room ≥ ``least`` (then least key), or None."""
        values = self.values
        i = bisect.bisect_left(values, least)
        if i == len(values):
            return None
        room = values[i]
        return room, self.by_room[room][0]

    def starting(self, least: int) -> Iterator[tuple[int, Any]]:
        """The entries of room ≥ ``least``, in order."""
        values = self.values
        by_room = self.by_room
        for i in range(bisect.bisect_left(values, least), len(values)):
            room = values[i]
            for key in by_room[room]:
                yield room, key

    def __bool__(self) -> bool:
        return bool(self.values)

    def __len__(self) -> int:
        return sum(map(len, self.by_room.values()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rooms) and self.by_room == other.by_room

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Rooms({[e for e in self.starting(0)]!r})"


def first_of(many: Iterable[Rooms], least: int) -> tuple[int, Any] | None:
    """The least (room, key) with room ≥ ``least`` over several :class:`Rooms`
    (what ``min(r.first(least) for r in many)`` gives, without a call per one)."""
    best_room = None
    best_key = None
    for rooms in many:
        values = rooms.values
        i = bisect.bisect_left(values, least)
        if i == len(values):
            continue
        room = values[i]
        if best_room is None or room < best_room:
            best_room, best_key = room, rooms.by_room[room][0]
        elif room == best_room:
            key = rooms.by_room[room][0]
            if key < best_key:
                best_key = key
    return None if best_room is None else (best_room, best_key)
