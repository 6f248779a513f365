"""Reservations, the pure part (gpuspawner.core.reservations, gpuspawner.plan.reservations): weekly windows
kept at local time across daylight-saving changes (and on the days a local time
does not exist or exists twice), a window's edges to the microsecond, what a
reservation refuses, overlap conflicts (also against a brute force over every
minute), what open windows keep free for their members, and whose servers are
stopped to make room (against a brute force over every set of candidates).

The property tests are derandomized: every run checks the same examples."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuspawner.core.reservations import HORIZON_WEEKS, WEEK, Reservation, ReservationError, Window, conflicts
from gpuspawner.plan.reservations import Holder, Keep, Need, count_toward, keep_free, needs, to_stop

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
US = timedelta(microseconds=1)
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)  # a Tuesday in winter

SETTINGS = settings(max_examples=300, deadline=None, database=None, derandomize=True)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(zone: ZoneInfo, *args: int) -> datetime:
    return datetime(*args, tzinfo=zone)


def make(
    start: datetime,
    end: datetime,
    count: int = 1,
    *,
    id: int | None = None,
    weekly: bool = False,
    tz: str = "UTC",
    model: str = A100,
    group: str = "cs101",
    name: str = "",
) -> Reservation:
    return Reservation(
        group=group,
        model=model,
        count=count,
        start=start,
        end=end,
        weekly=weekly,
        timezone=tz,
        name=name,
        id=id,
    )


def tuesday_14_to_16(zone: ZoneInfo, first: tuple[int, int, int], **kwargs) -> Reservation:
    """Every Tuesday 14:00–16:00 local in ``zone``, from the Tuesday ``first``."""
    return make(local(zone, *first, 14, 0), local(zone, *first, 16, 0), weekly=True, tz=zone.key, **kwargs)


def expected_windows(r: Reservation, count: int) -> list[Window]:
    """The first ``count`` windows of a weekly ``r``, reckoned here as the module's
    docstring says: the same wall time k weeks on (an hour that does not exist
    read with the offset before the change: zoneinfo's fold=0)."""
    zone = ZoneInfo(r.timezone)
    a, b = r.start.astimezone(zone), r.end.astimezone(zone)
    out = [Window(r.start, r.end)]
    for k in range(1, count):
        start = datetime.combine(a.date() + k * WEEK, a.time(), tzinfo=zone)
        end = datetime.combine(b.date() + k * WEEK, b.time(), tzinfo=zone)
        out.append(Window(start.astimezone(UTC), end.astimezone(UTC)))
    return out


# -- weekly windows across daylight-saving changes -------------------------------------------


def test_a_berlin_window_stays_at_14_local_across_the_autumn_change():
    """Guards docs/reservations.md, "Making one": "Weekly windows keep their local time" and "CS101 at
    14:00 Europe/Berlin is at 13:00 UTC in winter and 12:00 UTC in summer"."""
    r = tuesday_14_to_16(BERLIN, (2026, 10, 20))
    assert (r.start, r.end) == (utc(2026, 10, 20, 12), utc(2026, 10, 20, 14))  # CEST, UTC+2
    assert list(r.windows(utc(2026, 10, 19), utc(2026, 11, 4))) == [
        Window(utc(2026, 10, 20, 12), utc(2026, 10, 20, 14)),
        Window(utc(2026, 10, 27, 13), utc(2026, 10, 27, 15)),  # after 2026-10-25: CET, UTC+1
        Window(utc(2026, 11, 3, 13), utc(2026, 11, 3, 15)),
    ]
    assert r.window(1) == Window(utc(2026, 10, 27, 13), utc(2026, 10, 27, 15))


def test_a_berlin_window_stays_at_14_local_across_the_spring_change():
    """Guards docs/reservations.md, "Making one": "CS101 at 14:00 Europe/Berlin is at 13:00 UTC in
    winter and 12:00 UTC in summer"."""
    r = tuesday_14_to_16(BERLIN, (2026, 10, 20))
    assert list(r.windows(utc(2027, 3, 20), utc(2027, 4, 7))) == [
        Window(utc(2027, 3, 23, 13), utc(2027, 3, 23, 15)),  # CET
        Window(utc(2027, 3, 30, 12), utc(2027, 3, 30, 14)),  # after 2027-03-28: CEST
        Window(utc(2027, 4, 6, 12), utc(2027, 4, 6, 14)),
    ]


def test_a_new_york_window_stays_at_14_local_across_both_changes():
    r = tuesday_14_to_16(NEW_YORK, (2026, 10, 27))
    assert (r.start, r.end) == (utc(2026, 10, 27, 18), utc(2026, 10, 27, 20))  # EDT, UTC-4
    assert list(r.windows(utc(2026, 10, 27), utc(2026, 11, 4))) == [
        Window(utc(2026, 10, 27, 18), utc(2026, 10, 27, 20)),
        Window(utc(2026, 11, 3, 19), utc(2026, 11, 3, 21)),  # after 2026-11-01: EST, UTC-5
    ]
    assert list(r.windows(utc(2027, 3, 9), utc(2027, 3, 17))) == [
        Window(utc(2027, 3, 9, 19), utc(2027, 3, 9, 21)),
        Window(utc(2027, 3, 16, 18), utc(2027, 3, 16, 20)),  # after 2027-03-14: EDT
    ]


@pytest.mark.parametrize(
    "zone, first, utc_hours",
    [(BERLIN, (2026, 10, 20), {12, 13}), (NEW_YORK, (2026, 10, 27), {18, 19}), (ZoneInfo("UTC"), (2026, 10, 20), {14})],
)
def test_every_window_of_a_year_and_more_is_tuesday_14_to_16_local(zone, first, utc_hours):
    r = tuesday_14_to_16(zone, first)
    got = list(r.windows(r.start, r.start + 60 * WEEK))
    assert len(got) == 60
    assert got == expected_windows(r, 60)
    for w in got:
        a, b = w.start.astimezone(zone), w.end.astimezone(zone)
        assert (a.strftime("%a %H:%M"), b.strftime("%a %H:%M")) == ("Tue 14:00", "Tue 16:00")
        assert w.end - w.start == 2 * HOUR
    assert {w.start.hour for w in got} == utc_hours  # its UTC time moves with the changes
    for w, nxt in itertools.pairwise(got):
        assert nxt.start - w.start in {WEEK - HOUR, WEEK, WEEK + HOUR}


def test_berlin_and_new_york_change_on_different_days_and_their_windows_show_it():
    # 14:00 in Berlin and 09:00 in New York are both 13:00 UTC only while New York is
    # on summer time and Berlin not yet (March), or Berlin no longer and New York still (autumn).
    berlin = make(local(BERLIN, 2026, 12, 1, 14), local(BERLIN, 2026, 12, 1, 15), weekly=True, tz="Europe/Berlin")
    ny = make(local(NEW_YORK, 2026, 12, 1, 9), local(NEW_YORK, 2026, 12, 1, 10), weekly=True, tz="America/New_York")
    until = NOW + HORIZON_WEEKS * WEEK
    same = [
        a.start
        for a, b in zip(berlin.windows(NOW, until), ny.windows(NOW, until))
        if a.start == b.start  # else they are an hour apart, one after the other
    ]
    assert same == [utc(2027, 3, 16, 13), utc(2027, 3, 23, 13), utc(2027, 11, 2, 13)]


@pytest.mark.parametrize(
    "zone, first, windows",
    [
        # Sunday 02:30–04:30; on 2027-03-28 02:00–03:00 does not exist in Berlin: 02:30 is
        # read with the offset before the change (UTC+1), that is 03:30 summer time.
        (
            BERLIN,
            (2027, 3, 21),
            [
                Window(utc(2027, 3, 21, 1, 30), utc(2027, 3, 21, 3, 30)),
                Window(utc(2027, 3, 28, 1, 30), utc(2027, 3, 28, 2, 30)),  # 03:30–04:30 CEST
                Window(utc(2027, 4, 4, 0, 30), utc(2027, 4, 4, 2, 30)),
            ],
        ),
        # The same in New York on 2027-03-14 (02:30 EST is 07:30 UTC, 03:30 EDT).
        (
            NEW_YORK,
            (2027, 3, 7),
            [
                Window(utc(2027, 3, 7, 7, 30), utc(2027, 3, 7, 9, 30)),
                Window(utc(2027, 3, 14, 7, 30), utc(2027, 3, 14, 8, 30)),  # 03:30–04:30 EDT
                Window(utc(2027, 3, 21, 6, 30), utc(2027, 3, 21, 8, 30)),
            ],
        ),
    ],
)
def test_a_start_in_the_skipped_hour_becomes_an_hour_later_that_day(zone, first, windows):
    """Guards docs/reservations.md, "Making one": "In a later week whose day skips the window's local
    time, it is read with the offset before the change" and "so it falls an hour later that day"."""
    r = make(local(zone, *first, 2, 30), local(zone, *first, 4, 30), weekly=True, tz=zone.key)
    since = windows[0].start - HOUR
    assert list(r.windows(since, windows[-1].end)) == windows
    skipped = windows[1]
    assert skipped.start.astimezone(zone).strftime("%H:%M") == "03:30"
    assert r.active(skipped.start - US) is None  # 03:29:59.999999 local: nominally inside, not on that day
    assert r.active(skipped.start) == skipped
    assert r.next_window(skipped.start - HOUR) == skipped


def test_a_window_inside_the_skipped_hour_that_day_has_no_time_and_is_no_window():
    # Sunday 02:30–03:15 in Berlin: on 2027-03-28 02:30 reads as 03:30, after the end at
    # 03:15; that day it holds no instant, and is neither listed nor open, nor a conflict.
    r = make(local(BERLIN, 2027, 3, 21, 2, 30), local(BERLIN, 2027, 3, 21, 3, 15), 3, weekly=True, tz="Europe/Berlin")
    assert list(r.windows(utc(2027, 3, 21), utc(2027, 4, 5))) == [
        Window(utc(2027, 3, 21, 1, 30), utc(2027, 3, 21, 2, 15)),
        Window(utc(2027, 4, 4, 0, 30), utc(2027, 4, 4, 1, 15)),
    ]
    assert r.next_window(utc(2027, 3, 28)) == Window(utc(2027, 4, 4, 0, 30), utc(2027, 4, 4, 1, 15))
    other = make(utc(2027, 3, 28, 1), utc(2027, 3, 28, 2), 2, id=1)
    assert conflicts(r, [other], 4, utc(2027, 3, 22)) == []


def test_a_start_in_the_repeated_hour_is_the_first_of_the_two():
    # Not in the docstring, pinned so that a change is seen: on 2026-10-25 02:00–03:00
    # happens twice in Berlin; 02:30 is read as the first (summer time, fold=0), so the
    # window 02:30–03:30 lasts two hours that day.
    r = make(local(BERLIN, 2026, 10, 18, 2, 30), local(BERLIN, 2026, 10, 18, 3, 30), weekly=True, tz="Europe/Berlin")
    assert list(r.windows(utc(2026, 10, 18), utc(2026, 11, 2))) == [
        Window(utc(2026, 10, 18, 0, 30), utc(2026, 10, 18, 1, 30)),
        Window(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 30)),
        Window(utc(2026, 11, 1, 1, 30), utc(2026, 11, 1, 2, 30)),
    ]


