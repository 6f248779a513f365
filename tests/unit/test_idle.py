"""Idle and held-time timers per holder, with a fake clock (gpuspawner/core/idle.py)."""

from __future__ import annotations

import pytest

from gpuspawner.core.idle import IDLE, MAX_HOURS, DeviceSample, IdleTimers, Limits, is_active

LIMITS = Limits(idle_timeout=600, idle_warning=100, idle_utilization=5, idle_memory_mib=None)
IDLE_GPU = DeviceSample(utilization=0, own=(500,), shared=False)
BUSY_GPU = DeviceSample(utilization=60, own=(500,), shared=False)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def run(timers, clock, holder, sample, until, step=10, limits=LIMITS):
    """Readings every ``step`` s up to ``until``; the first end reason decided, with when."""
    while clock.now < until:
        clock.now += step
        timers.observe(holder, [sample], limits)
        reason = timers.decide(holder, limits)
        if reason:
            return reason, clock.now
    return None, clock.now


@pytest.mark.parametrize(
    "sample, limits, active",
    [
        (DeviceSample(0, (), False), LIMITS, False),
        (DeviceSample(5, (), False), LIMITS, False),  # at the threshold is idle
        (DeviceSample(6, (), False), LIMITS, True),
        (DeviceSample(None, (), False), LIMITS, None),  # cannot tell
        (DeviceSample(0, (2000,), False), LIMITS, False),  # memory does not count by default
        (DeviceSample(0, (2000,), False), Limits(idle_memory_mib=1024), True),
        (DeviceSample(None, (2000,), False), Limits(idle_memory_mib=1024), True),
        (DeviceSample(0, (1024,), False), Limits(idle_memory_mib=1024), False),
        # shared: only the holder's own processes count
        (DeviceSample(60, (), True), LIMITS, False),
        (DeviceSample(60, (10,), True), LIMITS, True),
        (DeviceSample(0, (10,), True), LIMITS, False),
        (DeviceSample(0, (2000,), True), Limits(idle_memory_mib=1024), True),
    ],
)
def test_what_counts_as_activity(sample, limits, active):
    assert is_active(sample, limits) is active


def test_an_idle_holder_is_warned_then_stopped_after_the_timeout(clock):
    timers = IdleTimers(clock)
    clock.now += 10
    timers.observe("s", [IDLE_GPU], LIMITS)  # idle since 1010
    reason, at = run(timers, clock, "s", IDLE_GPU, until=1500)
    assert reason is None and timers.notices("s") == []  # 490 s idle: before the warning
    reason, at = run(timers, clock, "s", IDLE_GPU, until=1520)
    [notice] = timers.notices("s")
    assert (notice.reason, notice.since, notice.stop_at) == (IDLE, 1510, 1610)
    reason, at = run(timers, clock, "s", IDLE_GPU, until=2000)
    assert (reason, at) == (IDLE, 1610)
    assert timers.idle_for("s") == 600


def test_a_busy_holder_is_never_warned(clock):
    timers = IdleTimers(clock)
    assert run(timers, clock, "s", BUSY_GPU, until=10_000)[0] is None
    assert timers.notices("s") == [] and timers.idle_for("s") is None
    assert timers.last_active("s") == clock.now


def test_activity_during_the_warning_cancels_it_and_the_timer_starts_again(clock):
    timers = IdleTimers(clock)
    run(timers, clock, "s", IDLE_GPU, until=1550)
    assert [n.reason for n in timers.notices("s")] == [IDLE]
    run(timers, clock, "s", BUSY_GPU, until=1560)
    assert timers.notices("s") == [] and timers.idle_for("s") is None
    reason, at = run(timers, clock, "s", IDLE_GPU, until=5000)
    assert (reason, at) == (IDLE, 1570 + 600)  # idle again from 1570


