"""Property tests for shares: random inventories (those of the whole-GPU
property tests), sharing policies and sequences of share and whole-GPU requests, releases, availability changes and
adopts, checked step by step against brute force.

Invariants after every step: the shares on a device never sum above 1; a
device held whole is never shared; every holding lies on one host; the views
(booked_on, summary, held_by_owner) agree with a recount of the
holdings; an allocator fed the inventory in reverse order decides the same.

Hosts' devices also change as the steps go (some leave, come back, change
model; hosts come and go): the allocator under test takes each change one host
at a time (``set_host_devices``), the mirror rebuilds its index from the whole
new inventory (``set_inventory``); their decisions, holdings and indexes must
stay identical.

Each share decision is checked against an exhaustive search over every
combination of devices of every (model, host): granted exactly when one fits,
on the fewest devices, with the least room on the host chosen (best fit); the
host: for one device or a pinned host the least room, for a split the host
with the partly booked device of least room that takes the smallest piece, or,
when no partly booked device fits, the host the policy ranks first;
retry=False exactly when no state could ever grant it.

Guards docs/security.md, "A user": "get a GPU another server holds, exceed the limit, or get more
than one device per whole GPU asked for".

Guards docs/sharing.md, "The rules": "The shares booked on a device never sum above 1", "a share
never lands on a device held whole" and "keeping emptier devices free for larger requests".
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpuspawner.allocator import index as allocator_index
from gpuspawner.allocator.allocator import ALL, AllocationRefused, Allocator, Request
from gpuspawner.allocator.index import DeviceIndex
from gpuspawner.allocator.records import EVEN_SPLIT, ONE_DEVICE, UNEVEN_SPLIT
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT, SharingPolicy, split_evenly, to_milli
from tests.unit.test_allocator_properties import HOSTNAMES, MEMORY, MODELS, OWNERS, Reference, inventories
from tests.unit.test_allocator_properties import SETTINGS as WHOLE_SETTINGS

QUANTA = [0.05, 0.1, 0.2, 0.25, 0.5]
# Shares in thousandths: valid ones of every quantum above, and some that are not
# (the last two are not thousandths at all: the edges parse, the allocator refuses).
SHARES = [50 * k for k in range(1, 61)] + [330, 1, 0, -500, True, 0.5]

SETTINGS = settings(WHOLE_SETTINGS, max_examples=60)  # the reference below is exhaustive: fewer examples


@st.composite
def policies(draw) -> dict:
    config = {}
    for key in ["*", *MODELS]:
        kind = draw(st.sampled_from(["absent", "off", "quantum", "quantum", "shares"]))
        split = draw(st.booleans())
        if kind == "off":
            config[key] = None
        elif kind == "quantum":
            config[key] = {"quantum": draw(st.sampled_from(QUANTA)), "split": split}
            if split and draw(st.booleans()):
                config[key]["uneven"] = True
            if split and draw(st.booleans()):
                config[key]["split_small"] = True
        elif kind == "shares":
            shares = draw(st.lists(st.sampled_from([0.1, 0.25, 0.5, 0.75, 1, 1.5, 2]), min_size=1, max_size=3))
            config[key] = {"shares": shares if split else [s for s in shares if s <= 1] or [0.5], "split": split}
    return config


class SharesMachine(RuleBasedStateMachine):
    @initialize(inventory=inventories(), config=policies(), policy=st.sampled_from(["pack", "spread"]))
    def setup(self, inventory, config, policy):
        self.gpus = sorted(inventory)
        self.by_uuid = {g.uuid: g for g in inventory}
        self.hosts = sorted({g.host for g in inventory})
        self.models = sorted({g.model for g in inventory})
        self.sharing = SharingPolicy.parse(config)
        self.policy = policy
        self.alloc = Allocator(inventory, policy, sharing=config)
        self.mirror = Allocator(list(reversed(inventory)), policy, sharing=config)
        self.available: set[str] | None = None
        self.serial = 0
        self.ever: dict[str, dict[str, GPU]] = {}  # host -> every device it has had, by UUID
        for gpu in self.gpus:
            self.ever.setdefault(gpu.host, {})[gpu.uuid] = gpu

    # -- recount from the holdings ----------------------------------------------

    def booked(self) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
        """uuid -> whole holder; uuid -> {holder: milli} for shared devices."""
        whole, shared = {}, {}
        for a in self.alloc.holdings().values():
            for d, m in zip(a.devices, a.milli if a.shared else [None] * len(a.devices)):
                if m is None:
                    assert d.uuid not in whole, f"{d.uuid} held whole twice"
                    whole[d.uuid] = a.holder
                else:
                    shared.setdefault(d.uuid, {})[a.holder] = m
        return whole, shared

    def room(self, gpu: GPU) -> int:
        whole, shared = self.booked()
        return 0 if gpu.uuid in whole else UNIT - sum(shared.get(gpu.uuid, {}).values())

    def is_available(self, host: str) -> bool:
        return self.available is None or host in self.available

    def held(self, owner: str) -> int:
        return sum(a.total_milli for a in self.alloc.holdings().values() if a.owner == owner)

    # -- operations ---------------------------------------------------------------

    def _decide(self, holder: str, req: Request, limit: int | None):
        try:
            got = self.alloc.allocate(holder, req, max_per_owner=limit)
        except AllocationRefused as e:
            got, refused = None, e
        try:
            mirrored = self.mirror.allocate(holder, req, max_per_owner=limit)
        except AllocationRefused as e:
            assert got is None and e.message == refused.message
        else:
            assert got == mirrored
        return (got, None) if got is not None else (None, refused)

    @rule(data=st.data())
    def allocate_share(self, data):
        model = data.draw(st.sampled_from(self.models + [None]), label="model")
        share = data.draw(
            st.one_of(
                st.sampled_from(SHARES),
                st.builds(lambda k, q: k * round(q * UNIT), st.integers(1, 10), st.sampled_from(QUANTA)),
                self.valid_shares(model),
                self.valid_shares(model),
            ),
            label="share",
        )
        host = data.draw(st.one_of(st.none(), st.none(), st.sampled_from(self.hosts + ["gpu-gone"])), label="host")
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        limit = data.draw(st.one_of(st.none(), st.integers(1, 4)), label="limit")
        self.serial += 1
        req = Request(model=model, host=host, owner=owner, milli=share)
        rooms_before = {g.uuid: self.room(g) for g in self.gpus}
        held_before = self.held(owner)
        got, refused = self._decide(f"s{self.serial}", req, limit)

        milli = share if type(share) is int else 0
        try:
            ok = self.sharing.accepting(milli, model, self.models) if type(share) is int else []
        except ValueError:
            ok = []
        over = ok and limit is not None and held_before + milli > limit * UNIT
        cands = [] if not ok or over else self.candidates(ok, milli, host, rooms_before)
        uneven = [] if cands or not ok or over else self.uneven_candidates(ok, milli, host, rooms_before)

        if got is None:
            assert not cands, f"refused ({refused.message}) although {min(cands)} fits"
            assert not uneven, f"refused ({refused.message}) although {min(uneven)} fits unevenly"
            never = self.never(ok, milli if ok else 0, host, limit)
            assert refused.retry is (not never), f"retry={refused.retry} for: {refused.message}"
            return
        assert cands or uneven, f"granted {got} although nothing fits"
        assert len({d.host for d in got.devices}) == 1 and len({d.model for d in got.devices}) == 1
        assert self.is_available(got.host) and (host is None or got.host == host)
        assert sum(got.milli) == milli
        if not cands:  # no even split fits anywhere: the least room in all, the freest devices first
            _, h, m = min(uneven)
            assert (got.host, got.model, got.rule) == (h, m, UNEVEN_SPLIT)
            assert got.booking() == self.filled(h, m, milli, rooms_before)
            return
        assert got.rule == (None if not got.shared else ONE_DEVICE if len(got.devices) == 1 else EVEN_SPLIT)
        assert sorted(got.milli, reverse=True) == list(
            split_evenly(milli, len(got.devices), self.sharing.for_model(got.model).quantum)
        )
        assert all(rooms_before[d.uuid] >= m for d, m in zip(got.devices, got.milli))
        n, total = len(got.devices), sum(rooms_before[d.uuid] for d in got.devices)
        best_n = min(c[0] for c in cands)
        assert n == best_n, f"{n} devices used where {best_n} suffice"
        at_n = [c for c in cands if c[0] == best_n]
        here = min(c[1] for c in at_n if (c[2], c[3]) == (got.host, got.model))
        assert total == here, f"room {total} where {here} fits on {got.host} (best fit)"
        if host is None and best_n > 1:
            # A split: the host with the partly booked device of least room that takes the smallest piece.
            small = split_evenly(milli, best_n, self.sharing.for_model(got.model).quantum)[-1]
            tight = [
                (rooms_before[g.uuid], c[2], c[3])
                for c in at_n
                for g in self.gpus
                if (g.host, g.model) == (c[2], c[3]) and small <= rooms_before[g.uuid] < UNIT
            ]
            if tight:
                assert (got.host, got.model) == min(tight)[1:], f"{got.host} where {min(tight)} is tighter"
                return
        else:
            best_total = min(c[1] for c in at_n)
            if best_total < best_n * UNIT:
                assert (got.host, got.model) == min((c[2], c[3]) for c in at_n if c[1] == best_total)
                return
        # no partly booked device that fits: among hosts with enough untouched devices the policy picks
        untouched = Counter((g.host, g.model) for g in self.gpus if rooms_before[g.uuid] == UNIT)
        rank = (lambda k: k) if self.policy == "pack" else (lambda k: -k)
        pick = min((rank(untouched[c[2], c[3]]), c[2], c[3]) for c in at_n if untouched[c[2], c[3]] >= best_n)
        assert (got.host, got.model) == pick[1:]

    def valid_shares(self, model):
        """Shares the policy accepts for the model (or for some model)."""
        options = []
        for m in [model] if model is not None else self.models:
            sharing = self.sharing.for_model(m)
            if sharing is None:
                continue
            if sharing.allowed:
                options += sharing.allowed
            else:
                options += range(sharing.quantum, (3 if sharing.split else 1) * UNIT + 1, sharing.quantum)
        return st.sampled_from(options) if options else st.just(500)

    def candidates(self, models, share, host, rooms) -> list[tuple[int, int, str, str]]:
        """(devices, room of those devices, host, model) of every fitting placement."""
        out = []
        need = -(-share // UNIT)
        for model in models:
            sharing = self.sharing.for_model(model)
            for h in [host] if host is not None else self.hosts:
                if not self.is_available(h):
                    continue
                devices = [g for g in self.gpus if (g.host, g.model) == (h, model) and rooms[g.uuid] > 0]
                # A share of at most 1 GPU spans devices only with split_small.
                spans = sharing.split and (share > UNIT or sharing.split_small)
                for n in range(need, (len(devices) if spans else 1) + 1):
                    pieces = split_evenly(share, n, sharing.quantum)
                    for combo in itertools.combinations(devices, n) if pieces else ():
                        have = sorted((rooms[g.uuid] for g in combo), reverse=True)
                        if all(r >= p for r, p in zip(have, pieces)):
                            out.append((n, sum(have), h, model))
        return out

    def uneven_candidates(self, models, share, host, rooms) -> list[tuple[int, str, str]]:
        """(room in all, host, model) of every host that takes the share unevenly, where its model allows it."""
        out = []
        for model in models:
            sharing = self.sharing.for_model(model)
            for h in [host] if host is not None else self.hosts:
                if not sharing.uneven or share <= UNIT and not sharing.split_small or not self.is_available(h):
                    continue
                have = [rooms[g.uuid] for g in self.gpus if (g.host, g.model) == (h, model)]
                if sum(r - r % sharing.quantum for r in have) >= share:
                    out.append((sum(have), h, model))
        return out

    def filled(self, host, model, share, rooms) -> dict[GPU, int]:
        quantum = self.sharing.for_model(model).quantum
        devices = sorted(
            (g for g in self.gpus if (g.host, g.model) == (host, model)), key=lambda g: (-rooms[g.uuid], g.index)
        )
        booking = {}
        for g in devices:
            piece = min(rooms[g.uuid] - rooms[g.uuid] % quantum, share - sum(booking.values()))
            if piece > 0:
                booking[g] = piece
        return booking

    def never(self, models, share, host, limit) -> bool:
        if not models or (limit is not None and share > limit * UNIT):
            return True
        if host is not None and host not in self.hosts:
            return True
        need = -(-share // UNIT)
        for model in models:
            for h in [host] if host is not None else self.hosts:
                if sum(1 for g in self.gpus if (g.host, g.model) == (h, model)) >= need:
                    return False
        return True

    @rule(data=st.data())
    def allocate_whole(self, data):
        model = data.draw(st.sampled_from(self.models + [None]), label="model")
        count = data.draw(st.one_of(st.integers(1, 3), st.just(ALL)), label="count")
        host = data.draw(st.one_of(st.none(), st.sampled_from(self.hosts)), label="host")
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        limit = data.draw(st.one_of(st.none(), st.integers(1, 4)), label="limit")
        self.serial += 1
        req = Request(model=model, count=count, host=host, owner=owner)
        # The whole-GPU reference, with "free" meaning untouched and owners
        # holding what their shares add up to.
        ref = Reference(self.gpus, self.policy)
        ref.available = self.available
        ref.held = self.alloc.holdings()
        ref.milli_held_by = self.held  # type: ignore[method-assign]
        cands = ref.candidates(req, limit)
        got, refused = self._decide(f"w{self.serial}", req, limit)
        if got is None:
            assert not cands, f"refused ({refused.message}) although {cands[0]} fits"
            assert refused.retry is (not ref.never_satisfiable(req, limit)), refused.message
            return
        best = ref.best(cands)
        assert not got.shared and (got.host, got.model, got.devices) == (best.host, best.model, best.devices)

    @rule(data=st.data())
    def release(self, data):
        holders = sorted(self.alloc.holdings())
        holder = data.draw(st.sampled_from(holders + ["nobody"]), label="holder")
        expected = self.alloc.holdings().get(holder)
        assert self.alloc.release(holder) == expected
        assert self.mirror.release(holder) == expected
        assert self.alloc.release(holder) is None

    @rule(data=st.data())
    def set_available_hosts(self, data):
        hosts = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(self.hosts))), label="available")
        self.available = hosts
        self.alloc.set_available_hosts(hosts)
        self.mirror.set_available_hosts(None if hosts is None else sorted(hosts, reverse=True))

    @rule(data=st.data())
    def adopt(self, data):
        host = data.draw(st.sampled_from(self.hosts), label="host")
        on_host = [g.uuid for g in self.gpus if g.host == host]
        uuids = data.draw(st.lists(st.sampled_from(on_host), min_size=1, max_size=3, unique=True), label="uuids")
        shares = data.draw(
            st.one_of(
                st.none(),
                st.lists(st.sampled_from([100, 250, 500, 600, 1000]), min_size=len(uuids), max_size=len(uuids)),
            ),
            label="shares",
        )
        holder = data.draw(st.sampled_from(sorted(self.alloc.holdings()) + [f"adopted-{self.serial}"]), label="holder")
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        self.serial += 1
        got, problems = self.alloc.adopt(holder, owner, host, uuids, shares)
        assert self.mirror.adopt(holder, owner, host, uuids, shares) == (got, problems)
        # What was refused is named; what was taken is all that was not refused.
        refused = {p.message.split()[0] for p in problems}
        assert set(got.uuids) == set(uuids) - refused

    @rule(data=st.data())
    def replace_host(self, data):
        """A host's devices change, as an agent's report says: some leave (held
        or not), some come back (still held), one changes model, a new one
        appears; or a host comes or goes."""
        host = data.draw(st.sampled_from(sorted(set(HOSTNAMES) | set(self.hosts))), label="host")
        known = sorted(self.ever.get(host, {}).values())
        kept = data.draw(st.lists(st.sampled_from(known), unique=True, max_size=8), label="kept") if known else []
        if kept and data.draw(st.integers(0, 3), label="remodel") == 0:
            model = data.draw(st.sampled_from(MODELS), label="model")
            gpu = kept.pop(0)
            kept.append(GPU(host, gpu.index, gpu.uuid, model, MEMORY[model]))
        for n in range(data.draw(st.integers(0, 2), label="new")):
            model = data.draw(st.sampled_from(MODELS), label="new model")
            self.serial += 1
            kept.append(GPU(host, len(known) + n, f"GPU-{host}-n{self.serial}", model, MEMORY[model]))
        inventory = [g for g in self.gpus if g.host != host] + kept
        if not inventory:
            return  # an allocator without devices has nothing to decide
        assert self.alloc.set_host_devices(host, reversed(kept)) == (
            sorted(kept) != [g for g in self.gpus if g.host == host]
        )
        self.mirror.set_inventory(list(reversed(inventory)))
        for gpu in kept:
            self.ever.setdefault(host, {})[gpu.uuid] = gpu
        self.gpus = sorted(inventory)
        self.by_uuid = {g.uuid: g for g in inventory}
        self.hosts = sorted({g.host for g in inventory})
        self.models = sorted({g.model for g in inventory})

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def mirror_agrees(self):
        assert self.alloc.holdings() == self.mirror.holdings()

    @invariant()
    def index_is_the_one_a_full_rebuild_makes(self):
        alloc, mirror = self.alloc._index, self.mirror._index
        assert alloc.gpus == mirror.gpus and alloc.by_host == mirror.by_host
        assert alloc.hosts == mirror.hosts == self.hosts
        assert list(alloc.models) == list(mirror.models) == self.models
        for model, mi in alloc.models.items():
            assert mi == mirror.models[model], model

    @invariant()
    def index_is_the_one_built_from_the_bookings_alone(self):
        """Both allocators change their indexes step by step; one built afresh from
        the bookings (each host ranked whole) must be the same."""
        index = self.alloc._index
        fresh = DeviceIndex(self.alloc._held, self.alloc._shares)
        fresh.available, fresh.keep_totals = index.available, index.keep_totals
        fresh.set_inventory(index.gpus.values())
        assert fresh.models == index.models

    @invariant()
    def sums_never_above_one_and_whole_never_shared(self):
        whole, shared = self.booked()  # asserts no device held whole twice
        assert not set(whole) & set(shared), "a device held whole is also shared"
        for uuid, holders in shared.items():
            assert 0 < sum(holders.values()) <= UNIT, f"{uuid} booked to {sum(holders.values())}"
        for a in self.alloc.holdings().values():
            assert {d.host for d in a.devices} <= {a.host}, "a holding spans hosts"

    @invariant()
    def views_match_a_recount(self):
        whole, shared = self.booked()
        for g in self.gpus:
            booked = self.alloc.booked_on(g.uuid)
            assert booked == ({whole[g.uuid]: UNIT} if g.uuid in whole else shared.get(g.uuid, {}))
            assert list(booked) == sorted(booked), "holders by name"
        for s in self.alloc.summary():
            avail = [g for g in self.gpus if g.model == s.model and self.is_available(g.host)]
            free = [g for g in avail if self.room(g) == UNIT]
            assert s.free == len(free)
            assert s.largest_block == max(Counter(g.host for g in free).values(), default=0)
            if s.shareable:
                assert s.largest_milli == max((self.room(g) for g in avail), default=0)
        for owner in OWNERS:
            assert self.alloc.milli_held_by(owner) == self.held(owner)


SharesMachine.TestCase.settings = SETTINGS
TestSharesStateMachine = SharesMachine.TestCase


def patched(module, name: str, value, doc: str):
    """The same machine with ``module.name`` set to ``value`` while it runs."""

    class Machine(SharesMachine):
        __doc__ = doc

        def __init__(self):
            super().__init__()
            self.saved = getattr(module, name)
            setattr(module, name, value)

        def teardown(self):
            setattr(module, name, self.saved)

    Machine.TestCase.settings = SETTINGS
    return Machine.TestCase


# As for a model on one host: every split looks at the hosts' devices directly.
TestScan = patched(allocator_index, "SCAN_HOSTS", 10**6, "No split ranks kept for any model.")
TestRanksAlways = patched(allocator_index, "SCAN_HOSTS", 0, "Split ranks kept also for a model on one host.")


@SETTINGS
@given(inventory=inventories(), shares=st.lists(st.sampled_from([100, 200, 250, 500, 600, 1200, 1500]), max_size=12))
def test_adopting_every_holding_rebuilds_the_same_state(inventory, shares):
    """After a hub restart, the holdings read back from labels give the same map."""
    config = {"*": {"quantum": 0.05, "split": True}}
    alloc = Allocator(inventory, sharing=config)
    for i, share in enumerate(shares):
        try:
            alloc.allocate(f"s{i}", Request(milli=share, owner=OWNERS[i % 2]))
        except AllocationRefused:
            pass
    fresh = Allocator(list(reversed(inventory)), sharing=config)
    for a in alloc.holdings().values():
        assert fresh.adopt(a.holder, a.owner, a.host, a.uuids, a.milli)[1] == []
    assert [fresh.booked_on(g.uuid) for g in inventory] == [alloc.booked_on(g.uuid) for g in inventory]
    assert fresh.summary() == alloc.summary()


BOOKED = [0, 0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1]  # per device: 0 untouched, 1 held whole


@settings(SETTINGS, max_examples=400)  # one host and one share: cheap, and uneven cases are rare in random states
@example(hosts=[[0.1, 0.75]], milli=1100, policy="pack", pinned=False)  # 0.9 + 0.2, no even split
@example(hosts=[[0.75, 0.5, 0.1], [0.6, 0.4]], milli=1150, policy="spread", pinned=False)
@given(
    hosts=st.lists(st.lists(st.sampled_from(BOOKED), min_size=1, max_size=4), min_size=1, max_size=3),
    milli=st.sampled_from([50 * k for k in range(1, 41)]),
    policy=st.sampled_from(["pack", "spread"]),
    pinned=st.booleans(),
)
def test_uneven_splits_only_where_no_even_split_fits(hosts, milli, policy, pinned):
    """With ``uneven``, a share no even split takes goes to the host with the
    least room in all that takes it, its freest devices first; every other
    decision is the one the even rules make."""
    gpus = [
        GPU(f"h{h}", i, f"GPU-{h}-{i}", MODELS[0], MEMORY[MODELS[0]])
        for h, row in enumerate(hosts)
        for i in range(len(row))
    ]
    even, uneven = (
        {MODELS[0]: {"quantum": 0.05, "split": True, "split_small": True, "uneven": u}} for u in (False, True)
    )
    allocators = [Allocator(gpus, policy, sharing=config) for config in (even, uneven)]
    rooms = {}
    for gpu, booked in zip(gpus, (b for row in hosts for b in row)):
        rooms[gpu] = UNIT - round(booked * UNIT)
        for alloc in allocators if booked else ():
            alloc.adopt(f"b-{gpu.uuid}", "bob", gpu.host, [gpu.uuid], None if booked == 1 else [to_milli(booked)])
    host = "h0" if pinned else None
    got = []
    for alloc in allocators:
        try:
            got.append(alloc.allocate("s", Request(host=host, milli=milli)))
        except AllocationRefused:
            got.append(None)
    if got[0] is not None:
        assert got[1] == got[0] and got[1].rule in (ONE_DEVICE, EVEN_SPLIT, None)
        return
    fits = sorted(
        (sum(rooms[g] for g in gpus if g.host == h), h)
        for h in {g.host for g in gpus}
        if (host is None or h == host) and sum(rooms[g] - rooms[g] % 50 for g in gpus if g.host == h) >= milli
    )
    if not fits:
        assert got[1] is None
        return
    h = fits[0][1]
    booking = {}
    for g in sorted((g for g in gpus if g.host == h), key=lambda g: (-rooms[g], g.index)):
        piece = min(rooms[g] - rooms[g] % 50, milli - sum(booking.values()))
        if piece > 0:
            booking[g] = piece
    assert got[1] is not None and got[1].rule == UNEVEN_SPLIT and got[1].booking() == booking