# -- windows(since, until): exactly the overlapping ones ----------------------------------------


ZONES = [ZoneInfo("UTC"), BERLIN, NEW_YORK]
BASE = utc(2026, 10, 1)  # both autumn changes and both spring changes lie within a year of it


@st.composite
def weekly_reservations(draw) -> Reservation:
    zone = draw(st.sampled_from(ZONES))
    start = BASE + draw(st.integers(0, 60 * 24 * 7 * 30)) * MINUTE
    length = draw(st.sampled_from([MINUTE, HOUR, 2 * HOUR, timedelta(days=1), WEEK - HOUR, WEEK - MINUTE]))
    return make(start, start + length, weekly=True, tz=zone.key)


def overlapping(windows: list[Window], since: datetime, until: datetime) -> list[Window]:
    return [w for w in windows if w.start < until and since < w.end and w.start < w.end]


@SETTINGS
@given(
    r=weekly_reservations(),
    since_minutes=st.integers(-60 * 24 * 14, 60 * 24 * 7 * 50),
    span=st.sampled_from([US, MINUTE, HOUR, timedelta(days=1), WEEK, 3 * WEEK + HOUR, 9 * WEEK]),
)
@example(  # Sunday 02:30–03:30 in Berlin: on 2027-03-28 it has no time (03:30–03:30)
    r=make(local(BERLIN, 2027, 3, 21, 2, 30), local(BERLIN, 2027, 3, 21, 3, 30), weekly=True, tz="Europe/Berlin"),
    since_minutes=0,
    span=3 * WEEK,
)
def test_windows_are_exactly_the_overlapping_ones_in_order(r, since_minutes, span):
    since = r.start + since_minutes * MINUTE
    everything = expected_windows(r, 100)  # 100 weeks: past the last since + span
    assert list(r.windows(since, since + span)) == overlapping(everything, since, since + span)


