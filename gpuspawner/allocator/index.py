"""The allocator's index of the inventory: which devices exist, which are
untouched, and how much room the shared ones have left (pure).

Untouched devices are indexed per model in buckets by how many a host has
free, so a decision scans at most (devices per host) buckets, not every host;
devices with shares and room left are kept sorted by room. Every change
touches only the hosts it concerns.

The bookings themselves (who holds what) are the allocator's: the index reads
them when a host is indexed, and is told of each device taken or given back.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Mapping
from itertools import zip_longest

from ..core.inventory import GPU
from ..core.sharing import UNIT
from .model import ModelIndex, total_room
from .rooms import Rooms

__all__ = ["SCAN_HOSTS", "DeviceIndex"]

# A model on at most this many hosts keeps no split ranks (``ModelIndex.scan``),
# only each host's rooms (``ModelIndex.ranked``): there a split looks at those
# directly, which costs less than keeping the ranks up to date on every change.
SCAN_HOSTS = 1

# The order of one host's devices (GPU's own order there: host, then index, then
# UUID), made in C: a host's free and shared lists are kept sorted by it.
_ORDER = operator.attrgetter("index", "uuid")


class DeviceIndex:
    """The inventory, indexed per model. ``held`` (uuid -> holder, devices held
    whole) and ``shares`` (uuid -> {holder: milli}) are the allocator's
    bookings, read here only."""

    def __init__(self, held: Mapping[str, str], shares: Mapping[str, Mapping[str, int]]):
        self._held = held
        self._shares = shares
        self.gpus: dict[str, GPU] = {}
        self.available: set[str] | None = None  # None: every inventory host
        self.models: dict[str, ModelIndex] = {}  # by model name
        self.hosts: list[str] = []  # sorted
        self.by_host: dict[str, list[GPU]] = {}  # host -> its inventory devices, sorted
        self.keep_totals = False  # ModelIndex.totals kept up to date (uneven splits need them)

    def is_available(self, host: str) -> bool:
        return self.available is None or host in self.available

    # -- the inventory -----------------------------------------------------------

    def set_inventory(self, gpus: Iterable[GPU]) -> None:
        self.gpus = {g.uuid: g for g in gpus}
        self.models = {}
        self.by_host = {}
        for gpu in sorted(self.gpus.values()):
            devices = self.by_host.get(gpu.host)
            if devices is None:  # not setdefault: that would build a list per device
                devices = self.by_host[gpu.host] = []
            devices.append(gpu)
        for host, devices in self.by_host.items():  # by hostname: the buckets are filled in order
            self._index_host(host, devices)
        self._finish_models(set(self.models))
        self.hosts = list(self.by_host)

    def set_host_devices(self, host: str, new: list[GPU]) -> bool:
        """Replace one host's devices (``new``: sorted, all of ``host``); a UUID
        another host has moves here. True when the host's devices changed."""
        if new == self.by_host.get(host, []):
            return False
        touched: set[str] = set()
        uuids = {g.uuid for g in new}
        others = {self.gpus[u].host for u in uuids if u in self.gpus} - {host}
        for other in sorted(others):  # devices that moved here leave their old host first
            touched |= self._replace_host(other, [g for g in self.by_host[other] if g.uuid not in uuids])
        touched |= self._replace_host(host, new)
        self._finish_models(touched)
        return True

    def _replace_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Take the host's devices out of the index and put ``gpus`` (sorted) in;
        the models touched, for :meth:`_finish_models`."""
        old = self.by_host.pop(host, [])
        touched = self._unindex_host(host, old)
        for gpu in old:
            del self.gpus[gpu.uuid]
        if not gpus:
            del self.hosts[bisect.bisect_left(self.hosts, host)]
            return touched
        if not old:
            bisect.insort(self.hosts, host)
        self.by_host[host] = gpus
        for gpu in gpus:
            self.gpus[gpu.uuid] = gpu
        return touched | self._index_host(host, gpus)

    def _index_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Put a host's devices (sorted, in ``gpus``) into the index; the models touched."""
        available = self.is_available(host)
        by_model: dict[str, list[GPU]] = {}
        for gpu in gpus:
            devices = by_model.get(gpu.model)
            if devices is None:
                devices = by_model[gpu.model] = []
            devices.append(gpu)
        for model, devices in by_model.items():
            mi = self.models.get(model)
            if mi is None:
                mi = self.models[model] = ModelIndex()
            n = len(devices)
            mi.total[host] = n
            mi.sizes[n] = mi.sizes.get(n, 0) + 1
            mi.devices += n
            free = []
            for gpu in devices:
                mi.memories[gpu.memory_mib] = mi.memories.get(gpu.memory_mib, 0) + 1
                sharers = self._shares.get(gpu.uuid)
                if sharers:
                    mi.used[gpu.uuid] = used = sum(sharers.values())
                    mi.partial.setdefault(host, []).append(gpu)
                    mi.partial_room[host] = mi.partial_room.get(host, 0) + UNIT - used
                    if used < UNIT and available:
                        mi.rooms.add(UNIT - used, (host, gpu.index, gpu.uuid))
                elif gpu.uuid not in self._held:
                    free.append(gpu)
            mi.free[host] = free
            while len(mi.buckets) <= n:
                mi.buckets.append([])
            if available:
                bisect.insort(mi.buckets[len(free)], host)
                mi.entered_bucket(len(free))
                mi.free_available += len(free)
            else:
                mi.unavailable += n
            self._rank(mi, host)
        return set(by_model)

    def _unindex_host(self, host: str, gpus: list[GPU]) -> set[str]:
        """Take a host's devices (as indexed) out of the index; the models touched."""
        available = self.is_available(host)
        touched = {g.model for g in gpus}
        for model in touched:
            mi = self.models[model]
            n = mi.total.pop(host)
            mi.sizes[n] -= 1
            if not mi.sizes[n]:
                del mi.sizes[n]
            mi.devices -= n
            free = mi.free.pop(host)
            if available:
                bucket = mi.buckets[len(free)]
                del bucket[bisect.bisect_left(bucket, host)]
                mi.free_available -= len(free)
            else:
                mi.unavailable -= n
            for gpu in mi.partial.pop(host, ()):
                used = mi.used.pop(gpu.uuid)
                if used < UNIT and available:
                    mi.rooms.remove(UNIT - used, (host, gpu.index, gpu.uuid))
            mi.partial_room.pop(host, None)
            self._rank(mi, host)
        for gpu in gpus:
            memories = self.models[gpu.model].memories
            memories[gpu.memory_mib] -= 1
            if not memories[gpu.memory_mib]:
                del memories[gpu.memory_mib]
        return touched

    def _finish_models(self, models: set[str]) -> None:
        """What depends on every host of a model, for the models touched: the
        largest memory, the smallest and largest host (as many buckets as the
        largest has devices, plus one), whether split ranks are kept; a model
        without devices leaves."""
        for model in models:
            mi = self.models.get(model)
            if mi is None:
                continue
            if not mi.devices:
                del self.models[model]
                continue
            self._set_scan(mi, len(mi.total) <= SCAN_HOSTS)
            mi.memory_mib = max(mi.memories)
            mi.smallest_host = min(mi.sizes)
            del mi.buckets[max(mi.sizes) + 1 :]  # hosts that large left: those buckets are empty
        if list(self.models) != sorted(self.models):
            self.models = dict(sorted(self.models.items()))

    # -- availability ---------------------------------------------------------------

    def set_available_hosts(self, hosts: set[str] | None) -> None:
        """Only these hosts may be chosen (None: all); only those whose availability changed are touched."""
        if hosts == self.available:
            return
        before = {h: self.is_available(h) for h in self.hosts}
        self.available = hosts
        for host, was in before.items():
            if self.is_available(host) != was:
                self._set_host_available(host, not was)

    def _set_host_available(self, host: str, available: bool) -> None:
        sign = 1 if available else -1
        for mi in self.models.values():
            if host not in mi.total:
                continue
            n = len(mi.free[host])
            if available:
                bisect.insort(mi.buckets[n], host)
                mi.entered_bucket(n)
            else:
                bucket = mi.buckets[n]
                del bucket[bisect.bisect_left(bucket, host)]
            mi.free_available += sign * n
            mi.unavailable -= sign * mi.total[host]
            for gpu in mi.partial.get(host, ()):
                room = UNIT - mi.used[gpu.uuid]
                if room:
                    key = (host, gpu.index, gpu.uuid)
                    if available:
                        mi.rooms.add(room, key)
                    else:
                        mi.rooms.remove(room, key)
            self._rank(mi, host)

    # -- devices taken and given back -----------------------------------------------

    def take_free(self, mi: ModelIndex, host: str, gpus: Iterable[GPU], rank: bool = True) -> None:
        """Untouched devices of the host are booked whole, or get their first share.
        ``rank=False``: the caller brings the host's split ranks up to date (:meth:`rank`)."""
        gpus = list(gpus)
        free = mi.free[host]
        before = len(free)
        if free[: len(gpus)] == gpus:  # the usual case: the first ones, in order
            del free[: len(gpus)]
        else:
            for gpu in gpus:
                del free[bisect.bisect_left(free, _ORDER(gpu), key=_ORDER)]
        self._move(mi, host, before, len(free))
        if rank and host in mi.ranked:  # a host not ranked has no partly booked room to move
            self._rank(mi, host)

    def put_free(self, gpu: GPU, rank: bool = True) -> None:
        """A device is untouched again (if it is still in the inventory)."""
        current = self.gpus.get(gpu.uuid)
        if current is None:  # it left the inventory while booked
            return
        mi = self.models[current.model]
        free = mi.free[current.host]
        bisect.insort(free, current, key=_ORDER)
        self._move(mi, current.host, len(free) - 1, len(free))
        if rank and current.host in mi.ranked:
            self._rank(mi, current.host)

    def add_share(self, mi: ModelIndex, gpu: GPU, piece: int) -> None:
        """A share of ``piece`` milli is booked on the device (untouched until now, or shared)."""
        before = mi.used.get(gpu.uuid)
        if before is None:  # untouched until now: the host's free count changes too
            self.add_shares(mi, gpu.host, [(gpu, piece)])
            return
        mi.used[gpu.uuid] = before + piece
        mi.partial_room[gpu.host] -= piece
        self._set_room(mi, gpu, UNIT - before, UNIT - before - piece)
        self._rank_room(mi, gpu.host, UNIT - before, UNIT - before - piece)

    def add_shares(self, mi: ModelIndex, host: str, picks: Iterable[tuple[GPU, int]]) -> None:
        """Shares booked on devices of one host, (device, milli) each: the
        untouched ones leave the free lists together, and the host's split
        ranks are brought up to date once."""
        picks = list(picks)
        used = mi.used
        fresh = [g for g, _ in picks if g.uuid not in used]
        if fresh:
            self.take_free(mi, host, fresh, rank=False)
            partial = mi.partial.setdefault(host, [])
            for gpu in fresh:
                bisect.insort(partial, gpu, key=_ORDER)
            mi.partial_room[host] = mi.partial_room.get(host, 0) + UNIT * len(fresh)
        for gpu, piece in picks:
            before = used.get(gpu.uuid, 0)
            used[gpu.uuid] = before + piece
            mi.partial_room[host] -= piece
            self._set_room(mi, gpu, UNIT - before if before else 0, UNIT - before - piece)
        self._rank(mi, host)

    def remove_share(self, uuid: str, piece: int, rank: bool = True) -> None:
        """A share of ``piece`` milli on the device is given back."""
        gpu = self.gpus.get(uuid)
        if gpu is None:  # device left the inventory while shared
            return
        mi = self.models[gpu.model]
        before = mi.used[uuid]
        if before > piece:
            mi.used[uuid] = before - piece
            mi.partial_room[gpu.host] += piece
            self._set_room(mi, gpu, UNIT - before, UNIT - before + piece)
            if rank:
                self._rank_room(mi, gpu.host, UNIT - before, UNIT - before + piece)
            return
        del mi.used[uuid]  # untouched again: back to the free lists
        self._set_room(mi, gpu, UNIT - before, 0)
        partial = mi.partial[gpu.host]
        del partial[bisect.bisect_left(partial, _ORDER(gpu), key=_ORDER)]
        mi.partial_room[gpu.host] -= UNIT - before
        if not partial:
            del mi.partial[gpu.host]
            del mi.partial_room[gpu.host]
        self.put_free(gpu, rank)

    def _move(self, mi: ModelIndex, host: str, old: int, new: int) -> None:
        """The host's free count of this model went from old to new."""
        if old == new or not self.is_available(host):
            return
        mi.free_available += new - old
        bucket = mi.buckets[old]
        del bucket[bisect.bisect_left(bucket, host)]
        bisect.insort(mi.buckets[new], host)
        if new > mi.block_hint:  # mi.entered_bucket(new), without the call: every decision comes here
            mi.block_hint = new

    def _set_room(self, mi: ModelIndex, gpu: GPU, old: int, new: int) -> None:
        """A shared device's room went from old to new (0: not in the room list)."""
        if old == new or not self.is_available(gpu.host):
            return
        key = (gpu.host, gpu.index, gpu.uuid)
        if old and new:
            mi.rooms.move(old, new, key)
        elif old:
            mi.rooms.remove(old, key)
        else:
            mi.rooms.add(new, key)

    def rank(self, uuid: str) -> None:
        """Bring the split ranks of the device's host up to date, after changes made with ``rank=False``."""
        gpu = self.gpus.get(uuid)
        if gpu is not None:
            self._rank(self.models[gpu.model], gpu.host)

    def _set_scan(self, mi: ModelIndex, scan: bool) -> None:
        """Keep the model's split ranks (built afresh), or not (emptied)."""
        if scan == mi.scan:
            return
        mi.scan = scan
        if scan:
            mi.ranks, mi.totals = {}, []
            return
        mi.ranked = {}  # made afresh with the ranks
        for host in mi.total:
            self._rank(mi, host)

    def host_ranked(self, mi: ModelIndex, host: str) -> tuple[int, tuple[int, ...]] | None:
        """The host's (free devices, rooms of its partly booked devices with
        room, largest first), as in ``mi.ranked``; None: no such room, or the
        host is not available."""
        partial = mi.partial.get(host) if self.is_available(host) else None
        if partial:
            used = mi.used
            rooms = sorted([UNIT - used[g.uuid] for g in partial], reverse=True)
            while rooms and not rooms[-1]:  # full devices (room 0) sort last
                rooms.pop()
            if rooms:
                return len(mi.free[host]), tuple(rooms)
        return None

    def totals(self, mi: ModelIndex) -> list[tuple[int, str]]:
        """``mi.totals`` (only while kept: see :meth:`set_keep_totals`), made on the spot where ranks are not kept."""
        if not mi.scan:
            return mi.totals
        return sorted((total_room(r), h) for h, r in mi.ranked.items())

    def _rank(self, mi: ModelIndex, host: str) -> None:
        """Bring the host's entries in ``mi.ranked`` and ``mi.ranks`` up to date (only those that changed)."""
        new = self.host_ranked(mi, host)
        ranked = mi.ranked
        old = ranked.get(host)
        if old == new:
            return
        if not mi.scan:
            if self.keep_totals:
                self._retotal(mi, host, old, new)
            self._rerank(mi, host, old or (0, ()), new or (0, ()))
        if new is None:
            del ranked[host]
        else:
            ranked[host] = new

    def _rank_room(self, mi: ModelIndex, host: str, old: int, new: int) -> None:
        """One partly booked device of the host went from room ``old`` to
        ``new`` (0: full), the host's free devices as they were: its rooms
        change in place, and its ranks only between the two rooms' places
        (a full device's place: just past the last room)."""
        was = mi.ranked.get(host)
        if was is None or old and old not in was[1]:  # not ranked (host not available, or no room until now)
            self._rank(mi, host)
            return
        free, rooms = was
        changed = list(rooms)
        if old:
            i = rooms.index(old)
            del changed[i]
        else:  # it was full: its room comes in, as if from just past the end
            i = len(rooms)
        j = len(changed)
        if new:
            j = bisect.bisect_right(changed, -new, key=operator.neg)  # the first smaller room: largest first
            changed.insert(j, new)
        now = (free, tuple(changed)) if changed else None
        if not mi.scan:
            if self.keep_totals:
                self._retotal(mi, host, was, now)
            hi = free + (max(i, j) + 1 if new else len(rooms))
            self._rerank(mi, host, was, now or (0, ()), free + min(i, j), hi)
        if now is None:
            del mi.ranked[host]
        else:
            mi.ranked[host] = now

    @staticmethod
    def _rerank(
        mi: ModelIndex,
        host: str,
        old: tuple[int, tuple[int, ...]],
        new: tuple[int, tuple[int, ...]],
        lo: int = 0,
        hi: int | None = None,
    ) -> None:
        """The host's (free devices, partly booked rooms) went from old to new:
        only the positions k whose room changed move in ``ranks[k]`` (from
        ``lo`` to before ``hi``, when the caller knows the others did not). A
        position below the free count is untouched (no entry), one past the
        rooms has none either; ranks[0] is never asked for (a split takes at
        least 2 devices): not kept."""
        ranks = mi.ranks
        of, orooms = old
        nf, nrooms = new
        if of == nf and len(orooms) == len(nrooms):  # the usual: rooms changed in place
            a, b = max(0, lo - of), len(orooms) if hi is None else hi - of
            for k, o, r in zip(range(of + a, of + b), orooms[a:b], nrooms[a:b]):
                if o != r and k:
                    ranks[k].move(o, r, host)
            return
        # Position k's room (0: none there), both vectors from position lo on, compared in C.
        lo = max(1, lo, min(of, nf))
        end = max(of + len(orooms), nf + len(nrooms)) if hi is None else hi
        before = ((0,) * of + orooms)[lo:end]
        after = ((0,) * nf + nrooms)[lo:end]
        for k, o, r in zip_longest(range(lo, end), before, after, fillvalue=0):
            if o == r:
                continue
            if o and r:
                ranks[k].move(o, r, host)
                continue
            if o and ranks[k].remove(o, host) and not r:
                del ranks[k]  # no entries left
            if r:
                (ranks[k] if k in ranks else ranks.setdefault(k, Rooms())).add(r, host)

    def set_keep_totals(self, keep: bool) -> None:
        """Keep ``ModelIndex.totals`` up to date (built afresh when turned on), or not (emptied)."""
        if keep == self.keep_totals:
            return
        self.keep_totals = keep
        for mi in self.models.values():
            mi.totals = sorted((total_room(r), h) for h, r in mi.ranked.items()) if keep and not mi.scan else []

    @staticmethod
    def _retotal(mi: ModelIndex, host: str, old: tuple | None, new: tuple | None) -> None:
        """The host's entry in ``mi.totals`` (for uneven splits), from its old and new ranks."""
        before = total_room(old) if old else None
        after = total_room(new) if new else None
        if before == after:
            return
        if before is not None:
            del mi.totals[bisect.bisect_left(mi.totals, (before, host))]
        if after is not None:
            bisect.insort(mi.totals, (after, host))
