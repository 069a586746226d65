"""Run windows (issue 38): the SDK's checks, each naming its field; the opening and closing
crons; open or closed at a moment, past midnight and across daylight saving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lumastra import config
from orchestrator.windows import state_of
from tasks.window import OnClose, Window, WindowError


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"span": "25:00-06:00"}, "window"),
        ({"span": "01:00-06:60"}, "window"),
        ({"span": "1:00-6:00"}, "window"),
        ({"span": "10:00-10:00"}, "window"),
        ({"span": "01:00-06:00", "days": "funday"}, "days"),
        ({"span": "01:00-06:00", "days": "mon-"}, "days"),
        ({"span": "01:00-06:00", "tz": "Mars/Olympus"}, "tz"),
        ({"span": "01:00-06:00", "on_close": "later"}, "on_close"),
    ],
)
def test_a_bad_window_names_its_field(kwargs: dict[str, str], field: str) -> None:
    with pytest.raises(WindowError) as refused:
        Window(**kwargs)
    assert refused.value.field == field


def test_days_are_read_as_ranges_lists_and_wrapping_ranges() -> None:
    assert Window("01:00-02:00").days == "mon,tue,wed,thu,fri,sat,sun"
    assert Window("01:00-02:00", days="fri-mon").days == "mon,fri,sat,sun"
    assert Window("01:00-02:00", days="sat, sun,mon-tue").days == "mon,tue,sat,sun"


def test_a_span_past_midnight_closes_on_the_next_day() -> None:
    window = Window("22:00-06:30", days="fri")
    assert window.opening() == "0 22 * * 5"
    assert window.closing() == "30 6 * * 6"
    sunday = Window("22:00-06:00", days="sun")
    assert (sunday.opening(), sunday.closing()) == ("0 22 * * 0", "0 6 * * 1")
    same_day = Window("01:00-06:00", days="mon-fri")
    assert same_day.closing() == "0 6 * * 1,2,3,4,5"


def test_the_environment_form_is_parsed_and_checked() -> None:
    window = Window.parse("01:00-06:00 days=mon-fri tz=Europe/Berlin on_close=stop")
    assert window == Window("01:00-06:00", days="mon-fri", tz="Europe/Berlin", on_close="stop")
    assert window.on_close is OnClose.STOP
    for bad in ("", "01:00-06:00 colour=red", "01:00-06:00 days=mon days=tue", "25:00-01:00"):
        with pytest.raises(WindowError):
            Window.parse(bad)
    with pytest.raises(config.ConfigError, match="LUMASTRA_WINDOW_ANALYSIS"):
        config.load({"LUMASTRA_WINDOW_ANALYSIS": "01:00-06:00 tz=Nowhere/Land"})
    found = config.load({"LUMASTRA_WINDOW_ANALYSIS": "01:00-06:00", "LUMASTRA_WINDOW_IO": ""})
    assert found.class_windows == {"analysis": Window("01:00-06:00")}


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_a_friday_night_window_is_open_until_saturday_morning_only() -> None:
    window = Window("22:00-06:00", days="fri")
    friday_evening = _utc("2027-01-08T21:59:59")  # Friday
    closed = state_of(window, "UTC", friday_evening)
    assert not closed.open
    assert closed.opens_at == _utc("2027-01-08T22:00:00")
    assert closed.closes_at == _utc("2027-01-09T06:00:00")
    inside = state_of(window, "UTC", _utc("2027-01-09T05:59:59"))
    assert inside.open and inside.opened_at == _utc("2027-01-08T22:00:00")
    assert inside.closes_at == _utc("2027-01-09T06:00:00")
    after = state_of(window, "UTC", _utc("2027-01-09T06:00:00"))
    assert not after.open and after.opens_at == _utc("2027-01-15T22:00:00")
    # Saturday night is not Friday night.
    assert not state_of(window, "UTC", _utc("2027-01-09T23:00:00")).open


def test_daylight_saving_moves_the_edges_as_it_moves_a_crons_fires() -> None:
    window = Window("02:30-04:00", tz="Europe/Berlin")
    # 28 March 2027: Berlin's clocks jump from 02:00 to 03:00; 02:30 does not exist, so the
    # window opens at the gap's end, 03:00 CEST (01:00 UTC), and closes at 04:00 CEST.
    before = state_of(window, "Europe/Berlin", _utc("2027-03-28T00:59:59"))
    assert not before.open
    assert before.opens_at == _utc("2027-03-28T01:00:00")
    assert before.closes_at == _utc("2027-03-28T02:00:00")
    assert state_of(window, "Europe/Berlin", _utc("2027-03-28T01:00:00")).open
    # 31 October 2027: 02:30 occurs twice; the window opens at the first (00:30 UTC) and
    # stays open through the repeated hour until 04:00 CET (03:00 UTC).
    fall = state_of(window, "Europe/Berlin", _utc("2027-10-31T00:29:59"))
    assert fall.opens_at == _utc("2027-10-31T00:30:00")
    for minutes in (0, 60, 120, 149):
        at = _utc("2027-10-31T00:30:00") + timedelta(minutes=minutes)
        assert state_of(window, "Europe/Berlin", at).open, at
    assert not state_of(window, "Europe/Berlin", _utc("2027-10-31T03:00:00")).open


def test_a_task_of_the_operators_priority_may_not_declare_a_window() -> None:
    from tasks import define_task
    from tasks.errors import ManifestError

    with pytest.raises(ManifestError, match="window"):
        define_task(
            id="rush-job",
            resource_class="io",
            execute=lambda ctx, params: None,
            task_priority=1,
            window=Window("01:00-02:00"),
        )