@pytest.mark.parametrize("zone", ZONES, ids=lambda z: z.key)
def test_windows_at_the_edges_of_each_window(zone):
    r = tuesday_14_to_16(zone, (2026, 10, 6))
    everything = expected_windows(r, 60)
    for k, w in enumerate(everything[:-1]):
        assert list(r.windows(w.end, w.end + US)) == []  # it ends where the next span begins
        assert list(r.windows(w.end - US, w.end)) == [w]
        assert list(r.windows(w.start - US, w.start)) == []  # it begins where the span ends
        assert list(r.windows(w.start - US, w.start + US)) == [w]
        assert list(r.windows(w.start, everything[k + 1].start)) == [w]
        assert list(r.windows(w.start, everything[k + 1].start + US)) == [w, everything[k + 1]]
        assert list(r.windows(w.end - US, everything[k + 1].start + US)) == [w, everything[k + 1]]


def test_a_one_off_reservation_has_its_one_window_where_it_overlaps():
    r = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16))
    w = Window(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16))
    assert list(r.windows(utc(2026, 1, 1), utc(2028, 1, 1))) == [w]
    assert list(r.windows(utc(2027, 1, 12, 15), utc(2027, 1, 12, 15) + US)) == [w]
    assert list(r.windows(w.end, w.end + WEEK)) == []
    assert list(r.windows(w.start - WEEK, w.start)) == []
    assert list(r.windows(w.end - US, w.end)) == [w]
    assert r.window(0) == r.window(5) == w  # it has only the one


# -- the edges: active, next_window, over --------------------------------------------------------


@pytest.mark.parametrize(
    "r, w",
    [
        (make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16)), Window(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16))),
        # The 4th window of a weekly one, after the autumn change.
        (tuesday_14_to_16(BERLIN, (2026, 10, 6)), Window(utc(2026, 10, 27, 13), utc(2026, 10, 27, 15))),
    ],
    ids=["one-off", "weekly"],
)
def test_a_window_is_open_from_its_start_to_just_before_its_end(r, w):
    assert r.active(w.start) == w
    assert r.active(w.start + HOUR) == w
    assert r.active(w.end - US) == w
    assert r.active(w.end) is None
    assert r.active(w.start - US) is None
    assert r.next_window(w.start - timedelta(days=3)) == w
    assert r.next_window(w.start - US) == w
    assert r.next_window(w.start) == w
    assert r.next_window(w.end - US) == w


def test_a_one_off_reservation_has_no_next_window_after_it_and_is_over_at_its_end():
    r = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16))
    assert r.next_window(utc(2026, 1, 1)) == Window(r.start, r.end)  # long before: still its one window
    assert r.next_window(r.end) is None
    assert r.next_window(r.end + WEEK) is None
    assert not r.over(r.start - WEEK)
    assert not r.over(r.end - US)
    assert r.over(r.end)
    assert r.over(r.end + WEEK)


def test_a_weekly_reservation_is_never_over_and_its_next_window_follows_the_last():
    r = tuesday_14_to_16(BERLIN, (2026, 10, 6))
    w = r.window(3)
    assert r.next_window(w.end) == r.window(4)
    assert r.next_window(w.end + timedelta(days=6, hours=23)) == r.window(4)
    assert r.next_window(utc(2031, 6, 1)).start.astimezone(BERLIN).strftime("%a %H:%M") == "Tue 14:00"
    assert not r.over(utc(2031, 6, 1))
    assert not r.over(r.end + 500 * WEEK)


def test_the_next_window_of_a_weekly_reservation_that_starts_weeks_from_now_is_its_first():
    # Not None ("none is left"): its first window, however far ahead.
    r = tuesday_14_to_16(BERLIN, (2027, 1, 12))
    assert r.next_window(NOW) == Window(utc(2027, 1, 12, 13), utc(2027, 1, 12, 15))
    assert r.next_window(NOW - 100 * WEEK) == Window(utc(2027, 1, 12, 13), utc(2027, 1, 12, 15))
    assert r.active(NOW) is None


# -- what a reservation refuses ------------------------------------------------------------------


START, END = utc(2027, 1, 12, 14), utc(2027, 1, 12, 16)
GOOD = dict(group="cs101", model=A100, count=2, start=START, end=END)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(end=START), "a reservation's end must be after its start"),
        (dict(end=START - US), "a reservation's end must be after its start"),
        (
            dict(start=datetime(2027, 1, 12, 14)),
            "a reservation's start needs a time zone (e.g. 2026-12-08T14:00+01:00)",
        ),
        (dict(end=datetime(2027, 1, 12, 16)), "a reservation's end needs a time zone"),
        (dict(start="2027-01-12T14:00Z"), "a reservation's start needs a time zone"),
        (dict(weekly=True, end=START + WEEK), "a weekly reservation's window must be shorter than a week"),
        (dict(weekly=True, end=START + 2 * WEEK), "a weekly reservation's window must be shorter than a week"),
        (dict(timezone="Mars/Olympus"), "unknown time zone 'Mars/Olympus' (an IANA name, e.g. Europe/Berlin)"),
        (dict(timezone=""), "unknown time zone ''"),
        (dict(timezone="../../etc/passwd"), "unknown time zone '../../etc/passwd'"),
        (dict(count=0), "a reservation's count is a whole number of GPUs from 1, got 0"),
        (dict(count=-1), "a reservation's count is a whole number of GPUs from 1, got -1"),
        (dict(count=True), "a reservation's count is a whole number of GPUs from 1, got True"),
        (dict(count=1.5), "a reservation's count is a whole number of GPUs from 1, got 1.5"),
        (dict(count=2.0), "a reservation's count is a whole number of GPUs from 1, got 2.0"),
        (dict(count="2"), "a reservation's count is a whole number of GPUs from 1, got '2'"),
        (dict(count=None), "a reservation's count is a whole number of GPUs from 1, got None"),
        (dict(count=10_001), "a reservation's count is a whole number of GPUs from 1, got 10001"),
        (dict(name="CS101; DROP TABLE"), "a reservation's name is at most 64 letters, digits, spaces or"),
        (dict(name="two\nlines"), "a reservation's name is at most 64 letters"),
        (dict(name="x" * 65), "a reservation's name is at most 64 letters"),
        (dict(name="<b>"), "a reservation's name is at most 64 letters"),
        (dict(group=""), "a reservation needs a group (at most 64 characters)"),
        (dict(group="   "), "a reservation needs a group"),
        (dict(group="g" * 65), "a reservation needs a group"),
        (dict(group=None), "a reservation needs a group"),
        (dict(model=""), "a reservation needs a model (at most 64 characters)"),
        (dict(model=7), "a reservation needs a model"),
        (dict(count=2.5), "a reservation's count is a whole number of GPUs from 1, got 2.5 (a total such as 2.5 is"),
        (dict(count=0, shares=True), "a reservation's share total is above 0 and at most 10000 GPUs"),
        (dict(count=-0.5, shares=True), "a reservation's share total is above 0"),
        (dict(count=10_000.001, shares=True), "a reservation's share total is above 0 and at most 10000"),
        (dict(count=0.0005, shares=True), "a reservation's share total must be a multiple of 0.001, got 0.0005"),
        (dict(count="2.5", shares=True), "a reservation's share total must be a number such as 0.5, got '2.5'"),
        (dict(count=float("nan"), shares=True), "a reservation's share total must be a finite number"),
        (dict(shares=1), "a reservation's weekly, lend and shares are true or false"),
        (dict(until=END + WEEK), "only a weekly reservation has an until"),
        (dict(weekly=True, until=datetime(2027, 3, 1)), "a reservation's until needs a time zone"),
        (dict(weekly=True, until=START), "a reservation's until must be after its start"),
    ],
)
def test_a_bad_reservation_is_refused_with_what_is_wrong(change, message):
    with pytest.raises(ReservationError) as raised:
        Reservation(**{**GOOD, **change})
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(timezone="Europe"), "unknown time zone 'Europe' (an IANA name, e.g. Europe/Berlin)"),  # a folder
        (dict(timezone="a" * 300), "unknown time zone 'aaa"),  # a file name too long
        (dict(timezone="Europe/" + "a" * 300), "unknown time zone 'Europe/aaa"),
        (dict(name="CS101\n"), "a reservation's name is at most 64 letters"),  # $ matched before the newline
    ],
)
def test_a_time_zone_zoneinfo_cannot_open_or_a_name_ending_in_a_newline_is_refused(change, message):
    """Guards docs/reservations.md: "a time zone that is no IANA zone (a folder of the tz database such as
    `Europe`, a name too long) and a name with a line break" get 400 with the reason."""
    with pytest.raises(ReservationError) as raised:
        Reservation(**{**GOOD, **change})
    assert str(raised.value).startswith(message)


