"""Ports for servers on host networking: one per server, handed out in turn."""

from __future__ import annotations

import random

from gpuspawner.holdings.ports import PortPool


def test_ports_go_in_turn_and_a_freed_one_is_not_reused_at_once():
    random.seed(0)
    pool = PortPool()
    first = pool.pick("a", 9000, 9002)
    assert pool.pick("a", 9000, 9002) == first  # the one it holds
    second = pool.pick("b", 9000, 9002)
    assert second == (first - 9000 + 1) % 3 + 9000
    pool.release("a")
    third = pool.pick("c", 9000, 9002)
    assert third not in (first, second)
    assert pool.pick("d", 9000, 9002) == first  # only now, the range gone round
    assert pool.pick("e", 9000, 9002) is None


def test_a_port_held_by_a_server_found_running_is_not_handed_out():
    pool = PortPool()
    pool.hold("running", 9001)
    assert {pool.pick("x", 9000, 9001), pool.pick("y", 9000, 9001)} == {9000, None}
    assert pool.held == {"running": 9001, "x": 9000}
