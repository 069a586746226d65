"""The coverage outbox's dead letters over the API (`coverage/outbox_api.py`): listed in pages,
redelivered with an outcome per id, by whom the console lets."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from coverage.models import EventOutbox
from orchestrator.api import tokens
from orchestrator.api.access import Access
from tests.support.users import account, operator

pytestmark = [pytest.mark.django_db(transaction=True)]

LIST = "/api/v1/coverage/outbox/dead-letters"
REDELIVER = "/api/v1/coverage/outbox/dead-letters/redeliver"


def _client(user: object) -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(user, 'outbox')[1]}"})  # type: ignore[arg-type]


def _dead(count: int) -> list[int]:
    EventOutbox.objects.all().delete()
    return [
        EventOutbox.objects.create(
            kind="item.metadata_changed", item_id=1000 + i, attempts=8, dead_at=timezone.now()
        ).pk
        for i in range(count)
    ]


def test_dead_events_are_listed_newest_first_in_pages() -> None:
    ids = _dead(5)
    EventOutbox.objects.create(kind="item.added", item_id=7)  # alive: not a dead letter
    client = _client(account("outbox-viewer", Access.VIEW))

    first = client.get(LIST, {"limit": 3}).json()
    rest = client.get(LIST, {"limit": 3, "cursor": first["next_cursor"]}).json()

    assert first["count"] == 5
    assert [e["id"] for e in first["items"]] == ids[::-1][:3]
    assert [e["id"] for e in rest["items"]] == ids[::-1][3:]
    assert rest["next_cursor"] is None
    assert first["items"][0]["attempts"] == 8


def test_redeliver_answers_each_id_and_puts_the_dead_ones_back() -> None:
    ids = _dead(2)
    alive = EventOutbox.objects.create(kind="item.added", item_id=9).pk

    answer = _client(operator("outbox-ops")).post(
        REDELIVER, {"ids": [ids[0], alive, 999_999]}, content_type="application/json"
    )

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["redelivered"] == 1
    assert [i["outcome"] for i in body["items"]] == ["redelivered", "not_found", "not_found"]
    event = EventOutbox.objects.get(pk=ids[0])
    assert (event.dead_at, event.attempts) == (None, 0)
    assert EventOutbox.objects.get(pk=ids[1]).dead_at is not None  # not asked for


@pytest.mark.parametrize("body", [{}, {"ids": []}, {"ids": ["1"]}, {"ids": [1], "x": 1}])
def test_a_bad_body_is_a_422_and_changes_nothing(body: dict[str, object]) -> None:
    ids = _dead(1)

    answer = _client(operator("outbox-ops")).post(REDELIVER, body, content_type="application/json")

    assert answer.status_code == 422
    assert EventOutbox.objects.get(pk=ids[0]).dead_at is not None


def test_who_may_read_and_redeliver() -> None:
    ids = _dead(1)
    viewer = _client(account("outbox-viewer", Access.VIEW))
    body = {"ids": ids}

    assert Client().get(LIST).status_code == 401
    assert _client(account("outbox-nobody")).get(LIST).status_code == 403
    assert viewer.get(LIST).status_code == 200
    assert Client().post(REDELIVER, body, content_type="application/json").status_code == 401
    assert viewer.post(REDELIVER, body, content_type="application/json").status_code == 403
    assert EventOutbox.objects.get(pk=ids[0]).dead_at is not None