def test_the_edges_that_are_allowed():
    assert Reservation(**{**GOOD, "end": START + US}).end == START + US
    assert Reservation(**{**GOOD, "weekly": True, "end": START + WEEK - US}).weekly
    assert Reservation(**{**GOOD, "count": 1}).count == 1
    assert Reservation(**{**GOOD, "count": 10_000}).count == 10_000
    assert Reservation(**{**GOOD, "name": "CS 101 (Tue) @lab: a/b+c-d_e."}).label == "CS 101 (Tue) @lab: a/b+c-d_e."
    assert Reservation(**{**GOOD, "name": "x" * 64}).label == "x" * 64
    assert Reservation(**GOOD).label == "cs101"  # no name: the group's


def test_start_and_end_are_kept_in_utc_and_the_weekly_description_in_local_time():
    r = tuesday_14_to_16(BERLIN, (2027, 1, 12), name="CS101", id=3)
    assert r.start == utc(2027, 1, 12, 13) and r.start.tzinfo is UTC
    assert r.end == utc(2027, 1, 12, 15) and r.end.tzinfo is UTC
    assert r.describe() == f"CS101: 1 {A100} every week, Tue 14:00–16:00 Europe/Berlin"
    once = make(local(BERLIN, 2027, 1, 12, 22), local(BERLIN, 2027, 1, 13, 2), 2, tz="Europe/Berlin")
    assert once.describe() == f"cs101: 2 {A100} 2027-01-12 22:00–2027-01-13 02:00 Europe/Berlin"
    assert once.as_json()["start"] == "2027-01-12T21:00:00Z"


# -- conflicts ------------------------------------------------------------------------------------


def test_two_overlapping_one_offs_within_capacity_do_not_conflict():
    a = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 2, id=1)
    b = make(utc(2027, 1, 12, 11), utc(2027, 1, 12, 13), 2)
    assert conflicts(b, [a], 4, NOW) == []
    assert conflicts(b, [a], 5, NOW) == []


def test_beyond_capacity_the_conflict_names_the_other():
    stored = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 3, id=1, name="Thesis")
    b = make(utc(2027, 1, 12, 11), utc(2027, 1, 12, 13), 2, name="Course")
    assert conflicts(b, [stored], 4, NOW) == [stored]
    assert conflicts(b, [stored], 4, NOW)[0].label == "Thesis"
    # Neither has an id yet (not stored): still two reservations.
    a = replace(stored, id=None)
    assert conflicts(b, [a], 4, NOW) == [a]
    assert conflicts(a, [b], 4, NOW) == [b]
    assert conflicts(b, [a, b], 4, NOW) == [a]  # itself is not one of the others
    edited = replace(stored, count=2)
    assert conflicts(edited, [stored], 4, NOW) == []  # the one it replaces (the same id) is not either
    assert conflicts(b, [replace(stored, model=H100)], 4, NOW) == []  # another model


def test_windows_that_touch_do_not_conflict():
    a = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 3, id=1)
    b = make(utc(2027, 1, 12, 12), utc(2027, 1, 12, 14), 3)
    assert conflicts(b, [a], 4, NOW) == []
    c = make(utc(2027, 1, 12, 8), utc(2027, 1, 12, 10), 3)
    assert conflicts(c, [a], 4, NOW) == []
    d = make(utc(2027, 1, 12, 12) - US, utc(2027, 1, 12, 14), 3)
    assert conflicts(d, [a], 4, NOW) == [a]  # a microsecond is an overlap


@pytest.mark.parametrize(
    "start, end, clash",
    [
        (utc(2027, 1, 19, 13), utc(2027, 1, 19, 14), True),  # 14:00–15:00 CET, seven weeks on
        (utc(2027, 1, 19, 15), utc(2027, 1, 19, 16), False),  # 16:00–17:00 CET: touches its end
        (utc(2027, 1, 19, 12), utc(2027, 1, 19, 13), False),  # 13:00–14:00 CET: touches its start
        (utc(2027, 1, 20, 13), utc(2027, 1, 20, 14), False),  # a Wednesday
        (utc(2027, 4, 6, 12), utc(2027, 4, 6, 13), True),  # 14:00–15:00 CEST
        (utc(2027, 4, 6, 14), utc(2027, 4, 6, 15), False),  # 16:00–17:00 CEST (in winter, 15:00: inside)
        (utc(2027, 11, 23, 14), utc(2027, 11, 23, 15), True),  # CET again, within the year
        (utc(2028, 6, 13, 12, 30), utc(2028, 6, 13, 13, 30), True),  # a year and a half on
        (utc(2026, 11, 24, 13), utc(2026, 11, 24, 14), False),  # the Tuesday before the first
    ],
)
def test_a_weekly_reservation_and_a_one_off_in_a_later_week(start, end, clash):
    weekly = tuesday_14_to_16(BERLIN, (2026, 12, 1), count=3, id=1)
    once = make(start, end, 2, id=2)
    assert conflicts(once, [weekly], 4, NOW) == ([weekly] if clash else [])
    # The other way round: a weekly one made after the one-off finds it too.
    weekly_new = tuesday_14_to_16(BERLIN, (2026, 12, 1), count=3)
    assert conflicts(weekly_new, [once], 4, NOW) == ([once] if clash else [])


