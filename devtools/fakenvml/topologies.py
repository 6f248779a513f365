"""Multi-GPU nodes for the fake NVML, each with how its GPUs are linked: a DGX-1 with
V100s (the hybrid cube-mesh: NVLink to four peers each, two of them doubled, two
quads on two CPUs), a PCIe workstation with NVLink-bridged pairs on two sockets, and
an NVSwitch box (every GPU's links go to the switches: all pairs alike). Feed a
node's devices to ``write_devices``; ``prefix`` keeps the UUIDs of two nodes apart.
"""

from __future__ import annotations

V100 = "Tesla V100-SXM2-32GB"
RTX = "NVIDIA RTX A6000"
H100 = "NVIDIA H100 80GB HBM3"

# Path levels (NVML's): 0 board, 10 one switch, 20 several, 30 host bridge, 40 same CPU, 50 across CPUs.
_DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip
_DGX1_SWITCH = {(0, 1), (2, 3), (4, 5), (6, 7)}  # the pairs behind one PCIe switch; the rest of a quad: host bridge


def _node(
    prefix: str, model: str, memory_mib: int, n: int, nvlinks: dict, path, numa, switch_links: int = 0
) -> list[dict]:
    devices = []
    for i in range(n):
        peers: list[int | str] = [
            j
            for (a, b), k in sorted(nvlinks.items())
            for j in ([b] if a == i else [a] if b == i else [])
            for _ in range(k)
        ]
        peers += ["switch"] * switch_links
        devices.append(
            dict(
                index=i,
                uuid=f"GPU-{prefix}-0000-4000-8000-{i:012d}",
                name=model,
                memory_total_mib=memory_mib,
                memory_used_mib=0,
                util_gpu=0,
                temp_c=40,
                bus=f"00000000:{0x10 + i:02X}:00.0",
                numa=numa(i),
                paths=[None if j == i else path(i, j) for j in range(n)],
                **({"nvlinks": peers} if peers else {}),
            )
        )
    return devices


def dgx1(prefix: str = "d9a10000") -> list[dict]:
    """A DGX-1 with 8 V100s."""

    def path(a: int, b: int) -> int:
        if a // 4 != b // 4:
            return 50
        return 10 if (min(a, b), max(a, b)) in _DGX1_SWITCH else 30

    return _node(prefix, V100, 32768, 8, _DGX1_NVLINKS, path, lambda i: i // 4)


def pcie_pairs(prefix: str = "a6000000") -> list[dict]:
    """4 RTX A6000s in a PCIe workstation on two sockets, NVLink bridges joining 0-1 and 2-3."""
    return _node(
        prefix, RTX, 49140, 4, {(0, 1): 4, (2, 3): 4}, lambda a, b: 40 if a // 2 == b // 2 else 50, lambda i: i // 2
    )


def nvswitch(prefix: str = "4c100000") -> list[dict]:
    """8 H100s whose 18 NVLinks each go to the NVSwitches (all pairs alike)."""
    return _node(prefix, H100, 81559, 8, {}, lambda a, b: 40 if a // 4 == b // 4 else 50, lambda i: i // 4, 18)
