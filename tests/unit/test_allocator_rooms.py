"""Rooms: entries in order of room, then key, against one sorted list."""

from __future__ import annotations

import bisect
import random

from gpuspawner.allocator.rooms import Rooms, first_of


def test_rooms_agree_with_one_sorted_list_through_random_changes():
    rng = random.Random(3)
    rooms, plain = Rooms(), []
    for _ in range(3000):
        roll = rng.random()
        if plain and roll < 0.3:
            room, key = plain.pop(rng.randrange(len(plain)))
            assert rooms.remove(room, key) is (not plain), "remove says when none are left"
        elif plain and roll < 0.5:
            i = rng.randrange(len(plain))
            room, key = plain[i]
            new = rng.randrange(1, 40)
            if new == room or (new, key) in plain:
                continue
            del plain[i]
            bisect.insort(plain, (new, key))
            rooms.move(room, new, key)
        else:
            entry = (rng.randrange(1, 40), f"h{rng.randrange(30):02d}")
            if entry in plain:
                continue
            bisect.insort(plain, entry)
            rooms.add(*entry)
        least = rng.randrange(0, 45)
        start = bisect.bisect_left(plain, (least,))
        assert list(rooms.starting(least)) == plain[start:]
        assert rooms.first(least) == (plain[start] if start < len(plain) else None)
        assert rooms.largest() == (plain[-1][0] if plain else 0)
        assert bool(rooms) is bool(plain) and len(rooms) == len(plain)
    assert set(rooms.by_room) == set(rooms.values), "a room whose list emptied is gone"


def test_rooms_compare_by_entries_not_by_the_order_they_came_in():
    a, b = Rooms(), Rooms()
    for room, key in [(5, "x"), (3, "y"), (5, "a")]:
        a.add(room, key)
    for room, key in [(5, "a"), (5, "x"), (3, "y")]:
        b.add(room, key)
    assert a == b
    b.remove(3, "y")
    assert a != b and list(b.starting(0)) == [(5, "a"), (5, "x")]


def test_first_of_several_is_the_least_first_entry_of_any():
    rng = random.Random(5)
    for _ in range(300):
        many = [Rooms() for _ in range(rng.randrange(0, 5))]
        entries = []
        for rooms in many:
            for key in rng.sample(range(12), rng.randrange(0, 6)):
                room = rng.randrange(1, 10)
                rooms.add(room, f"h{key:02d}")
                entries.append((room, f"h{key:02d}"))
        least = rng.randrange(0, 11)
        firsts = [f for f in (r.first(least) for r in many) if f is not None]
        assert first_of(many, least) == (min(firsts) if firsts else None)
        assert first_of(many, least) == min((e for e in entries if e[0] >= least), default=None)
