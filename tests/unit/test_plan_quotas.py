"""Quotas' rules (gpuspawner.plan.quotas), pure: which holdings are within a quota and
which are borrowed, what a request must leave free for others' quotas, and which
borrowed holdings are taken back for a waiter, against brute force over every subset.

Guards docs/quotas.md: "its members' holdings count within it, oldest first, until one
does not fit; that one and every later one are borrowed", "A user in several groups with
a quota of the model draws on the one with the most left", "A holding within its group's
quota is never taken back", "Only as many as needed are taken back" (the member served
soonest, then the lower classes, then the fewest GPU-hours), "a member below quota whose
request fits one host is served after one notice at most", "the part of an idle quota
it does not lend is never lent", "no further than its borrowing limit" and "No
preemption cycle"."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core.sharing import UNIT
from gpuspawner.plan import quotas
from gpuspawner.plan.quotas import (
    Ask,
    Borrowed,
    Mark,
    Quota,
    Waiter,
    draws_on,
    in_turn,
    keep,
    marks,
    plan_reclaims,
    reclaim,
    used,
)
from gpuspawner.plan.reservations import Holder, Keep

A100 = "NVIDIA A100 80GB PCIe"
GTX = "NVIDIA GeForce GTX 1070"
LABS = ("lab-a", "lab-b", "lab-c")


def holder(key: str, gpus: float, *groups: str, model: str = A100) -> Holder:
    return Holder(key, model, round(gpus * UNIT), frozenset(groups))


def test_a_groups_holdings_count_within_its_quota_oldest_first_and_the_rest_is_borrowed():
    quotas = [Quota("lab-a", A100, 3 * UNIT), Quota("lab-b", A100, 1 * UNIT)]
    holders = [
        holder("a1", 2, "lab-a"),
        holder("b1", 1, "lab-b"),
        holder("a2", 2, "lab-a"),  # 2 + 2 > 3: borrowed
        holder("a3", 1, "lab-a"),  # would fit beside a1, but the group is over: borrowed too
        holder("x1", 1, "students"),  # no quota of the model: borrowed
        holder("g1", 1, "lab-a", model=GTX),  # a model without quotas: not marked
    ]
    found = marks(quotas, holders)
    assert found == {
        "a1": Mark("lab-a", True),
        "b1": Mark("lab-b", True),
        "a2": Mark("lab-a", False),
        "a3": Mark("lab-a", False),
        "x1": Mark(None, False),
    }
    assert used(quotas, holders, found) == {("lab-a", A100): 5 * UNIT, ("lab-b", A100): UNIT}


def test_a_user_in_several_groups_draws_on_the_one_with_the_most_left():
    quotas = {"lab-a": Quota("lab-a", A100, 4 * UNIT), "lab-b": Quota("lab-b", A100, 2 * UNIT)}
    assert draws_on(quotas, {"lab-a": 3 * UNIT}, {"lab-a", "lab-b"}, UNIT) == Mark("lab-b", True)  # 1 left vs 2
    assert draws_on(quotas, {}, {"lab-a", "lab-b"}, UNIT) == Mark("lab-a", True)  # 4 left vs 2
    assert draws_on(quotas, {"lab-b": 2 * UNIT}, {"lab-a", "lab-b"}, 4 * UNIT) == Mark("lab-a", True)  # fits lab-a only
    assert draws_on(quotas, {"lab-a": 4 * UNIT, "lab-b": UNIT}, {"lab-a", "lab-b"}, 2 * UNIT) == Mark("lab-b", False)
    tie = {"lab-b": Quota("lab-b", A100, UNIT), "lab-a": Quota("lab-a", A100, UNIT)}
    assert draws_on(tie, {}, {"lab-a", "lab-b"}, UNIT) == Mark("lab-a", True)  # a tie: the first by name
    prefix = {"lab-a": Quota("lab-a", A100, UNIT), "lab": Quota("lab", A100, UNIT)}
    assert draws_on(prefix, {}, {"lab-a", "lab"}, UNIT) == Mark("lab", True)  # "lab" sorts first
    assert draws_on(quotas, {}, {"students"}, UNIT) == Mark(None, False)


@st.composite
def holdings(draw, whole: bool = True):
    quotas = [
        Quota(g, A100, draw(st.integers(0, 4)) * UNIT if whole else draw(st.integers(0, 4000)))
        for g in draw(st.lists(st.sampled_from(LABS), min_size=1, max_size=3, unique=True))
    ]
    n = draw(st.integers(0, 10))
    holders = [
        Holder(
            f"h{i}",
            A100,
            draw(st.integers(1, 3)) * UNIT if whole else draw(st.integers(1, 2000)),
            frozenset(draw(st.lists(st.sampled_from((*LABS, "students")), max_size=2))),
        )
        for i in range(n)
    ]
    return quotas, holders


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(holdings(whole=False))
def test_what_counts_within_a_quota_never_passes_it_and_a_group_below_it_borrows_nothing(case):
    quotas, holders = case
    found = marks(quotas, holders)
    of = {q.group: q for q in quotas}
    within = {q.group: 0 for q in quotas}
    borrows = {q.group: False for q in quotas}
    for h in holders:
        m = found[h.key]
        assert (m.group is None) == of.keys().isdisjoint(h.groups)
        if m.group is not None:
            assert m.group in h.groups
            within[m.group] += h.milli if m.within else 0
            borrows[m.group] |= not m.within
        else:
            assert not m.within
    for g, q in of.items():
        assert within[g] <= q.milli
        if borrows[g]:  # a group that borrows has no room left for what it borrowed
            total = used(quotas, holders, found)[(g, A100)]
            assert total > q.milli
    # Oldest first: a group's holdings within come before its first borrowed one.
    for g in of:
        seq = [found[h.key].within for h in holders if found[h.key].group == g]
        assert seq == sorted(seq, reverse=True)


def test_an_idle_quota_keeps_what_its_members_wait_for_and_what_it_does_not_lend():
    quotas = [
        Quota("lab-a", A100, 4 * UNIT, lend=1 * UNIT),  # 3 of its 4 are never lent
        Quota("lab-b", A100, 2 * UNIT),  # lends all
        Quota("lab-c", A100, 1500),  # a share total
    ]
    use = {("lab-a", A100): UNIT, ("lab-b", A100): 0, ("lab-c", A100): 500}
    # Nobody waits: lab-a keeps 3 - 1 held = 2 of its idle 3 (it lends 1); lab-b and lab-c lend all.
    assert keep(quotas, use, {}, {"students"}) == {A100: Keep(2)}
    # A lab-b member waits for 2: they are kept from others too; lab-c's member waits for 0.4.
    waiting = {("lab-b", A100): 2 * UNIT, ("lab-c", A100): 400}
    assert keep(quotas, use, waiting, {"students"}) == {A100: Keep(4, 400)}
    # A member of lab-b is kept from lab-a's and lab-c's, not from its own group's.
    assert keep(quotas, use, waiting, {"lab-b"}) == {A100: Keep(2, 400)}
    # A lab-b member ahead of lab-c's in line is kept only from what those ahead of it wait for.
    assert keep(quotas, use, {}, {"lab-b"}) == {A100: Keep(2)}


def test_a_request_beyond_its_quota_goes_no_further_than_its_borrowing_limit():
    quotas = [Quota("lab-a", A100, 2 * UNIT, borrow=1 * UNIT), Quota("lab-b", A100, 2 * UNIT)]
    use = {("lab-a", A100): 2 * UNIT, ("lab-b", A100): 0}
    k = keep(quotas, use, {}, {"lab-a"}, asks={A100: UNIT})[A100]
    assert k.most == UNIT  # one more may be borrowed
    assert k.met(5, 5000, UNIT) and not k.met(5, 5000, 2 * UNIT)
    within = {("lab-a", A100): 0, ("lab-b", A100): 0}
    assert keep(quotas, within, {}, {"lab-a"}, asks={A100: UNIT}) == {}  # within its quota: no limit
    assert keep(quotas, use, {}, {"students"}, asks={A100: UNIT}) == {}  # no quota: no borrowing limit either


# -- taking back ------------------------------------------------------------------------


def weigh(gone, borrowed) -> tuple:
    """As the docs rank a set to stop: served soonest (the latest notice), the lowest
    class taken, the fewest GPU-hours, the fewest servers."""
    of = {b.key: b for b in borrowed}
    return (
        max((of[k].ready for k in gone), default=0.0),
        max((of[k].rank for k in gone), default=-(10**9)),
        round(sum(of[k].cost for k in gone), 9),
        len(gone),
    )


def brute(ask: Ask, hosts, borrowed, spare=None):
    """Every subset of the borrowed holdings on every host: the best-ranked that serves the
    ask, using at most ``spare`` of the devices nobody holds (None: any)."""
    cost = {b.key: b.cost for b in borrowed}
    best = None
    for devices in hosts.values():
        mine = sorted({k for held in devices.values() for k in held if k in cost})
        untouched = sum(1 for held in devices.values() if not held)
        usable = untouched if spare is None else min(untouched, max(0, spare))
        for n in range(len(mine) + 1):
            for gone in itertools.combinations(mine, n):
                freed = sum(1 for held in devices.values() if held and set(held) <= set(gone))
                if ask.count:
                    ok = freed + usable >= ask.count
                else:
                    ok = any(
                        UNIT - sum(m for k, m in held.items() if k not in gone) >= ask.milli
                        for held in devices.values()
                        if held or usable > 0
                    )
                if ok:
                    found = weigh(gone, borrowed)
                    if best is None or found < best:
                        best = found
    return best


@st.composite
def clusters(draw):
    """Two or three hosts of up to four devices, each free, held whole, or shared by up
    to three holders; some holders borrowed, with a cost each; an ask of whole GPUs or a share."""
    hosts = {}
    holders = itertools.count()
    for h in range(draw(st.integers(1, 3))):
        devices = {}
        for d in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["free", "whole", "shared"]))
            if kind == "free":
                devices[f"g{h}{d}"] = {}
            elif kind == "whole":
                devices[f"g{h}{d}"] = {f"k{next(holders)}": UNIT}
            else:
                parts = draw(st.lists(st.integers(100, 400), min_size=1, max_size=3))
                devices[f"g{h}{d}"] = {f"k{next(holders)}": m for m in parts}
        hosts[f"host{h}"] = devices
    keys = sorted({k for devices in hosts.values() for held in devices.values() for k in held})
    borrowed = [
        Borrowed(
            k,
            draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.5])),  # GPU-hours
            draw(st.sampled_from([600.0, 600.0, 240.0, 30.0])),  # seconds until it may be stopped
            draw(st.sampled_from([0, 0, 0, 1, 2])),  # its class's rank
        )
        for k in keys
        if draw(st.booleans())
    ]
    ask = Ask(count=draw(st.integers(1, 3))) if draw(st.booleans()) else Ask(milli=draw(st.integers(100, 1000)))
    spare = draw(st.sampled_from([None, None, 0, 1, 2]))  # devices nobody holds it may take
    return ask, hosts, borrowed, spare


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(clusters())
def test_a_reclaim_takes_back_the_fewest_gpu_hours_only_borrowed_and_only_as_many_as_needed(case):
    ask, hosts, borrowed, spare = case
    found = reclaim(ask, hosts, borrowed, spare)
    best = brute(ask, hosts, borrowed, spare)
    assert (found is None) == (best is None)
    if found is None:
        return
    host, gone, taken = found
    cost = {b.key: b.cost for b in borrowed}
    assert set(gone) <= set(cost)  # never a holding within its quota
    assert weigh(gone, borrowed) == best
    devices = hosts[host]
    for u in taken:  # what it would take is free once they are stopped
        held = {k: m for k, m in devices[u].items() if k not in gone}
        assert (not held) if ask.count else (UNIT - sum(held.values()) >= ask.milli)
    assert spare is None or sum(1 for u in taken if not devices[u]) <= max(0, spare)  # what is kept, left
    assert len(taken) == (ask.count or 1)
    for k in gone:  # none can be let off: without it, the rest do not serve the ask there
        assert reclaim(ask, {host: devices}, [b for b in borrowed if b.key in gone and b.key != k], spare) is None


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(clusters())
def test_beyond_brute_force_a_reclaim_still_serves_the_ask_and_stops_none_it_could_let_off(case):
    ask, hosts, borrowed, spare = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quotas, "BRUTE_MAX", 0)  # a host with more borrowed holdings than that: cheapest first
        found = reclaim(ask, hosts, borrowed, spare)
        assert (found is None) == (brute(ask, hosts, borrowed, spare) is None)
        if found is None:
            return
        host, gone, _ = found
        for k in gone:
            rest = [b for b in borrowed if b.key in gone and b.key != k]
            assert reclaim(ask, {host: hosts[host]}, rest, spare) is None


@st.composite
def labs(draw):
    """Whole GPUs of one model on hosts of 1 to 4 devices; quotas that sum to no more than
    the cluster has; holdings of lab members and best-effort users, oldest first."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    uuids = [(f"host{h}", f"g{h}{d}") for h, n in enumerate(sizes) for d in range(n)]
    total = len(uuids)
    quotas, left = [], total
    for g in LABS:
        q = draw(st.integers(0, left))
        left -= q
        quotas.append(Quota(g, A100, q * UNIT))
    owners = [draw(st.sampled_from((*LABS, "best-effort", None))) for _ in uuids]  # None: free
    return sizes, uuids, quotas, owners


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(labs(), st.sampled_from(LABS))
def test_a_member_below_quota_asking_one_gpu_is_served_after_one_notice_and_no_cycle_follows(case, group):
    sizes, uuids, quotas, owners = case
    holders = [holder(f"s{i}", 1, o) for i, o in enumerate(owners) if o is not None]
    found = marks(quotas, holders)
    q = next(q for q in quotas if q.group == group)
    use = used(quotas, holders, found)
    if use[(group, A100)] + UNIT > q.milli:
        return  # not below its quota for this ask
    hosts: dict[str, dict[str, dict[str, int]]] = {}
    for (host, u), o, i in zip(uuids, owners, range(len(uuids))):
        hosts.setdefault(host, {})[u] = {} if o is None else {f"s{i}": UNIT}
    borrowed = [Borrowed(k, 1.0) for k, m in found.items() if not m.within]
    plan = plan_reclaims([Waiter("new", group, Ask(count=1))], hosts, borrowed)
    free_now = any(not held for devices in hosts.values() for held in devices.values())
    assert free_now or len(plan) == 1  # quotas within the cluster: someone borrows a GPU it can have
    assert all(not found[k].within for k in plan)
    # After the stop it holds within its quota, so whatever the one stopped asks next, the
    # GPUs it lost are never taken back from it (only borrowed holdings are): no cycle.
    after = [h for h in holders if h.key not in plan] + [holder("new", 1, group)]
    assert marks(quotas, after)["new"] == Mark(group, True)


