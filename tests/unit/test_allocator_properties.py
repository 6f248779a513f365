"""Property tests: random inventories, random sequences of allocate / release /
set_available_hosts / adopt, checked step by step against a brute-force model.

The reference model (``Reference``) keeps the holdings as plain data and answers
every question by scanning every device; the allocator under test keeps indexes
for speed. After every step they must agree.

A refusal's retry flag is checked both ways: retry=False exactly when brute
force says the request can never be satisfied as asked.

Guards docs/security.md, "A user": "get a GPU another server holds, exceed the limit, or get more
than one device per whole GPU asked for".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpuspawner.allocator.allocator import (
    ALL,
    AdoptProblem,
    AdoptReason,
    Allocation,
    AllocationRefused,
    Allocator,
    Request,
)
from gpuspawner.core.inventory import GPU
from gpuspawner.core.sharing import UNIT

MODELS = ["NVIDIA GeForce GTX 1070", "NVIDIA A100 80GB PCIe", "NVIDIA Tesla T4"]
MEMORY = {MODELS[0]: 8192, MODELS[1]: 81920, MODELS[2]: 15360}
# Names whose sort order differs from any "natural" order, to exercise the tie-break.
HOSTNAMES = ["gpu-b", "gpu-a", "node-10", "node-02", "node-1", "x", "A-upper"]
OWNERS = ["alice", "bob", "carol"]
UNKNOWN_MODEL = "NVIDIA H100 80GB HBM3"
UNKNOWN_HOST = "gpu-gone"

SETTINGS = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the shared tree
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def inventories(draw) -> list[GPU]:
    """2..6 hosts, 1..8 GPUs each, 1..3 models; hosts mostly single-model."""
    hosts = draw(st.lists(st.sampled_from(HOSTNAMES), min_size=2, max_size=6, unique=True))
    models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True))
    out = []
    for host in hosts:
        n = draw(st.integers(1, 8))
        indices = draw(st.permutations(range(n)))  # declared indices in any list order
        if len(models) > 1 and draw(st.integers(0, 3)) == 0:
            kinds = draw(st.lists(st.sampled_from(models), min_size=n, max_size=n))
        else:
            kinds = [draw(st.sampled_from(models))] * n
        for pos, (index, model) in enumerate(zip(indices, kinds)):
            out.append(GPU(host, index, f"GPU-{host}-{pos}", model, MEMORY[model]))
    return out


@dataclass(frozen=True)
class Candidate:
    free: int  # free devices of `model` on `host` (for ALL: the host's total of it)
    host: str
    model: str
    devices: tuple[GPU, ...]  # what would be taken: lowest index first


class Reference:
    """Brute force over every device; holdings as plain data."""

    def __init__(self, gpus: list[GPU], policy: str):
        self.gpus = sorted(gpus, key=lambda g: (g.host, g.index))
        self.by_uuid = {g.uuid: g for g in gpus}
        self.hosts = sorted({g.host for g in gpus})
        self.models = sorted({g.model for g in gpus})
        self.policy = policy
        self.available: set[str] | None = None
        self.held: dict[str, Allocation] = {}

    def is_available(self, host: str) -> bool:
        return self.available is None or host in self.available

    def holder_of(self, uuid: str) -> str | None:
        return self.held_map().get(uuid)

    def booked_on(self, uuid: str) -> dict[str, int]:
        holder = self.holder_of(uuid)
        return {} if holder is None else {holder: UNIT}

    def held_map(self) -> dict[str, str]:
        """uuid -> holder, recounted from the holdings every time."""
        return {d.uuid: holder for holder, a in self.held.items() for d in a.devices}

    def milli_held_by(self, owner: str) -> int:
        return sum(len(a.devices) for a in self.held.values() if a.owner == owner) * UNIT

    def devices(self, host: str, model: str) -> list[GPU]:
        return [g for g in self.gpus if g.host == host and g.model == model]

    def free(self, host: str, model: str) -> list[GPU]:
        held = self.held_map()
        return [g for g in self.devices(host, model) if g.uuid not in held]

    def rank(self, n: int) -> int:
        return n if self.policy == "pack" else -n

    def candidates(self, req: Request, limit: int | None) -> list[Candidate]:
        """Every (host, model) that could take the request right now."""
        if req.model is not None and req.model not in self.models:
            return []
        owner_holds = self.milli_held_by(req.owner) / UNIT  # GPUs; shares count as their fraction
        if limit is not None and req.count != ALL and owner_holds + req.count > limit:
            return []
        out = []
        for model in [req.model] if req.model is not None else self.models:
            for host in self.hosts:
                if (req.host is not None and host != req.host) or not self.is_available(host):
                    continue
                every, free = self.devices(host, model), self.free(host, model)
                if not every:
                    continue
                if req.count == ALL:
                    fits = len(free) == len(every) and (limit is None or owner_holds + len(free) <= limit)
                    take = len(free)
                else:
                    fits, take = len(free) >= req.count, req.count
                if fits:
                    out.append(Candidate(len(free), host, model, tuple(free[:take])))
        return out

    def best(self, cands: list[Candidate]) -> Candidate:
        """The documented rule: least (pack) / most (spread) free, then hostname, then model."""
        return min(cands, key=lambda c: (self.rank(c.free), c.host, c.model))

    def never_satisfiable(self, req: Request, limit: int | None) -> bool:
        """No state of holdings and availability could ever grant this request."""
        if req.model is not None and req.model not in self.models:
            return True
        if req.host is not None and req.host not in self.hosts:
            return True
        if limit is not None and req.count != ALL and req.count > limit:
            return True
        for model in [req.model] if req.model is not None else self.models:
            for host in [req.host] if req.host is not None else self.hosts:
                n = len(self.devices(host, model))
                if (
                    n
                    and (req.count == ALL or n >= req.count)
                    and (limit is None or (n if req.count == ALL else req.count) <= limit)
                ):
                    return False
        return True


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(inventory=inventories(), policy=st.sampled_from(["pack", "spread"]))
    def setup(self, inventory: list[GPU], policy: str):
        self.ref = Reference(inventory, policy)
        self.alloc = Allocator(inventory, policy)
        # The same operations on an allocator fed the inventory in reverse order
        # must give the same answers: decisions depend on state only.
        self.mirror = Allocator(list(reversed(inventory)), policy)
        self.serial = 0

    # -- operations -----------------------------------------------------------

    @rule(data=st.data())
    def allocate(self, data):
        ref = self.ref
        model = data.draw(st.sampled_from(ref.models + [None, None, UNKNOWN_MODEL]), label="model")
        count = data.draw(st.one_of(st.integers(1, 9), st.integers(1, 3), st.just(ALL)), label="count")
        host = data.draw(st.one_of(st.none(), st.none(), st.sampled_from(ref.hosts + [UNKNOWN_HOST])), label="host")
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        limit = data.draw(st.one_of(st.none(), st.integers(1, 8)), label="max_per_owner")
        req = Request(model=model, count=count, host=host, owner=owner)
        self.serial += 1
        holder = f"s{self.serial}"

        cands = ref.candidates(req, limit)
        available_now = {h for h in ref.hosts if ref.is_available(h)}
        try:
            got = self.alloc.allocate(holder, req, max_per_owner=limit)
        except AllocationRefused as e:
            got, refused = None, e
        try:
            mirrored = self.mirror.allocate(holder, req, max_per_owner=limit).uuids
        except AllocationRefused as e:
            mirrored = e.message
        assert mirrored == (refused.message if got is None else got.uuids)

        if got is None:
            assert not cands, f"refused ({refused.message}) although {cands[0]} fits"
            assert refused.status == (409 if refused.retry else 400)
            if not refused.retry:
                assert ref.never_satisfiable(req, limit), f"retry=False for a satisfiable request: {refused.message}"
            if ref.never_satisfiable(req, limit):
                assert not refused.retry, refused.message
            return

        assert cands, f"granted {got} although brute force finds no fitting host"
        # One host, one model, available at the time of the decision, the right size.
        assert got.host in available_now
        assert {d.host for d in got.devices} == {got.host}
        assert len({d.model for d in got.devices}) == 1
        assert got.devices and len(got.devices) <= sum(1 for g in ref.gpus if g.host == got.host)
        assert all(ref.holder_of(d.uuid) is None for d in got.devices), "handed out a held device"
        assert (got.holder, got.owner) == (holder, owner)

        best = ref.best(cands)
        chosen = next((c for c in cands if (c.host, c.model) == (got.host, got.model)), None)
        assert chosen is not None, f"{got.host}/{got.model} does not fit the request"
        assert got.devices == chosen.devices, "devices not taken lowest index first"
        if req.count != ALL:
            assert len(got.devices) == req.count
        else:
            assert len(got.devices) == len(ref.devices(got.host, got.model))
        assert chosen == best, f"{ref.policy} chose {chosen}, brute force says {best}"
        ref.held[holder] = got

    @rule(data=st.data())
    def release(self, data):
        ref = self.ref
        holder = data.draw(st.sampled_from(sorted(ref.held) + ["nobody"]), label="holder")
        expected = ref.held.pop(holder, None)
        assert self.alloc.release(holder) == expected
        assert self.mirror.release(holder) == expected
        assert self.alloc.release(holder) is None  # idempotent

    @rule(data=st.data())
    def set_available_hosts(self, data):
        ref = self.ref
        hosts = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(ref.hosts + [UNKNOWN_HOST]))), label="available")
        ref.available = hosts
        self.alloc.set_available_hosts(hosts)
        self.mirror.set_available_hosts(None if hosts is None else sorted(hosts, reverse=True))

    @rule(data=st.data())
    def adopt(self, data):
        ref = self.ref
        holder = data.draw(st.sampled_from(sorted(ref.held) + [f"adopted-{self.serial}"]), label="holder")
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        host = data.draw(st.sampled_from(ref.hosts), label="host")
        same_host = [g.uuid for g in ref.gpus if g.host == host]
        uuids = data.draw(
            st.lists(st.sampled_from(same_host + list(ref.by_uuid) + ["GPU-not-there"]), max_size=4, unique=True),
            label="uuids",
        )
        self.serial += 1

        problems, devices = [], []
        for uuid in uuids:
            gpu, other = ref.by_uuid.get(uuid), ref.holder_of(uuid)
            if gpu is None:
                problems.append(AdoptProblem(AdoptReason.NOT_IN_INVENTORY, f"{uuid} is not in the inventory"))
            elif other is not None and other != holder:
                problems.append(AdoptProblem(AdoptReason.HELD_BY_ANOTHER, f"{uuid} is also held by {other}"))
            elif gpu.host != host:
                problems.append(AdoptProblem(AdoptReason.ON_ANOTHER_HOST, f"{uuid} is on {gpu.host}, not on {host}"))
            else:
                devices.append(gpu)
        old = ref.held.get(holder)
        if old is not None and set(old.devices) == set(devices):
            expected = old  # unchanged (also its owner)
        else:
            expected = Allocation(holder=holder, owner=owner, host=host, devices=tuple(devices))
        got, got_problems = self.alloc.adopt(holder, owner, host, uuids)
        assert (got, got_problems) == (expected, problems)
        assert self.mirror.adopt(holder, owner, host, uuids) == (expected, problems)
        ref.held[holder] = expected

    # -- invariants -------------------------------------------------------------

    @invariant()
    def holdings_match_the_reference(self):
        assert self.alloc.holdings() == self.ref.held
        assert self.mirror.holdings() == self.ref.held

    @invariant()
    def exclusive_devices(self):
        holdings = self.alloc.holdings()
        seen = Counter(d.uuid for a in holdings.values() for d in a.devices)
        assert not [u for u, n in seen.items() if n > 1], "a device is held twice"
        for uuid in self.ref.by_uuid:
            assert self.alloc.booked_on(uuid) == self.ref.booked_on(uuid)
        per_host = Counter(g.host for g in self.ref.gpus)
        for a in holdings.values():
            assert {d.host for d in a.devices} <= {a.host}
            assert len(a.devices) <= per_host[a.host]

    @invariant()
    def summary_matches_a_recount(self):
        ref, holdings = self.ref, self.alloc.holdings()
        held = {d.uuid for a in holdings.values() for d in a.devices}
        summary = self.alloc.summary()
        assert [s.model for s in summary] == ref.models
        for s in summary:
            mine = [g for g in ref.gpus if g.model == s.model]
            avail = [g for g in mine if ref.is_available(g.host)]
            free = [g for g in avail if g.uuid not in held]
            held_here = [g for g in avail if g.uuid in held]
            per_host = Counter(g.host for g in free)
            assert s.total == len(mine)
            assert s.free == len(free)
            assert s.unavailable == len(mine) - len(avail)
            assert s.largest_block == max(per_host.values(), default=0)
            assert s.memory_mib == max(g.memory_mib for g in mine)
            # free + held == total, with devices on unavailable hosts counted apart.
            assert s.free + len(held_here) + s.unavailable == s.total

    @invariant()
    def owner_counts(self):
        for owner in OWNERS:
            assert self.alloc.milli_held_by(owner) == self.ref.milli_held_by(owner)


AllocatorMachine.TestCase.settings = SETTINGS
TestAllocatorStateMachine = AllocatorMachine.TestCase


# --------------------------------------------------------------------------
# A single decision on a random state: the chosen host is the brute-force one.
# --------------------------------------------------------------------------


@st.composite
def states(draw):
    inventory = draw(inventories())
    policy = draw(st.sampled_from(["pack", "spread"]))
    alloc, ref = Allocator(inventory, policy), Reference(inventory, policy)
    # Random holdings via adopt (as after a restart), one host per holder.
    for i, host in enumerate(draw(st.lists(st.sampled_from(ref.hosts), max_size=6))):
        on_host = [g.uuid for g in ref.gpus if g.host == host and ref.holder_of(g.uuid) is None]
        uuids = draw(st.lists(st.sampled_from(on_host), unique=True, max_size=len(on_host))) if on_host else []
        got, problems = alloc.adopt(f"r{i}", OWNERS[i % 3], host, uuids)
        assert problems == []
        ref.held[f"r{i}"] = got
    if draw(st.booleans()):
        ref.available = draw(st.sets(st.sampled_from(ref.hosts)))
        alloc.set_available_hosts(ref.available)
    return alloc, ref


@SETTINGS
@given(state=states(), model_pick=st.integers(0, 3), count=st.integers(1, 8))
def test_single_model_choice_is_the_brute_force_choice(state, model_pick, count):
    alloc, ref = state
    model = ref.models[model_pick % len(ref.models)]
    req = Request(model, count)
    cands = ref.candidates(req, None)
    try:
        got = alloc.allocate("new", req)
    except AllocationRefused as e:
        assert not cands, f"refused ({e.message}) although {ref.best(cands)} fits"
        return
    assert cands, "granted although nothing fits"
    best = ref.best(cands)
    assert (got.host, got.model, got.devices) == (best.host, best.model, best.devices)
