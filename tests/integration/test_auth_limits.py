"""Abuse limits on signing in (orchestrator/api/throttle.py) and on what a token's use writes
(orchestrator/api/tokens.py).

Failed sign-ins, by bad bearer token or failed admin login, share one budget per client
address; past it every sign-in from the address is a 429 with Retry-After until the window
ends, and successful ones are never counted. An accepted token stamps `last_used_at` at most
once a minute; a refused one never does.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import ApiToken
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks"
LOGIN = "/admin/login/"
LIMIT = 3
WINDOW_S = 60


@pytest.fixture(autouse=True)
def _small_budget(settings: LazySettings) -> None:
    settings.CONFIG = dataclasses.replace(
        settings.CONFIG, auth_failure_limit=LIMIT, auth_failure_window_s=WINDOW_S
    )


def _bearer(token: str, address: str = "127.0.0.1") -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"}, REMOTE_ADDR=address)


def _log_in(password: str, address: str = "127.0.0.1") -> int:
    response = Client(REMOTE_ADDR=address).post(
        LOGIN, {"username": "ops", "password": password, "next": "/admin/"}
    )
    if response.status_code == 429:
        assert 0 < int(response["Retry-After"]) <= WINDOW_S
        assert "too many failed sign-ins" in response.content.decode()
    return response.status_code


def _assert_throttled_json(response: object) -> None:
    assert response.status_code == 429  # type: ignore[attr-defined]
    retry_after = int(response["Retry-After"])  # type: ignore[index]
    assert 0 < retry_after <= WINDOW_S
    assert response.json() == {  # type: ignore[attr-defined]
        "detail": f"too many failed sign-ins from this address; try again in {retry_after} s",
        "code": "too_many_failed_sign_ins",
    }


# --- API tokens ------------------------------------------------------------------------------


def test_bad_tokens_past_the_limit_are_a_429_even_for_a_good_token() -> None:
    good = tokens.issue(operator())[1]

    for _ in range(LIMIT):
        assert _bearer("lmt_wrong").get(TASKS).status_code == 401
    _assert_throttled_json(_bearer("lmt_wrong").get(TASKS))
    # A right guess from the same address is refused too, or the 429 would tell it was right.
    _assert_throttled_json(_bearer(good).get(TASKS))
    assert _bearer(good, address="10.0.0.2").get(TASKS).status_code == 200


def test_malformed_authorization_headers_count_as_failures() -> None:
    for header in ("Token abc", "Bearer ", "Basic b3BzOnB3"):
        client = Client(headers={"Authorization": header})
        assert client.get(TASKS).status_code == 401
    _assert_throttled_json(_bearer("lmt_wrong").get(TASKS))


def test_successful_and_missing_credentials_are_not_counted() -> None:
    good = _bearer(tokens.issue(operator())[1])
    for _ in range(LIMIT * 3):
        assert good.get(TASKS).status_code == 200
        assert Client().get(TASKS).status_code == 401  # no credentials: not a sign-in
    # A token of a user the API refuses is a known token: a 403, not a failed sign-in.
    refused = _bearer(tokens.issue(account("viewer", staff=False))[1])
    for _ in range(LIMIT * 2):
        assert refused.get(TASKS).status_code == 403

    for _ in range(LIMIT - 1):
        assert _bearer("lmt_wrong").get(TASKS).status_code == 401
    assert good.get(TASKS).status_code == 200
    assert _bearer("lmt_wrong").get(TASKS).status_code == 401
    _assert_throttled_json(good.get(TASKS))


def test_a_signed_in_session_is_not_a_sign_in_attempt() -> None:
    for _ in range(LIMIT):
        _bearer("lmt_wrong").get(TASKS)
    session = Client()
    session.force_login(operator())

    assert session.get(TASKS).status_code == 200


def test_the_count_starts_again_after_the_window(settings: LazySettings) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, auth_failure_window_s=1)
    for _ in range(LIMIT):
        _bearer("lmt_wrong").get(TASKS)
    blocked = _bearer("lmt_wrong").get(TASKS)
    assert blocked.status_code == 429 and blocked["Retry-After"] == "1"

    time.sleep(1.1)

    assert _bearer("lmt_wrong").get(TASKS).status_code == 401


# --- the admin login -------------------------------------------------------------------------


def test_failed_admin_logins_past_the_limit_are_a_429_even_with_the_password() -> None:
    operator()

    for _ in range(LIMIT):
        assert _log_in("wrong") == 200
    assert _log_in("wrong") == 429
    assert _log_in(PASSWORD) == 429
    assert _log_in(PASSWORD, address="10.0.0.2") == 302
    # Only sign-ins are refused: the login page itself still loads.
    assert Client().get(LOGIN).status_code == 200


def test_successful_admin_logins_are_not_counted() -> None:
    operator()
    for _ in range(LIMIT * 2):
        assert _log_in(PASSWORD) == 302

    for _ in range(LIMIT - 1):
        assert _log_in("wrong") == 200
    assert _log_in(PASSWORD) == 302


def test_tokens_and_admin_logins_share_one_budget() -> None:
    operator()
    for _ in range(LIMIT - 1):
        assert _bearer("lmt_wrong").get(TASKS).status_code == 401
    assert _log_in("wrong") == 200

    assert _log_in(PASSWORD) == 429
    _assert_throttled_json(_bearer("lmt_wrong").get(TASKS))


# --- last_used_at ----------------------------------------------------------------------------


def _token_writes(client: Client, requests: int) -> int:
    with CaptureQueriesContext(connection) as queries:
        for _ in range(requests):
            client.get(TASKS)
    return sum(1 for q in queries if q["sql"].startswith('UPDATE "api_token"'))


def test_an_accepted_token_is_stamped_at_most_once_a_minute() -> None:
    client = _bearer(tokens.issue(operator())[1])
    before = timezone.now()

    assert _token_writes(client, 5) == 1
    first = ApiToken.objects.get().last_used_at
    assert first is not None and first >= before

    # A minute on, the next accepted request stamps again, and only that one.
    ApiToken.objects.update(last_used_at=first - timedelta(seconds=61))
    assert _token_writes(client, 5) == 1
    assert ApiToken.objects.get().last_used_at >= before


REFUSED_HOLDERS = {
    "not-staff": lambda: account("holder", Access.VIEW, staff=False),
    "no-permission": lambda: account("holder"),
    "operate-without-view": lambda: account("holder", Access.OPERATE),
}


@pytest.mark.parametrize("holder", REFUSED_HOLDERS)
def test_a_refused_token_is_not_stamped(holder: str) -> None:
    client = _bearer(tokens.issue(REFUSED_HOLDERS[holder]())[1])

    assert _token_writes(client, 3) == 0
    assert client.get(TASKS).status_code == 403
    assert ApiToken.objects.get().last_used_at is None