def test_waiters_in_line_order_each_take_back_for_themselves_and_not_twice():
    hosts = {
        "gpu-1": {"g10": {"b1": UNIT}, "g11": {"b2": UNIT}},
        "gpu-2": {"g20": {"b3": UNIT}, "g21": {"w1": UNIT}},
    }
    borrowed = [Borrowed("b1", 5.0, 600.0), Borrowed("b2", 1.0, 600.0), Borrowed("b3", 0.5, 600.0)]
    plan = plan_reclaims(
        [Waiter("a", "lab-a", Ask(count=1)), Waiter("b", "lab-a", Ask(count=2)), Waiter("c", "lab-a", Ask(count=1))],
        hosts,
        borrowed,
    )
    # a: the cheapest (b3 on gpu-2); b: 2 on one host, only gpu-1 can (b1 + b2); c: nothing left.
    assert {k: w.key for k, w in plan.items()} == {"b3": "a", "b1": "b", "b2": "b"}
    # b1 was told 2 minutes ago: its stop is the nearest, so the plan keeps it though it costs more.
    told = [Borrowed("b1", 5.0, 480.0), Borrowed("b2", 1.0, 600.0), Borrowed("b3", 0.5, 600.0)]
    assert set(plan_reclaims([Waiter("a", "lab-a", Ask(count=1))], hosts, told)) == {"b1"}
    # Among equally near stops, a lower class goes first though it costs more.
    classes = [Borrowed("b1", 5.0, 600.0, 0), Borrowed("b2", 1.0, 600.0, 2), Borrowed("b3", 0.5, 600.0, 2)]
    assert set(plan_reclaims([Waiter("a", "lab-a", Ask(count=1))], hosts, classes)) == {"b1"}


