"""Whom a window's start stops (gpuspawner.plan.reservations.make_room), pure, against a
simple reference: the moments windows open taken in turn, at each what the windows open
then lack together, and the newest servers of users who are members of none of them (and
whose held-time limit does not end them by then) stopped until that is free.

Guards docs/reservations.md, "Making room at a window's start": "Only as many as needed
are stopped ... newest servers first", "Members of any open reservation of the model are
never stopped for one", "A server whose held-time limit ends it before the window opens
is left alone", and "One plan with the line": "only servers of users who are members of
no open reservation of the model, and only as many as the windows open then lack
together"."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core.reservations import Reservation
from gpuspawner.core.sharing import UNIT
from gpuspawner.plan.reservations import Candidate, Holder, count_toward, make_room

A100 = "NVIDIA A100 80GB PCIe"
NOW = datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
GROUPS = ("lab-a", "lab-b", "lab-c", "other")


@st.composite
def starts(draw):
    """Devices of one model, each held whole by one server or free; reservations of it
    for lab-a, lab-b, lab-c, open now or opening within the hour; each server's user in
    at most one of their groups (so what members hold is plain), or unknown."""
    devices = draw(st.integers(1, 7))
    servers = draw(st.integers(0, devices))
    reservations = [
        Reservation(
            group,
            A100,
            draw(st.integers(1, devices)),
            NOW + timedelta(minutes=draw(st.sampled_from([-30, 0, 10, 40]))),
            NOW + timedelta(hours=2),
            id=i + 1,
        )
        for i, group in enumerate(draw(st.lists(st.sampled_from(GROUPS[:3]), min_size=1, max_size=3, unique=True)))
    ]
    users = [draw(st.sampled_from([None, *GROUPS])) for _ in range(servers)]  # None: groups not known
    ends = [draw(st.sampled_from([None, 5, 20, 90])) for _ in range(servers)]  # minutes from now
    return devices, reservations, users, ends


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(starts())
def test_a_windows_start_stops_the_newest_non_members_as_the_windows_open_then_lack_together(case):
    devices, reservations, users, ends = case
    names = [f"s{i}" for i in range(len(users))]  # s0 the oldest
    booked = {f"GPU-{d}": ({names[d]: UNIT} if d < len(names) else {}) for d in range(devices)}
    groups = {n: (frozenset() if u == "other" else None if u is None else frozenset({u})) for n, u in zip(names, users)}
    ends_at = {n: None if e is None else NOW + timedelta(minutes=e) for n, e in zip(names, ends)}

    def members_hold(open_then):
        holders = [Holder(n, A100, UNIT, g) for n, g in groups.items() if g]
        held: dict[int, float] = {}
        for _, rid in count_toward(open_then, holders, NOW).items():
            held[rid] = held.get(rid, 0.0) + 1
        return held

    def candidates(model, held):
        return [Candidate(n, groups[n], ends_at[n]) for n in reversed(names) if n in held]

    got = make_room(reservations, NOW, timedelta(hours=1), members_hold, lambda m: booked, candidates)

    # The reference: whole devices, each user a member of one group at most.
    want: list[str] = []
    for t in sorted({max(r.start, NOW) for r in reservations}):
        open_then = [r for r in reservations if r.start <= t]
        lack = sum(max(0, r.count - sum(1 for g in groups.values() if g and r.group in g)) for r in open_then)
        free = devices - len(names) + len(want)
        kinds = {r.group for r in open_then}
        may = [
            n
            for n in reversed(names)
            if n not in want
            and groups[n] is not None
            and kinds.isdisjoint(groups[n])
            and (ends_at[n] is None or ends_at[n] > t)
        ]
        want += may[: max(0, lack - free)]
    assert sorted(got) == sorted(want)
    for name, need in got.items():  # each with a window of the list, whose group its user is not in
        assert need.reservation in reservations and need.reservation.group not in (groups[name] or ())


def test_what_members_hold_follows_a_change_of_groups_and_of_holdings():
    """The reservation keeper keeps each holding as the reservations see it between
    changes (a large hub counts thousands after each): a user who leaves the group
    stops counting once her groups are asked again, and a holding that ends stops
    counting at once."""
    from gpuspawner.allocator.allocator import Allocator
    from gpuspawner.core.inventory import GPU
    from gpuspawner.core.labels import Held
    from gpuspawner.holdings.holdings import Holding, Phase
    from gpuspawner.reclaim.reservations import GROUPS_SECONDS, ReservationKeeper

    class Holdings:  # what the keeper reads of the hub's holdings
        allocator = Allocator([GPU("gpu-a", i, f"GPU-a{i}", A100, 81920) for i in range(2)])
        version = 0
        held = {
            n: Holding(n, Held(u, "", "gpu-a", (f"GPU-a{i}",), A100, None), Phase.RUNNING)
            for i, (n, u) in enumerate([("jupyter-ann", "ann"), ("jupyter-bo", "bo")])
        }

        def all(self):
            return dict(self.held)

    groups = {"ann": {"lab-a"}, "bo": {"lab-a"}}
    clock = [0.0]
    holdings = Holdings()
    keeper = ReservationKeeper(holdings, groups_of=groups.get, wall=lambda: NOW, clock=lambda: clock[0])
    keeper.reservations = [
        Reservation(lab, A100, 2, NOW - timedelta(hours=1), NOW + timedelta(hours=1), id=i)
        for i, lab in enumerate(["lab-a", "lab-b"], 1)
    ]
    keeper.known = True
    assert keeper._members_hold(keeper.reservations) == {1: 2.0}
    groups["bo"] = {"lab-b"}
    holdings.version += 1  # something changed, but bo's groups are not asked again yet
    assert keeper._members_hold(keeper.reservations) == {1: 2.0}
    clock[0] = GROUPS_SECONDS + 1
    assert keeper._members_hold(keeper.reservations) == {1: 1.0, 2: 1.0}
    groups["bo"] = {"other"}
    clock[0] = 2 * GROUPS_SECONDS + 2
    assert keeper._members_hold(keeper.reservations) == {1: 1.0}
    del holdings.held["jupyter-ann"]
    holdings.version += 1
    assert keeper._members_hold(keeper.reservations) == {}