def test_weekly_reservations_in_two_time_zones_that_overlap_only_in_summer_conflict():
    # Every Tuesday 12:00–13:00 UTC, and 14:00–15:00 in Berlin: 13:00–14:00 UTC in winter
    # (one after the other), 12:00–13:00 UTC from 2027-03-30 (both at once).
    in_utc = make(utc(2026, 12, 1, 12), utc(2026, 12, 1, 13), 3, id=1, weekly=True)
    in_berlin = make(local(BERLIN, 2026, 12, 1, 14), local(BERLIN, 2026, 12, 1, 15), 2, weekly=True, tz="Europe/Berlin")
    winter = [(a, b) for a in in_utc.windows(NOW, utc(2027, 3, 28)) for b in in_berlin.windows(NOW, utc(2027, 3, 28))]
    assert not any(a.overlaps(b) for a, b in winter)
    assert any(a.end == b.start for a, b in winter)
    assert conflicts(in_berlin, [in_utc], 4, NOW) == [in_utc]
    assert conflicts(in_berlin, [in_utc], 5, NOW) == []
    berlin_stored = make(in_berlin.start, in_berlin.end, 2, id=2, weekly=True, tz="Europe/Berlin")
    in_utc_new = make(in_utc.start, in_utc.end, 3, weekly=True)
    assert conflicts(in_utc_new, [berlin_stored], 4, NOW) == [berlin_stored]
    # An hour earlier in UTC, they touch in summer and never overlap.
    earlier = make(utc(2026, 12, 1, 11), utc(2026, 12, 1, 12), 3, weekly=True)
    assert conflicts(earlier, [berlin_stored], 4, NOW) == []


def test_weekly_reservations_in_berlin_and_new_york_conflict_in_the_weeks_their_changes_differ():
    berlin = make(local(BERLIN, 2026, 12, 1, 14), local(BERLIN, 2026, 12, 1, 15), 2, id=1, weekly=True, tz=BERLIN.key)
    ny = make(local(NEW_YORK, 2026, 12, 1, 9), local(NEW_YORK, 2026, 12, 1, 10), 3, weekly=True, tz=NEW_YORK.key)
    assert conflicts(ny, [berlin], 4, NOW) == [berlin]
    assert conflicts(ny, [berlin], 4, utc(2027, 3, 24)) == [berlin]  # 2027-11-02 is still ahead
    # From 2027-11-03 on, the next such weeks (March 2028) are within the year checked too.
    assert conflicts(ny, [berlin], 4, utc(2027, 11, 3)) == [berlin]


def test_a_count_above_the_capacity_alone_is_refused():
    r = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 5)
    with pytest.raises(ReservationError, match=f"the cluster has 4 {A100}, fewer than the 5 asked for"):
        conflicts(r, [], 4, NOW)
    assert conflicts(make(r.start, r.end, 4), [], 4, NOW) == []


def test_a_reservation_already_over_is_ignored():
    now = utc(2027, 1, 12, 11)
    gone = make(utc(2027, 1, 12, 9), now, 3, id=1)  # over at now
    running = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 2, weekly=True)  # its first window is open at now
    assert conflicts(running, [gone], 4, now) == []
    assert conflicts(running, [gone], 4, now - US) == [gone]  # a microsecond earlier, not over yet


def test_three_reservations_conflict_only_when_all_three_are_at_once():
    a = make(utc(2027, 1, 12, 10), utc(2027, 1, 12, 12), 2, id=1)
    b = make(utc(2027, 1, 12, 11), utc(2027, 1, 12, 13), 2, id=2)
    new = make(utc(2027, 1, 12, 9), utc(2027, 1, 12, 14), 2)
    assert conflicts(new, [a], 5, NOW) == []
    assert conflicts(new, [b], 5, NOW) == []
    assert conflicts(new, [b, a], 5, NOW) == [a, b]  # 11:00–12:00: 6 > 5; by start
    apart = make(utc(2027, 1, 12, 12), utc(2027, 1, 12, 13), 2, id=2)  # after a: never three at once
    assert conflicts(new, [a, apart], 5, NOW) == []
    # Three at once, but one of them is not needed to go over: every one there is named.
    big = make(utc(2027, 1, 12, 11, 30), utc(2027, 1, 12, 11, 45), 4, id=3)
    assert conflicts(new, [a, big], 5, NOW) == [a, big]


# A brute force: every minute of the new reservation's windows.

BRUTE_BASE = utc(2027, 3, 8)  # before the spring changes in New York (03-14) and Berlin (03-28)


def brute_conflicts(new: Reservation, existing: list[Reservation], capacity: int, now: datetime) -> list[int]:
    assert new.count <= capacity
    others = [
        r
        for r in existing
        if r.model == new.model and (new.id is None or r.id != new.id) and r is not new and now < r.end
    ]
    since = max(now, new.start) if new.weekly else new.start
    found: set[int] = set()
    for w in expected_windows(new, 8) if new.weekly else [Window(new.start, new.end)]:
        if w.end <= since:
            continue
        t = w.start
        while t < w.end:
            at = [r for r in others if r.start <= t < r.end]
            if new.count + sum(r.count for r in at) > capacity:
                found.update(r.id for r in at)
            t += MINUTE
    return [r.id for r in sorted((r for r in others if r.id in found), key=lambda r: (r.start, r.id))]


@st.composite
def one_offs(draw, n: int, span_minutes: int) -> list[Reservation]:
    out = []
    for i in range(1, n + 1):
        start = BRUTE_BASE + draw(st.integers(0, span_minutes)) * MINUTE
        length = draw(st.integers(1, 180)) * MINUTE
        model = draw(st.sampled_from([A100, A100, A100, H100]))
        out.append(make(start, start + length, draw(st.integers(1, 3)), id=i, model=model))
    return out


@SETTINGS
@given(
    existing=st.integers(0, 6).flatmap(lambda n: one_offs(n, 360)),
    new_start=st.integers(0, 360),
    new_length=st.integers(1, 240),
    count=st.integers(1, 4),
    capacity=st.integers(1, 8),
    new_id=st.sampled_from([None, 1, 99]),
    now_minutes=st.integers(-60, 600),
)
@example(  # three at once, each pair within capacity
    existing=[
        make(BRUTE_BASE, BRUTE_BASE + 2 * HOUR, 2, id=1),
        make(BRUTE_BASE + HOUR, BRUTE_BASE + 3 * HOUR, 2, id=2),
    ],
    new_start=30,
    new_length=120,
    count=2,
    capacity=5,
    new_id=None,
    now_minutes=0,
)
def test_one_off_conflicts_are_those_of_a_minute_by_minute_count(
    existing, new_start, new_length, count, capacity, new_id, now_minutes
):
    start = BRUTE_BASE + new_start * MINUTE
    new = make(start, start + new_length * MINUTE, count, id=new_id)
    now = BRUTE_BASE + now_minutes * MINUTE
    if count > capacity:
        with pytest.raises(ReservationError):
            conflicts(new, existing, capacity, now)
        return
    assert [r.id for r in conflicts(new, existing, capacity, now)] == brute_conflicts(new, existing, capacity, now)


