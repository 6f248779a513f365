"""The allocator with each host's CPU and memory (gpuspawner.allocator.resources;
pure), requests that accept any of several models, and servers without GPUs that
the allocator places.

The property test's oracle is brute force over the allocator's own rules: the
same state in a second allocator where every host without the CPU and memory
asked for is made unavailable must make the same choice for the same request
without CPU and memory."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.allocator.allocator import AllocationRefused, Allocator, Refusal, Request
from gpuspawner.core.inventory import GPU

A100, T4 = "NVIDIA A100 80GB PCIe", "NVIDIA Tesla T4"
SHARING = {A100: {"quantum": 0.05, "split": True}, T4: {"quantum": 0.05}}


def gpus(host: str, model: str, n: int) -> list[GPU]:
    return [GPU(host, i, f"{host}-{i}", model, 81920 if model == A100 else 15360) for i in range(n)]


def cluster(policy: str = "pack") -> Allocator:
    a = Allocator(gpus("gpu-a", A100, 2) + gpus("gpu-b", A100, 4) + gpus("gpu-t", T4, 2), policy, SHARING)
    for host in ("gpu-a", "gpu-b", "gpu-t"):
        a.set_host_resources(host, 32_000, 256 * 1024)
    a.set_host_resources("cpu-1", 16_000, 64 * 1024)  # a node without GPUs
    return a


def test_a_host_without_the_memory_asked_for_is_passed_over_and_a_refusal_names_memory():
    a = cluster()
    a.set_host_reserved("gpu-a", {"db": (0, 250 * 1024)})  # another service reserved most of gpu-a's memory
    got = a.allocate("s1", Request(model=A100, count=1, memory_mib=16 * 1024))
    assert got.host == "gpu-b"  # pack would take gpu-a (fewer free), but its memory is taken
    assert a.resources.free("gpu-b") == (32_000, 240 * 1024)
    a.set_host_reserved("gpu-b", {"db": (0, 250 * 1024), "s1": (0, 16 * 1024)})  # s1: held, counted once
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("s2", Request(model=A100, count=1, memory_mib=16 * 1024))
    assert exc.value.reason is Refusal.RESOURCES_SHORT and exc.value.status == 409
    assert exc.value.message == (
        f"2 {A100} free on gpu-a, but only 6.0 GiB of memory left there; try again later, or ask for less CPU or memory"
    )
    a.release("s1")
    assert a.resources.free("gpu-b") == (32_000, 6 * 1024)  # its memory came back


def test_a_share_needs_the_cpu_too_and_the_refusal_names_cpus():
    a = cluster()
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("s", Request(model=T4, milli=250, cpu_milli=40_000))
    assert exc.value.reason is Refusal.RESOURCES_SHORT
    assert exc.value.message.startswith(f"Room for 0.25 of a {T4} on gpu-t, but only 32 CPUs left there")
    got = a.allocate("s", Request(model=T4, milli=250, cpu_milli=30_000))
    assert got.host == "gpu-t" and a.resources.free("gpu-t")[0] == 2_000


def test_a_host_whose_resources_are_not_known_is_not_limited():
    a = Allocator(gpus("gpu-x", A100, 1))
    assert a.allocate("s", Request(model=A100, count=1, cpu_milli=10**9)).host == "gpu-x"


def test_bad_amounts_are_refused_and_change_nothing():
    a = cluster()
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(AllocationRefused, match="cpu_milli must be a whole number"):
            a.allocate("s", Request(model=A100, cpu_milli=bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_mib must be a whole number"):
        a.set_host_resources("gpu-a", 1000, -5)
    assert a.holdings() == {}


def test_a_server_without_gpus_goes_to_a_node_without_gpus_first_then_where_fewest_are_free():
    a = cluster()
    first = a.allocate("c1", Request(count=0, cpu_milli=8_000, memory_mib=8 * 1024))
    assert first.host == "cpu-1" and first.devices == ()
    # cpu-1 has 8 CPUs left: too few. gpu-a and gpu-t have 2 free GPUs each, the same
    # CPU: by name. Once one T4 is taken, gpu-t has the fewest free GPUs.
    assert a.allocate("c2", Request(count=0, cpu_milli=10_000)).host == "gpu-a"
    a.allocate("t", Request(model=T4, count=1))
    assert a.allocate("c3", Request(count=0, cpu_milli=10_000)).host == "gpu-t"
    a.allocate("g", Request(model=A100, count=2))  # gpu-a's GPUs all taken: none free there
    assert a.allocate("c5", Request(count=0, cpu_milli=10_000)).host == "gpu-a"
    a.release("c1")
    assert a.resources.free("cpu-1") == (16_000, 64 * 1024)
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("c4", Request(count=0, cpu_milli=64_000))
    assert exc.value.reason is Refusal.NONE_FREE and "CPU and memory" in exc.value.message


def test_a_server_without_gpus_cannot_be_placed_where_no_node_is_known():
    with pytest.raises(AllocationRefused, match="No node's CPU and memory are known"):
        Allocator(gpus("gpu-x", A100, 1)).allocate("c", Request(count=0))


def test_any_of_several_models_lands_on_whichever_is_free():
    a = cluster()
    a.allocate("x", Request(model=A100, count=2))
    a.allocate("y", Request(model=A100, count=4))
    got = a.allocate("z", Request(models=(A100, T4), count=1))
    assert got.model == T4
    share = a.allocate("w", Request(models=(T4, A100), milli=500))
    assert share.model == T4
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("v", Request(models=(A100,), count=1))
    assert exc.value.reason is Refusal.NONE_FREE and exc.value.retry
    assert exc.value.message.startswith(f"None of {A100} is free for this request right now: ")
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("v", Request(models=(A100, "NVIDIA H100"), count=1))
    assert exc.value.reason is Refusal.UNKNOWN_MODEL


def test_an_any_of_request_is_refused_as_each_model_would_refuse_it():
    a = cluster()
    # No node has 5 of either: never, as asked (not to be retried, so it never waits in line).
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("v", Request(models=(A100, T4), count=5))
    assert not exc.value.retry and A100 in exc.value.message and T4 in exc.value.message
    # Over the owner's limit on both: the limit, as a single model says it.
    a.allocate("mine", Request(model=T4, count=1, owner="ann"))
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("v", Request(models=(A100, T4), count=1, owner="ann"), max_per_owner=1)
    assert exc.value.reason is Refusal.LIMIT_REACHED
    # A share of a model whose shares cannot be split, for more than one GPU: never.
    with pytest.raises(AllocationRefused) as exc:
        a.allocate("v", Request(models=(T4,), milli=1500))
    assert not exc.value.retry


def test_a_server_without_gpus_may_go_to_a_host_with_two_models_and_keeps_to_a_pinned_host():
    a = Allocator(gpus("mixed", A100, 1) + [GPU("mixed", 1, "mixed-t4", T4, 15360)] + gpus("big", A100, 4), "pack")
    a.set_host_resources("mixed", 8_000, 8192)
    assert a.allocate("c", Request(count=0, cpu_milli=1000)).host == "mixed"  # 1 + 1 free: fewer than big's
    a.set_host_resources("big", 8_000, 8192)
    assert a.allocate("d", Request(count=0, cpu_milli=1000, host="big")).host == "big"


HOSTS = ["h1", "h2", "h3", "h4", "h5"]


@st.composite
def states(draw):
    inventory = []
    for host in HOSTS:
        inventory += gpus(host, draw(st.sampled_from([A100, T4])), draw(st.integers(1, 4)))
    cpus = {h: draw(st.integers(0, 8)) * 1000 for h in HOSTS}
    requests = draw(
        st.lists(
            st.tuples(
                st.sampled_from([None, A100, T4]),
                st.one_of(
                    st.integers(1, 3).map(lambda n: ("count", n)),
                    st.sampled_from([100, 250, 500, 1500]).map(lambda m: ("milli", m)),
                ),
                st.integers(0, 4).map(lambda c: c * 1000),
            ),
            min_size=1,
            max_size=12,
        )
    )
    return inventory, cpus, requests, draw(st.sampled_from(["pack", "spread"]))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_the_choice_is_the_one_made_among_only_the_hosts_that_have_the_cpu(state):
    inventory, cpus, requests, policy = state
    a = Allocator(inventory, policy, SHARING)
    for h, cpu in cpus.items():
        a.set_host_resources(h, cpu, 1024)
    for i, (model, (kind, amount), cpu) in enumerate(requests):
        asked = {"count": amount} if kind == "count" else {"milli": amount}
        oracle = Allocator(inventory, policy, SHARING)
        for holder, held in a.holdings().items():
            oracle.adopt(holder, held.owner, held.host, held.uuids, held.milli)
        fitting = [h for h in HOSTS if a.resources.free(h)[0] >= cpu]
        oracle.set_available_hosts(fitting)
        try:
            expected = oracle.allocate(f"s{i}", Request(model=model, **asked))
        except AllocationRefused:
            expected = None
        try:
            got = a.allocate(f"s{i}", Request(model=model, cpu_milli=cpu, **asked))
        except AllocationRefused as exc:
            assert expected is None, (exc.message, expected)
            continue
        assert expected is not None and (got.host, got.booking()) == (expected.host, expected.booking())
        assert got.cpu_milli == cpu and a.resources.free(got.host)[0] >= 0


@settings(max_examples=100, deadline=None, database=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("take"), st.sampled_from(["s0", "s1", "s2", "x"]), st.sampled_from([0, 1]), st.integers(0, 3)
            ),
            st.tuples(st.just("give"), st.sampled_from(["s0", "s1", "s2", "x"])),
            st.tuples(
                st.just("running"),
                st.sampled_from(HOSTS),
                st.dictionaries(st.sampled_from(["s0", "s1", "x", "other"]), st.integers(0, 3), max_size=3),
            ),
            st.tuples(st.just("host"), st.sampled_from(HOSTS), st.sampled_from([None, 4, 8])),
        ),
        max_size=25,
    )
)
def test_the_free_cpu_kept_between_decisions_is_always_what_it_would_be_worked_out_afresh(ops):
    """free() is kept per host between decisions (placement asks it of hundreds of hosts):
    after any mix of bookings, give-backs, what the swarm says runs, and a host's size
    changing, it equals what the module's rule gives from scratch."""
    a = Allocator([g for h in HOSTS for g in gpus(h, T4, 1)], "pack", SHARING)
    has, running = {}, {}
    for h in HOSTS:
        a.set_host_resources(h, 8000, 1024)
        has[h] = 8000
    for op in ops:
        if op[0] == "take":
            if op[1] in a.holdings():
                continue
            try:
                a.allocate(op[1], Request(count=op[2], cpu_milli=op[3] * 1000))
            except AllocationRefused:
                pass
        elif op[0] == "give":
            if a.release(op[1]) is None:
                continue
            for services in running.values():  # forgotten until the swarm says it runs again
                services.pop(op[1], None)
        elif op[0] == "running":
            running[op[1]] = {name: cpu * 1000 for name, cpu in op[2].items()}
            a.set_host_reserved(op[1], {name: (cpu, 0) for name, cpu in running[op[1]].items()})
        else:
            has[op[1]] = None if op[2] is None else op[2] * 1000
            a.set_host_resources(op[1], has[op[1]], None if op[2] is None else 1024)
        held = a.holdings()
        for h in HOSTS:
            if has[h] is None:
                assert a.resources.free(h) is None
                continue
            ours = sum(x.cpu_milli for x in held.values() if x.host == h)
            others = sum(c for n, c in running.get(h, {}).items() if (n not in held or held[n].host != h))
            assert a.resources.free(h)[0] == has[h] - others - ours, (h, op)
