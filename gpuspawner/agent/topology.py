"""How the node's GPUs are linked, read through NVML for the report's ``topology``.

Per pair of GPUs: the PCIe path (``nvmlDeviceGetTopologyCommonAncestor``) and how
many NVLinks join them, counted from each side over the GPU's links
(``nvmlDeviceGetNvLinkState``, ``nvmlDeviceGetNvLinkRemotePciInfo``, the peer
found by its PCI bus id); a link to an NVSwitch joins its GPU to every other GPU
with switch links, as many as the fewer of the two have. Per GPU: its NUMA node
(``nvmlDeviceGetNumaNodeId``, on drivers that have it). A call the driver lacks or
that fails leaves that value unknown (null), never "no link"; a GPU without NVLink
(NVML says "not supported") has none. MIG devices have no links: only whole GPUs
are looked at. Imports nothing of the hub's side.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Mapping

__all__ = ["Seen", "nvlinks_between", "read_topology"]

MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS

# What one GPU's links lead to: (NVLinks to each peer GPU, by UUID; NVLinks to NVSwitches); None: not known.
Seen = tuple[Counter, int] | None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_topology(nvml, gpus: list[tuple[str, object]]) -> dict:
    """``{"links": [{"a", "b", "path", "nvlinks"}], "numa": {uuid: node}}`` for the
    whole GPUs ``gpus`` ((UUID, NVML handle), in index order)."""
    buses: dict[str, str] = {}
    for uuid, handle in gpus:
        try:
            buses[_text(nvml.nvmlDeviceGetPciInfo_v3(handle).busId).upper()] = uuid
        except nvml.NVMLError:
            pass  # its peers cannot name it: their links to it stay unknown
    every = len(buses) == len(gpus)  # else a peer not found may be one of ours: not an NVSwitch
    seen = {uuid: _nvlinks(nvml, handle, buses, every) for uuid, handle in gpus}
    links = []
    for i, (a, ha) in enumerate(gpus):
        for b, hb in gpus[i + 1 :]:
            links.append({"a": a, "b": b, "path": _path(nvml, ha, hb), "nvlinks": nvlinks_between(seen, a, b)})
    numa = {}
    for uuid, handle in gpus:
        try:
            numa[uuid] = _numa_node(nvml, handle)
        except nvml.NVMLError:
            pass  # older drivers lack the call: not known
    return {"links": links, "numa": numa}


def _numa_node(nvml, handle) -> int:
    """The GPU's NUMA node. Bindings older than the call (nvidia-ml-py before 12.535)
    lack its wrapper: the driver's own function then, as the bindings look one up."""
    call = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if call is not None:
        return int(call(handle))
    node = ctypes.c_uint()
    nvml._nvmlCheckReturn(nvml._nvmlGetFunctionPointer("nvmlDeviceGetNumaNodeId")(handle, ctypes.byref(node)))
    return node.value


def _path(nvml, a, b) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except nvml.NVMLError:
        return None


def _nvlinks(nvml, handle, buses: dict[str, str], every: bool) -> Seen:
    """(NVLinks to each peer GPU, NVLinks to NVSwitches) of one GPU; None: not known.
    ``every``: each GPU's bus id is known, so a peer not among them is an NVSwitch."""
    peers: Counter = Counter()
    switch = 0
    for link in range(MAX_LINKS):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                continue  # inactive
            remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).upper()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            break  # no NVLink at all, or past its last link
        except nvml.NVMLError:
            return None
        if remote in buses:
            peers[buses[remote]] += 1
        elif every and remote:
            switch += 1  # not a GPU of this node: an NVSwitch
        else:
            return None
    return peers, switch


def nvlinks_between(seen: Mapping[str, Seen], a: str, b: str) -> int | None:
    """The NVLinks joining GPUs ``a`` and ``b``, from what each GPU's links lead to
    (``seen``, by UUID): those to each other, plus, through NVSwitches, as many as the
    fewer of the two have to them; the same counted from both sides, else None (not
    known). Pure: the benchmarks count the fake NVML's links with it too."""
    sa, sb = seen[a], seen[b]
    if sa is None or sb is None:
        return None
    via = min(sa[1], sb[1])
    ab, ba = sa[0][b] + via, sb[0][a] + via
    return ab if ab == ba else None