@SETTINGS
@given(
    existing=st.integers(0, 6).flatmap(lambda n: one_offs(n, 60 * 24 * 7 * 5)),
    zone=st.sampled_from(ZONES),
    new_start=st.integers(0, 60 * 24 * 7),
    new_length=st.sampled_from([1, 30, 59, 60, 61, 90, 180, 600]),
    count=st.integers(1, 4),
    capacity=st.integers(4, 8),
    now_minutes=st.integers(0, 60 * 24 * 7 * 2),
)
@example(  # Sunday 02:30–03:15 in Berlin: none on 2027-03-28 (03:30–03:15), when the other is there
    existing=[make(utc(2027, 3, 28, 1), utc(2027, 3, 28, 2), 2, id=1)],
    zone=BERLIN,
    new_start=(utc(2027, 3, 21, 1, 30) - BRUTE_BASE) // MINUTE,
    new_length=45,
    count=3,
    capacity=4,
    now_minutes=0,
)
def test_weekly_conflicts_are_those_of_a_minute_by_minute_count(
    existing, zone, new_start, new_length, count, capacity, now_minutes
):
    # Around the spring changes: the new windows move in UTC while the one-offs stay.
    """Guards docs/reservations.md, "Making one": "at no moment may the reservations of a model ask for
    more GPUs than the cluster has of it" and "weekly windows are checked a year ahead, through
    every daylight-saving change"."""
    start = BRUTE_BASE + new_start * MINUTE
    new = make(start, start + new_length * MINUTE, count, weekly=True, tz=zone.key)
    now = BRUTE_BASE + now_minutes * MINUTE
    assert [r.id for r in conflicts(new, existing, capacity, now)] == brute_conflicts(new, existing, capacity, now)


# -- needs and keep_free ------------------------------------------------------------------------


AT = utc(2027, 1, 12, 14, 30)  # a Tuesday
R1 = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16), 4, id=1, group="cs101")  # open
R2 = make(utc(2027, 1, 12, 14, 40), utc(2027, 1, 12, 15, 40), 3, id=2, group="thesis")  # opens in 10 minutes
R3 = make(utc(2027, 1, 5, 14), utc(2027, 1, 5, 15), 2, id=3, weekly=True, model=H100, group="ml")  # open (2nd week)
R4 = make(utc(2027, 1, 12, 15), utc(2027, 1, 12, 16), 1, id=4, group="lab")  # opens in 30 minutes
R5 = make(utc(2027, 1, 12, 12), utc(2027, 1, 12, 14), 5, id=5, group="old")  # over
R6 = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 15), 1, id=6, group="lab")  # open, the same model as R1


def test_members_holdings_reduce_what_is_kept():
    assert needs([R1], AT, {}) == [Need(R1, Window(R1.start, R1.end), 4)]
    assert needs([R1], AT, {1: 2.5})[0].unmet == 2  # shares count as fractions, whole devices kept
    assert needs([R1], AT, {1: 0.75})[0].unmet == 4
    assert needs([R1], AT, {1: sum([0.1] * 10)})[0].unmet == 3  # 0.9999999999999999: one device
    assert needs([R1], AT, {1: 4.0})[0].unmet == 0
    assert needs([R1], AT, {1: 7.0})[0].unmet == 0  # never below none
    assert needs([R1], AT, {2: 4.0})[0].unmet == 4  # another reservation's members
    no_id = make(R1.start, R1.end, 4)
    assert needs([no_id], AT, {1: 4.0})[0].unmet == 4


S1 = replace(make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16), id=7, group="lab"), count=2.5, shares=True)


def test_a_share_total_keeps_room_its_members_do_not_hold():
    """Guards docs/reservations.md, "Share totals (--shares)": "A share total is not lent: --lend with
    --shares is refused"."""
    assert (S1.milli, S1.amount, S1.count) == (2500, f"2.5 {A100} in shares", 2.5)
    assert replace(S1, count=2.0).count == 2 and isinstance(replace(S1, count=2.0).count, int)
    assert S1.describe() == f"lab: 2.5 {A100} in shares 2027-01-12 14:00–2027-01-12 16:00 UTC"
    (n,) = needs([S1], AT, {7: 0.75})
    assert (n.unmet, n.room, n.held, n.keep, n.left, n.kept) == (0, 1750, 0.75, Keep(0, 1750), "1.75", "1.75")
    assert needs([S1], AT, {7: sum([0.1] * 10)})[0].room == 1500  # 0.9999999999999999: one GPU held
    assert needs([S1], AT, {7: 3.0})[0].room == 0  # never below none
    assert keep_free(needs([R1, S1], AT, {1: 1, 7: 0.5}), [], AT) == {A100: Keep(3, 2000)}
    assert keep_free(needs([R1, S1], AT, {1: 1, 7: 0.5}), [7], AT) == {A100: Keep(3)}  # a member of lab
    # A share total is not lent: what borrowers give back could lie in pieces nobody can use.
    with pytest.raises(ReservationError, match="a share total is not lent"):
        replace(S1, lend=True)
    assert needs([replace(S1, id=8)], AT, {}, members_waiting={8: 250})[0].room == 2500  # waiters do not matter
    assert needs([replace(R1, lend=True)], AT, {}, members_waiting={1: 1000})[0].unmet == 1  # a share: one device


@pytest.mark.parametrize(
    "keep, untouched, room, met",
    [
        (Keep(), 0, 0, True),
        (Keep(2), 2, 2000, True),
        (Keep(2), 1, 5000, False),  # whole GPUs need untouched devices
        (Keep(0, 1500), 0, 1500, True),  # a share total: room anywhere
        (Keep(0, 1500), 9, 1499, False),
        (Keep(1, 500), 1, 1499, False),  # the share total is beyond the untouched device's room
        (Keep(1, 500), 1, 1500, True),
    ],
)
def test_what_is_kept_is_met_by_untouched_devices_and_room(keep, untouched, room, met):
    assert keep.met(untouched, room) is met