def test_waiters_whose_notices_were_given_first_are_served_first():
    line = [
        Waiter("w1", "lab-a", Ask(count=2)),
        Waiter("w2", "lab-b", Ask(count=1)),
        Waiter("w3", "lab-c", Ask(count=1)),
    ]
    # w3's notice was given before w2's; w1 came within its quota only later: it follows them.
    promised = {"w3": 10.0, "w2": 20.0}
    assert [w.key for w in in_turn(line, promised)] == ["w3", "w2", "w1"]
    assert [w.key for w in in_turn(line, {})] == ["w1", "w2", "w3"]  # none promised: the line's order


def test_a_class_that_may_not_be_taken_back_borrows_none_of_an_idle_quota_beyond_its_own():
    quotas = [Quota("lab-a", A100, 2 * UNIT), Quota("exam", A100, 1 * UNIT)]
    use = {("lab-a", A100): 0, ("exam", A100): UNIT}
    # An exam member beyond its quota must leave lab-a's idle 2 free: what it borrowed could not be taken back.
    assert keep(quotas, use, {}, {"exam"}, {A100: UNIT}, borrows_idle=False) == {A100: Keep(2)}
    assert keep(quotas, use, {}, {"exam"}, {A100: UNIT}) == {}  # a preemptible one may borrow it
    within = {("lab-a", A100): 0, ("exam", A100): 0}
    assert keep(quotas, within, {}, {"exam"}, {A100: UNIT}, borrows_idle=False) == {}  # within its own: served


