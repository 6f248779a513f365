"""Host-network ports: handed out in turn, never two servers on one port (pure)."""

from gpuspawner.cluster import GPUCluster


def test_ports_go_round_the_range_and_skip_taken_ones():
    cluster = GPUCluster([])
    first = cluster.pick_port("a", 100, 102)
    assert 100 <= first <= 102
    second = cluster.pick_port("b", 100, 102)
    assert second == (first - 100 + 1) % 3 + 100  # the next one, wrapping at the end
    assert cluster.pick_port("a", 100, 102) == first  # a holder keeps its port
    cluster.release("a")
    third = cluster.pick_port("c", 100, 102)
    assert third not in (second,) and third == (second - 100 + 1) % 3 + 100
    # a freed port is reused only once the turn comes back to it
    assert cluster.pick_port("d", 100, 102) == first
    assert cluster.pick_port("e", 100, 102) is None  # all three taken