def test_needs_are_the_open_windows_and_those_opening_within_ahead():
    everything = [R1, R2, R3, R4, R5]
    held = {1: 2.5, 3: 0.25}
    assert needs(everything, AT, held) == [
        Need(R1, Window(R1.start, R1.end), 2, 2),  # its members hold 2.5: 2 whole
        Need(R3, Window(utc(2027, 1, 12, 14), utc(2027, 1, 12, 15)), 2, 0),
    ]
    soon = needs(everything, AT, held, ahead=timedelta(minutes=15))
    assert [(n.reservation.id, n.unmet) for n in soon] == [(1, 2), (2, 3), (3, 2)]
    assert soon[1].window == Window(R2.start, R2.end)
    assert [n.reservation.id for n in needs(everything, AT, held, ahead=timedelta(minutes=10))] == [1, 2, 3]
    assert [n.reservation.id for n in needs(everything, AT, held, ahead=timedelta(minutes=10) - US)] == [1, 3]
    assert [n.reservation.id for n in needs(everything, AT, held, ahead=HOUR)] == [1, 2, 3, 4]
    # A weekly one whose next window is six days on, with a week ahead.
    later = needs([R3], utc(2027, 1, 13, 14), {}, ahead=WEEK)
    assert later == [Need(R3, Window(utc(2027, 1, 19, 14), utc(2027, 1, 19, 15)), 2)]


def test_keep_free_counts_only_open_windows_of_reservations_one_is_not_a_member_of():
    soon = needs([R1, R2, R3, R4, R5, R6], AT, {1: 2.5, 3: 0.25}, ahead=timedelta(minutes=15))
    assert keep_free(soon, [], AT) == {A100: Keep(2 + 1), H100: Keep(2)}  # R2 opens later: not counted yet
    assert keep_free(soon, [1], AT) == {A100: Keep(1), H100: Keep(2)}  # a member of R1, not of R6 (the same model)
    assert keep_free(soon, [1, 6], AT) == {H100: Keep(2)}
    assert keep_free(soon, [3], AT) == {A100: Keep(3)}
    assert keep_free(soon, {1, 3, 6}, AT) == {}
    # Once R2 has opened (at its start, not a microsecond before) it counts.
    assert keep_free(soon, [1, 6], R2.start - US) == {H100: Keep(2)}
    assert keep_free(soon, [1, 6], R2.start) == {A100: Keep(3), H100: Keep(2)}
    assert keep_free(soon, [1, 6], R6.end) == {A100: Keep(3)}  # R3's and R6's windows have ended
    # What its members already hold is not kept a second time.
    assert keep_free(needs([R1, R6], AT, {1: 4, 6: 1}), [], AT) == {}


def test_a_holding_counts_toward_one_reservation_only_the_one_that_lacks_most():
    """Guards docs/reservations.md: "A GPU counts for one reservation only". It counts for the one of
    its user's open reservations of its model that lacks the most, on a tie the one whose window opened
    first, then the lower id; a holding that can count toward one only is counted first."""
    lab_a = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16), 1, id=11, group="lab-a")
    lab_b = make(utc(2027, 1, 12, 14, 10), utc(2027, 1, 12, 16), 1, id=12, group="lab-b")
    lab_c = make(utc(2027, 1, 12, 14, 20), utc(2027, 1, 12, 16), 2, id=13, group="lab-c")
    both = frozenset({"lab-a", "lab-b"})
    assert count_toward([lab_a, lab_b], [Holder("eve", A100, 1000, both)], AT) == {"eve": 11}  # opened first
    assert count_toward([lab_b, lab_a], [Holder("eve", A100, 1000, both)], AT) == {"eve": 11}  # whatever the order
    same_start = replace(lab_b, start=lab_a.start)
    assert count_toward([same_start, lab_a], [Holder("eve", A100, 1000, both)], AT) == {"eve": 11}  # the lower id
    assert count_toward([lab_a, lab_c], [Holder("eve", A100, 1000, frozenset({"lab-a", "lab-c"}))], AT) == {
        "eve": 13  # lab-c lacks 2, lab-a 1
    }
    # Yan can count toward lab-a only: he is counted first, and Xia's GPU goes to lab-b.
    held = [Holder("xia", A100, 1000, both), Holder("yan", A100, 1000, frozenset({"lab-a"}))]
    assert count_toward([lab_a, lab_b], held, AT) == {"xia": 12, "yan": 11}
    # Another model, or no group of an open one of its model: counted toward none.
    others = [Holder("h", H100, 1000, both), Holder("bob", A100, 1000, frozenset({"physics"}))]
    assert count_toward([lab_a, lab_b], others, AT) == {}
    # Both reservations then keep their GPU from others but one, as the holding counts once.
    toward = count_toward([lab_a, lab_b], [Holder("eve", A100, 1000, both)], AT)
    hold = {11: 1.0} if toward == {"eve": 11} else {12: 1.0}
    assert keep_free(needs([lab_a, lab_b], AT, hold), [], AT) == {A100: Keep(1)}


# -- to_stop --------------------------------------------------------------------------------------