def test_a_waiter_that_must_leave_free_devices_untouched_takes_back_what_it_needs_beside_them():
    """Free devices kept for others (a quota that does not lend, a reservation's window)
    are not the waiter's: it takes borrowed ones back instead, and only on its own hosts."""
    hosts = {"gpu-1": {"g10": {}, "g11": {}, "g12": {"c1": UNIT}, "g13": {"c2": UNIT}}, "gpu-2": {"g20": {"c3": UNIT}}}
    borrowed = [Borrowed("c1", 1.0, 600.0), Borrowed("c2", 2.0, 600.0), Borrowed("c3", 0.5, 600.0)]
    free = plan_reclaims([Waiter("a", "lab-a", Ask(count=1))], hosts, borrowed)
    assert free == {}  # two free, none kept: served at once
    kept = plan_reclaims([Waiter("a", "lab-a", Ask(count=1), kept=2)], hosts, borrowed)
    assert set(kept) == {"c3"}  # both free ones are kept for others: the cheapest borrowed goes
    pinned = plan_reclaims([Waiter("a", "lab-a", Ask(count=1), hosts=frozenset({"gpu-1"}), kept=2)], hosts, borrowed)
    assert set(pinned) == {"c1"}  # only gpu-1 will do


def test_a_request_of_unknown_size_is_held_to_the_most_its_quotas_limits_allow():
    quotas = [Quota("lab-a", A100, 2 * UNIT, borrow=1 * UNIT), Quota("lab-b", A100, 1 * UNIT, borrow=2 * UNIT)]
    use = {("lab-a", A100): 2 * UNIT, ("lab-b", A100): 0}
    assert keep(quotas, use, {}, {"lab-a"}, {A100: 0})[A100].most == UNIT  # all of a host: 1 more at most
    assert keep(quotas, use, {}, {"lab-a", "lab-b"}, {A100: 0})[A100].most == 3 * UNIT  # lab-b allows 1 + 2
    assert keep(quotas, use, {}, {"students"}, {A100: 0}) == {}  # no quota: no limit