def test_no_fresh_readings_stop_nobody(clock):
    timers = IdleTimers(clock, stale=30)
    run(timers, clock, "s", IDLE_GPU, until=1590)  # warned at 1500, stop due at 1600
    clock.now = 1700  # the agent went quiet
    assert timers.decide("s", LIMITS) is None
    timers.observe("s", [DeviceSample(None, (), False)], LIMITS)  # a reading that says nothing
    assert timers.decide("s", LIMITS) is None
    timers.observe("s", [IDLE_GPU], LIMITS)
    assert timers.decide("s", LIMITS) == IDLE


def test_a_late_warning_still_lasts_its_full_period(clock):
    timers = IdleTimers(clock)
    run(timers, clock, "s", IDLE_GPU, until=3000, limits=Limits())  # timeout off: idle, never warned
    assert timers.notices("s") == [] and timers.idle_for("s") == 1990
    reason, at = run(timers, clock, "s", IDLE_GPU, until=5000)
    assert (reason, at) == (IDLE, 3010 + 100)


def test_a_holder_on_several_devices_is_busy_when_one_is(clock):
    timers = IdleTimers(clock)
    clock.now += 1000
    timers.observe("s", [IDLE_GPU, BUSY_GPU], LIMITS)
    assert timers.idle_for("s") is None
    timers.observe("s", [IDLE_GPU, IDLE_GPU], LIMITS)
    assert timers.idle_for("s") == 0


def test_on_a_shared_device_only_the_idle_holder_is_stopped(clock):
    timers = IdleTimers(clock)
    reasons = {}
    while clock.now < 2000 and len(reasons) < 2:
        clock.now += 10
        timers.observe("busy", [DeviceSample(60, (800,), True)], LIMITS)
        timers.observe("idle", [DeviceSample(60, (), True)], LIMITS)
        for h in ("busy", "idle"):
            reason = timers.decide(h, LIMITS)
            if reason:
                reasons.setdefault(h, (reason, clock.now))
    assert reasons == {"idle": (IDLE, 1610)}


def test_max_held_warns_then_stops_whatever_the_activity(clock):
    limits = Limits(max_held=3600, max_held_warning=300)
    timers = IdleTimers(clock)
    timers.hold("s")  # held since 1000
    reason, at = run(timers, clock, "s", BUSY_GPU, until=4290, limits=limits)
    assert reason is None and timers.notices("s") == []
    reason, at = run(timers, clock, "s", BUSY_GPU, until=4310, limits=limits)
    [notice] = timers.notices("s")
    assert (notice.reason, notice.since, notice.stop_at) == (MAX_HOURS, 4300, 4600)
    reason, at = run(timers, clock, "s", BUSY_GPU, until=9000, limits=limits)
    assert (reason, at) == (MAX_HOURS, 4600)


def test_max_held_counts_from_when_the_holding_began(clock):
    timers = IdleTimers(clock)
    timers.hold("s", since=0.0)  # e.g. adopted after a hub restart: held for 1000 s already
    limits = Limits(max_held=900, max_held_warning=60)
    assert timers.decide("s", limits) is None
    [notice] = timers.notices("s")
    assert notice.stop_at == 1060  # the whole warning, though the time is up
    clock.now = 1060
    assert timers.decide("s", limits) == MAX_HOURS


def test_turning_a_limit_off_withdraws_its_warning(clock):
    timers = IdleTimers(clock)
    run(timers, clock, "s", IDLE_GPU, until=1550)
    assert timers.notices("s")
    assert timers.decide("s", Limits()) is None
    assert timers.notices("s") == []


def test_forget_drops_the_holder(clock):
    timers = IdleTimers(clock)
    timers.observe("s", [IDLE_GPU], LIMITS)
    assert timers.holders() == ["s"]
    timers.forget("s")
    assert timers.holders() == [] and timers.decide("s", LIMITS) is None and timers.notices("s") == []


def test_a_holder_is_read_once_a_reading_tells_idle_from_busy(clock):
    timers = IdleTimers(clock)
    timers.hold("s")
    assert not timers.read("s")
    timers.observe("s", [DeviceSample(None, (), False)], LIMITS)
    assert not timers.read("s")
    timers.observe("s", [IDLE_GPU], LIMITS)
    assert timers.read("s") and not timers.read("other")