def devices_of(**holders: str) -> dict[str, dict[str, int]]:
    """uuid -> {holder: milli}; each value names the holders of that device, split evenly
    ("" for a free device)."""
    out = {}
    for uuid, names in holders.items():
        who = names.split()
        out[uuid] = {h: 1000 // len(who) for h in who}
    return out


def test_to_stop_takes_the_newest_first_and_lets_off_those_not_needed():
    devices = devices_of(d1="a", d2="b", d3="c", d4="c")
    assert to_stop(1, devices, ["a", "b", "c"]) == ["a"]
    assert to_stop(1, devices, ["b", "a", "c"]) == ["b"]  # the earlier candidate (newer server)
    assert to_stop(2, devices, ["a", "b", "c"]) == ["a", "b"]
    assert to_stop(2, devices, ["a", "c", "b"]) == ["c"]  # a was needed until c came: let off
    assert to_stop(4, devices, ["a", "b", "c"]) == ["a", "b", "c"]
    assert to_stop(9, devices, ["a", "b", "c"]) == ["a", "b", "c"]  # as many as all would free
    assert to_stop(0, devices, ["a", "b", "c"]) == []


def test_free_devices_count_and_holders_that_are_not_candidates_are_not_stopped():
    devices = devices_of(d1="", d2="", d3="a", d4="x")
    assert to_stop(2, devices, ["a"]) == []
    assert to_stop(3, devices, ["a"]) == ["a"]
    assert to_stop(4, devices, ["a"]) == ["a"]  # x's device cannot be freed
    assert to_stop(4, devices_of(d1="a x"), ["a"]) == []  # nor the one a shares with x


def test_two_share_holders_must_both_stop_to_free_one_device():
    devices = devices_of(d1="a b", d2="c")
    assert to_stop(1, devices, ["a", "b", "c"]) == ["a", "b"]
    assert to_stop(1, devices, ["a", "c", "b"]) == ["c"]  # a is let off once c frees d2
    assert to_stop(2, devices, ["a", "b", "c"]) == ["a", "b", "c"]
    # a holds shares of two devices: it and both others free both.
    spread = devices_of(d1="a b", d2="a c")
    assert to_stop(1, spread, ["a", "b", "c"]) == ["a", "b"]
    assert to_stop(2, spread, ["c", "b", "a"]) == ["c", "b", "a"]
    assert to_stop(1, spread, ["b", "c"]) == []  # without a, nothing can be freed


def free_with(devices: dict[str, dict[str, int]], stopped: set[str]) -> int:
    return sum(1 for held in devices.values() if set(held) <= stopped)


HOLDERS = ["h0", "h1", "h2", "h3", "h4", "x"]  # x is never a candidate


@st.composite
def stop_cases(draw) -> tuple[int, dict[str, dict[str, int]], list[str]]:
    devices = {}
    for i in range(draw(st.integers(0, 8))):
        who = draw(st.lists(st.sampled_from(HOLDERS), max_size=3, unique=True))
        devices[f"GPU-{i}"] = {h: 1000 // len(who) for h in who}
    pool = draw(st.permutations(HOLDERS[:-1]))
    candidates = list(pool[: draw(st.integers(0, len(pool)))])
    return draw(st.integers(0, 9)), devices, candidates


@SETTINGS
@given(stop_cases())
@example((1, devices_of(d1="h0 h1", d2="h2"), ["h0", "h1", "h2"]))
@example((2, devices_of(d1="h0", d2="h1 h2", d3="h1 x"), ["h1", "h0", "h2"]))
def test_to_stop_against_every_set_of_candidates(case):
    needed, devices, candidates = case
    got = to_stop(needed, devices, candidates)
    reach = min(needed, free_with(devices, set(candidates)))
    # Enough are freed, or as many as stopping every candidate would.
    assert free_with(devices, set(got)) >= reach
    # Candidates only, each once, newest first.
    assert got == [c for c in candidates if c in got]
    # None of them could be let off: no smaller set among them frees enough.
    for k in range(len(got)):
        for fewer in itertools.combinations(got, k):
            assert free_with(devices, set(fewer)) < reach
    # Newest first: only from the newest candidates that together free enough.
    shortest = next(i for i in range(len(candidates) + 1) if free_with(devices, set(candidates[:i])) >= reach)
    assert set(got) <= set(candidates[:shortest])
    # Nothing to free: nobody stopped.
    if reach <= free_with(devices, set()):
        assert got == []


def room_with(devices: dict[str, dict[str, int]], stopped: set[str]) -> int:
    return sum(1000 - sum(m for h, m in held.items() if h not in stopped) for held in devices.values())


@st.composite
def room_cases(draw) -> tuple[int, int, dict[str, dict[str, int]], list[str]]:
    devices = {}
    for i in range(draw(st.integers(0, 6))):
        who = draw(st.lists(st.sampled_from(HOLDERS), max_size=3, unique=True))
        parts = [draw(st.integers(1, 1000 // max(1, len(who)))) for _ in who]
        devices[f"GPU-{i}"] = dict(zip(who, [1000] if len(who) == 1 and draw(st.booleans()) else parts))
    pool = draw(st.permutations(HOLDERS[:-1]))
    candidates = list(pool[: draw(st.integers(0, len(pool)))])
    return draw(st.integers(0, 4)), draw(st.integers(0, 6000)), devices, candidates


@SETTINGS
@given(room_cases())
@example((0, 500, {"d1": {"h0": 300, "h1": 300}, "d2": {"h2": 1000}}, ["h0", "h1", "h2"]))
def test_to_stop_frees_a_share_totals_room_against_every_set_of_candidates(case):
    needed, room, devices, candidates = case
    got = to_stop(needed, devices, candidates, room)
    everyone = set(candidates)
    reach = min(needed, free_with(devices, everyone))
    want = reach * 1000 + min(room, max(0, room_with(devices, everyone) - reach * 1000))

    def enough(stopped: set[str]) -> bool:
        return free_with(devices, stopped) >= reach and room_with(devices, stopped) >= want

    assert enough(set(got))
    assert got == [c for c in candidates if c in got]  # candidates only, each once, newest first
    for k in range(len(got)):  # none could be let off
        for fewer in itertools.combinations(got, k):
            assert not enough(set(fewer))
    shortest = next(i for i in range(len(candidates) + 1) if enough(set(candidates[:i])))
    assert set(got) <= set(candidates[:shortest])
    if enough(set()):
        assert got == []


@pytest.mark.parametrize(
    "needed, devices, candidates, stopped",
    [
        (3, devices_of(d1="a", d2="a", d3="b", d4="b", d5="c", d6="c", d7="c"), ["a", "b", "c"], ["a", "b"]),
        (5, devices_of(d0="", d1="", d2="", d3="", d4="a b e", d5="e c"), ["a", "b", "c", "d", "e"], ["a", "b", "e"]),
    ],
)
def test_to_stop_takes_the_newest_first_even_where_fewer_older_ones_would_do(needed, devices, candidates, stopped):
    """The newest servers make room (docs/reservations.md), not the fewest: c alone would free
    3 devices, and c with e would free 2, but they are older."""
    assert to_stop(needed, devices, candidates) == stopped


def test_a_weekly_reservation_until_a_day_has_no_window_starting_from_it():
    """Guards docs/reservations.md, "Making one": "ends a weekly reservation: no window starts at or
    after it (one under way then is kept to its end)"."""
    course = make(utc(2027, 1, 12, 14), utc(2027, 1, 12, 16), weekly=True, tz="Europe/Berlin")
    ends = replace(course, until=utc(2027, 1, 26, 14))  # the third Tuesday's start: its window is not held
    assert [w.start for w in ends.windows(utc(2027, 1, 1), utc(2027, 3, 1))] == [
        utc(2027, 1, 12, 14),
        utc(2027, 1, 19, 14),
    ]
    assert ends.next_window(utc(2027, 1, 20)) is None and ends.over(utc(2027, 1, 26, 14))
    midway = replace(course, until=utc(2027, 1, 19, 15))  # during the second window: it is held to its end
    assert midway.active(utc(2027, 1, 19, 15, 30)) == Window(utc(2027, 1, 19, 14), utc(2027, 1, 19, 16))
    assert not midway.over(utc(2027, 1, 19, 15, 30)) and midway.over(utc(2027, 1, 19, 16))
    assert not course.over(utc(2030, 1, 1))  # without an until: every week on
    assert ends.as_json()["until"] == "2027-01-26T14:00:00Z"
    assert ends.describe().endswith("every week, Tue 15:00–17:00 Europe/Berlin until 2027-01-26 15:00")
    # A reservation that has ended conflicts with nothing; one that has not, as before.
    later = replace(course, id=2, start=utc(2027, 2, 2, 14), end=utc(2027, 2, 2, 16))
    assert conflicts(later, [replace(ends, id=1, count=4)], 4, utc(2027, 1, 1)) == []
    assert conflicts(later, [replace(course, id=1, count=4)], 4, utc(2027, 1, 1)) == [replace(course, id=1, count=4)]
