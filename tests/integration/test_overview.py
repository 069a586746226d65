"""Each task's admission status in the API and the admin "Tasks" page, and the operator's
force-enable of a circuit from both, on real Postgres, Valkey and broker.

The circuit is opened through the `CircuitBreaker` hook with a FrozenClock anchored at the
real time (as test_circuit does); slots are taken through the concurrency hook; queue depth
is that of private queues no worker consumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import LazySettings, settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orchestrator.admin import stats, tasks_page
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.clock import SYSTEM, FrozenClock, describe
from orchestrator.hooks import concurrency, overview
from orchestrator.hooks.base import Admission, Outcome, Pickup, run_alone
from orchestrator.hooks.circuit import CircuitBreaker, status
from orchestrator.hooks.concurrency import ConcurrencyLimit
from orchestrator.hooks.quotas import DailyQuota, QuotaExceeded
from orchestrator.models import CircuitState, TaskCircuitState, TaskHistory, TaskQuotaUsage
from orchestrator.routing import queue_name
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.errors import ErrorKind
from tests.support.messages import empty_queues
from tests.support.users import account, operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASKS = "/api/v1/tasks"
ADMIN_TASKS = "/admin/orchestrator/taskhistory/tasks/"
CIRCUIT = "test-circuit"  # its own circuit, so opening it refuses no other test's runs
MINUTE = timedelta(minutes=1)
# Private queues (tests/support/fixtures.py): nothing consumes them during these tests.
QUOTA_TASK = "test-unique-quota"  # max_runs_per_day=1
DEPTH_TASK = "test-bp-fail"  # the only task of the "embedding" class
LIMITED_TASK = "test-limited"  # max_concurrent=2


def _force_url(task_id: str) -> str:
    return f"{TASKS}/{task_id}/circuit/force-enable"


def _admin_force_url(task_id: str) -> str:
    return f"{ADMIN_TASKS}{task_id}/force-enable/"


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    # Circuit hashes and slot holders have no test-scoped lifetime: start and end without them.
    client = valkey.client()
    owned = [keys.circuit(CIRCUIT), keys.concurrency_holders(LIMITED_TASK)]
    client.delete(*owned)
    queue = queue_name(registry.get()[DEPTH_TASK], settings.CONFIG.per_task_queues)
    empty_queues(queue)
    yield
    client.delete(*owned)


@pytest.fixture
def clock() -> FrozenClock:
    # Whole milliseconds, as the circuit stores them, so times compare exactly.
    now = SYSTEM.now()
    return FrozenClock(now.replace(microsecond=now.microsecond // 1000 * 1000))


@pytest.fixture
def staff() -> User:
    return operator("ops")


@pytest.fixture
def api(staff: User) -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(staff, 'tests')[1]}"})


def _open_circuit(clock: FrozenClock) -> None:
    """As many fatal failures in a row as open a circuit, through the hook the runner calls."""
    breaker = CircuitBreaker(clock=clock)
    definition = registry.get()[CIRCUIT]
    for _ in range(settings.CONFIG.circuit_failure_threshold):
        admission = Admission(definition, new_run_id(), "identity", 5, {"kind": "manual"})
        run_alone(breaker.plan_admit(admission))
        run_alone(
            breaker.plan_finished(
                Outcome(
                    definition, admission.run_id, "test-owner", RunState.FAILED, ErrorKind.FATAL
                )
            )
        )
    assert status(CIRCUIT, clock=clock).state == CircuitState.OPEN


def _fill_quota() -> str:
    """Takes QUOTA_TASK's one run of the day, then is refused a second; returns the run id.

    Fresh identities each time: identity keys outlive a test's database."""
    started = start_run(QUOTA_TASK, {"key": new_run_id()}, trigger=TriggerKind.MANUAL)
    with pytest.raises(QuotaExceeded):
        start_run(QUOTA_TASK, {"key": new_run_id()}, trigger=TriggerKind.MANUAL)
    return started.run_id


def _status(client: Client, task_id: str) -> dict[str, Any]:
    response = client.get(f"{TASKS}/{task_id}")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    assert body["id"] == task_id
    return body["status"]


def _moment(value: str) -> datetime:
    return datetime.fromisoformat(value)


# --- the API ---------------------------------------------------------------------------------


def test_an_open_circuit_shows_when_it_half_opens(api: Client, clock: FrozenClock) -> None:
    _open_circuit(clock)

    circuit = _status(api, CIRCUIT)["circuit"]

    assert circuit["state"] == "open"
    assert (circuit["consecutive_failures"], circuit["reopen_count"]) == (5, 1)
    assert _moment(circuit["opened_at"]) == clock.now()
    assert _moment(circuit["half_open_at"]) == clock.now() + MINUTE
    # Read on the system clock, a little after the frozen one.
    assert 0 < circuit["time_to_half_open_s"] <= MINUTE.total_seconds()
    assert circuit["forced_until"] is None and circuit["forced_by"] is None
    listed = {task["id"]: task["status"] for task in api.get(TASKS).json()}
    assert set(listed) == set(registry.get())
    assert listed[CIRCUIT]["circuit"]["state"] == "open"
    assert listed["test-noop"]["circuit"]["state"] == "closed"
    assert listed["test-noop"]["circuit"]["time_to_half_open_s"] is None


def test_quota_use_and_refusals_of_today(api: Client) -> None:
    definition = registry.get()[QUOTA_TASK]
    run_id = _fill_quota()
    # The runner's end of a run, through the quota hook.
    run_alone(
        DailyQuota().plan_finished(Outcome(definition, run_id, "test-owner", RunState.COMPLETED))
    )

    found = _status(api, QUOTA_TASK)

    day = TaskQuotaUsage.objects.get(task_id=QUOTA_TASK).day
    assert found["quota_today"] == {
        "day": day.isoformat(),
        "started": 1,
        "completed": 1,
        "failed": 0,
        "max_runs_per_day": 1,
        "cost": {},
        "max_cost_per_day": {},
    }
    assert found["refusals_today"] == {"quota_exceeded": 1}
    untouched = _status(api, "test-noop")
    assert untouched["quota_today"]["started"] == 0
    assert untouched["quota_today"]["max_runs_per_day"] is None
    assert untouched["refusals_today"] == {}


def test_queue_depth_of_the_class_against_its_cap(api: Client, settings: LazySettings) -> None:
    caps = {**settings.CONFIG.queue_depth_cap_overrides, "embedding": 5}
    settings.CONFIG = dataclasses.replace(settings.CONFIG, queue_depth_cap_overrides=caps)
    for _ in range(2):
        start_run(DEPTH_TASK, {}, trigger=TriggerKind.MANUAL)

    queue = _status(api, DEPTH_TASK)["queue"]

    assert queue == {"resource_class": "embedding", "waiting": 2, "cap": 5}


def test_running_against_the_concurrency_limit(api: Client) -> None:
    definition = registry.get()[LIMITED_TASK]
    held = Pickup(definition, new_run_id(), "test-owner")
    run_alone(ConcurrencyLimit().plan_before_claim(held))
    # A crashed holder whose lease ran out (on Valkey's clock) holds nothing any more.
    seconds, micros = valkey.client().time()
    valkey.client().zadd(
        keys.concurrency_holders(LIMITED_TASK),
        {concurrency.holder(new_run_id(), "dead-owner"): seconds * 1000 + micros // 1000 - 1},
    )

    assert _status(api, LIMITED_TASK)["concurrency"] == {"running": 1, "limit": 2}

    run_alone(
        ConcurrencyLimit().plan_finished(
            Outcome(definition, held.run_id, "test-owner", RunState.COMPLETED)
        )
    )
    assert _status(api, LIMITED_TASK)["concurrency"] == {"running": 0, "limit": 2}
    # A task without max_concurrent has no limit but its pools' processes.
    assert _status(api, "test-bp-drop")["concurrency"] == {"running": 0, "limit": None}


def test_rate_limit_is_shown_when_the_task_has_one(api: Client) -> None:
    assert _status(api, "test-rated")["rate"] == "10/s"
    assert _status(api, "test-noop")["rate"] is None


def test_all_tasks_cost_three_queries_whatever_their_number() -> None:
    definitions = list(registry.get().values())

    with CaptureQueriesContext(connection) as queries:
        found = overview.task_statuses(definitions)

    assert list(found) == [definition.id for definition in definitions]
    # Quotas, today's rolled-up spend, and (no circuit hash exists yet) the lost-hash lookup.
    assert len(queries) == 3


def test_force_enable_over_the_api_closes_an_open_circuit(api: Client, clock: FrozenClock) -> None:
    _open_circuit(clock)

    response = api.post(_force_url(CIRCUIT))

    assert response.status_code == 200
    forced = response.json()
    assert forced["state"] == "closed"
    assert forced["time_to_half_open_s"] is None
    assert forced["forced_by"] == "ops"
    ttl = timedelta(seconds=settings.CONFIG.circuit_force_enable_ttl_s)
    assert clock.now() + ttl <= _moment(forced["forced_until"]) <= SYSTEM.now() + ttl
    assert _status(api, CIRCUIT)["circuit"] == forced
    assert TaskCircuitState.objects.get(task_id=CIRCUIT).forced_by == "ops"
    # Starts are admitted again.
    run_alone(
        CircuitBreaker(clock=clock).plan_admit(
            Admission(registry.get()[CIRCUIT], new_run_id(), "identity", 5, {"kind": "manual"})
        )
    )


def test_force_enable_over_a_staff_session_needs_the_csrf_token(
    staff: User, clock: FrozenClock
) -> None:
    _open_circuit(clock)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)

    refused = client.post(_force_url(CIRCUIT))
    assert refused.status_code == 403
    assert status(CIRCUIT).state == CircuitState.OPEN

    secret = "a" * 32  # an unmasked CSRF secret: the cookie and the header must agree
    client.cookies[settings.CSRF_COOKIE_NAME] = secret
    forced = client.post(_force_url(CIRCUIT), HTTP_X_CSRFTOKEN=secret)
    assert forced.status_code == 200
    assert forced.json()["forced_by"] == "ops"


def test_unknown_task_is_a_json_404(api: Client) -> None:
    for response in (api.get(f"{TASKS}/no-such-task"), api.post(_force_url("no-such-task"))):
        assert response.status_code == 404
        assert response.json() == {"detail": "unknown task 'no-such-task'"}


def test_credentials_are_required_and_refused_calls_change_nothing(clock: FrozenClock) -> None:
    _open_circuit(clock)
    anonymous = Client()
    viewer = User.objects.create_user("viewer")
    not_staff = Client(headers={"Authorization": f"Bearer {tokens.issue(viewer)[1]}"})

    for path in (TASKS, f"{TASKS}/{CIRCUIT}"):
        assert anonymous.get(path).status_code == 401
        assert not_staff.get(path).status_code == 403
    unauthenticated = anonymous.post(_force_url(CIRCUIT))
    assert unauthenticated.status_code == 401
    assert unauthenticated["WWW-Authenticate"] == "Bearer"
    assert not_staff.post(_force_url(CIRCUIT)).status_code == 403

    assert status(CIRCUIT).state == CircuitState.OPEN


def test_openapi_lists_the_task_endpoints() -> None:
    paths = Client().get("/api/v1/openapi.json").json()["paths"]

    assert set(paths[f"{TASKS}/{{task_id}}"]) == {"get"}
    assert set(paths[f"{TASKS}/{{task_id}}/circuit/force-enable"]) == {"post"}


# --- the admin -------------------------------------------------------------------------------


def _row(page: str, task_id: str) -> str:
    start = page.index(f'<tr id="task-{task_id}"')
    return page[start : page.index("</tr>", start)]


def test_admin_tasks_page_shows_every_tasks_status(
    staff: User, clock: FrozenClock, settings: LazySettings, admin_client: Client
) -> None:
    _open_circuit(clock)
    caps = {**settings.CONFIG.queue_depth_cap_overrides, "embedding": 5}
    settings.CONFIG = dataclasses.replace(settings.CONFIG, queue_depth_cap_overrides=caps)
    start_run(DEPTH_TASK, {}, trigger=TriggerKind.MANUAL)
    _fill_quota()
    held = Pickup(registry.get()[LIMITED_TASK], new_run_id(), "test-owner")
    run_alone(ConcurrencyLimit().plan_before_claim(held))
    client = Client()
    client.force_login(staff)

    # The runs list links to the status page.
    changelist = admin_client.get("/admin/orchestrator/taskhistory/").content.decode()
    response = client.get(ADMIN_TASKS)

    assert f'href="{ADMIN_TASKS}"' in changelist
    assert response.status_code == 200
    page = response.content.decode()
    for task_id in registry.get():
        assert f'<tr id="task-{task_id}"' in page
        assert f'action="{_admin_force_url(task_id)}"' in page
    circuit = _row(page, CIRCUIT)
    assert "<strong>open</strong>" in circuit
    assert "half-opens in " in circuit
    assert (clock.now() + MINUTE).strftime("%Y-%m-%d %H:%M:%S") in circuit
    assert "5 failures in a row" in circuit
    assert '<td class="queue">1 / 5 (embedding)</td>' in _row(page, DEPTH_TASK)
    quota = _row(page, QUOTA_TASK)
    assert '<td class="quota">1 / 0 / 0 of 1</td>' in quota
    assert "quota_exceeded: 1" in quota
    assert '<td class="concurrency">1 / 2</td>' in _row(page, LIMITED_TASK)
    assert '<td class="rate">10/s</td>' in _row(page, "test-rated")


def test_admin_force_enable_closes_the_circuit_and_says_so(staff: User, clock: FrozenClock) -> None:
    _open_circuit(clock)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)

    refused = client.post(_admin_force_url(CIRCUIT))
    assert refused.status_code == 403
    assert status(CIRCUIT).state == CircuitState.OPEN

    page = client.get(ADMIN_TASKS)
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    assert page.status_code == 200
    forced = client.post(_admin_force_url(CIRCUIT), {"csrfmiddlewaretoken": token})

    assert forced.status_code == 302
    assert forced["Location"] == ADMIN_TASKS
    after = status(CIRCUIT)
    assert after.state == CircuitState.CLOSED
    assert after.forced_by == "ops" and after.forced_until is not None
    shown = client.get(ADMIN_TASKS).content.decode()
    assert f"The circuit of {CIRCUIT} is closed and force-enabled until" in shown
    assert "forced by ops until" in _row(shown, CIRCUIT)


def test_admin_force_enable_is_a_post_for_staff_on_known_tasks(
    staff: User, clock: FrozenClock
) -> None:
    _open_circuit(clock)
    visitor = Client()
    visitor.force_login(User.objects.create_user("visitor"))
    admin = Client()
    admin.force_login(staff)

    for response in (visitor.get(ADMIN_TASKS), visitor.post(_admin_force_url(CIRCUIT))):
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert admin.get(_admin_force_url(CIRCUIT)).status_code == 405
    assert admin.post(_admin_force_url("no-such-task")).status_code == 404

    assert status(CIRCUIT).state == CircuitState.OPEN


# --- the admin: what each task is, how its runs went, where to start one ---------------------

STATS_TASK = "test-noop"
START_URL = "/admin/orchestrator/taskhistory/start/"


def _seed_run(
    task_id: str, state: RunState, *, ended_ago: timedelta | None, took: timedelta | None
) -> str:
    """A run of `task_id` in `state`, created now (Postgres clock) and, when `ended_ago` is
    given, ended that long ago after running for `took`."""
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id,
        task_id=task_id,
        state=state,
        trigger={"kind": "manual"},
        input={},
        priority=5,
        identity=run_id,
    )
    if ended_ago is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE task_history SET finished_at = now() - %(ago)s,"
                " started_at = CASE WHEN %(ran)s THEN now() - %(ago)s - %(took)s END,"
                " created_at = now() - %(ago)s - %(took)s - interval '1 second' WHERE id = %(id)s",
                {
                    "ago": ended_ago,
                    "took": took or timedelta(0),
                    "ran": took is not None,
                    "id": run_id,
                },
            )
    return run_id


def _seed_a_day_of_runs() -> str:
    """STATS_TASK's runs: in the last day 20 completed taking 1..20 s and one failed taking
    21 s, two cancelled; an older completed run and a pending one that do not count. Returns
    the newest run's id (the pending one)."""
    for seconds in range(1, 21):
        _seed_run(
            STATS_TASK,
            RunState.COMPLETED,
            ended_ago=timedelta(hours=1, seconds=seconds),
            took=timedelta(seconds=seconds),
        )
    _seed_run(STATS_TASK, RunState.FAILED, ended_ago=timedelta(hours=2), took=timedelta(seconds=21))
    _seed_run(STATS_TASK, RunState.CANCELLED, ended_ago=timedelta(hours=3), took=None)
    _seed_run(STATS_TASK, RunState.CANCELLED, ended_ago=timedelta(hours=3), took=timedelta(hours=5))
    # Ended before the window: neither counted nor timed.
    _seed_run(
        STATS_TASK,
        RunState.COMPLETED,
        ended_ago=timedelta(days=1, hours=1),
        took=timedelta(hours=9),
    )
    return _seed_run(STATS_TASK, RunState.PENDING, ended_ago=None, took=None)


def test_the_last_days_runs_of_each_task() -> None:
    newest = _seed_a_day_of_runs()

    ended = stats.ended([STATS_TASK, "test-rated"])
    last = stats.last_runs([STATS_TASK, "test-rated"])

    # p50 of the 21 timed runs (1..21 s) is the 11th, p95 (at 0.95 * 20 = 19) the 20th.
    assert ended[STATS_TASK] == stats.Ended(
        completed=20,
        failed=1,
        cancelled=2,
        p50=timedelta(seconds=11),
        p95=timedelta(seconds=20),
    )
    assert ended[STATS_TASK].success_rate == 20 / 21
    assert ended["test-rated"] == stats.NOTHING_ENDED
    assert ended["test-rated"].success_rate is None
    assert list(last) == [STATS_TASK]
    assert last[STATS_TASK].run_id == newest
    assert last[STATS_TASK].state == RunState.PENDING
    assert last[STATS_TASK].at == last[STATS_TASK].created_at


def test_admin_tasks_page_shows_the_last_run_and_the_last_days_stats(staff: User) -> None:
    newest = _seed_a_day_of_runs()
    client = Client()
    client.force_login(staff)

    page = client.get(ADMIN_TASKS).content.decode()

    row = _row(page, STATS_TASK)
    last = row[row.index('<td class="last-run">') :]
    assert last.startswith(
        f'<td class="last-run"><a href="/admin/orchestrator/taskhistory/{newest}/change/">'
        f"{newest}</a><br>pending, "
    )
    assert '<td class="success">95.2 % (20 of 21)<br>2 cancelled</td>' in row
    assert '<td class="durations">11 s / 20 s</td>' in row
    idle = _row(page, "test-rated")
    assert '<td class="last-run">never</td>' in idle
    assert '<td class="success">-</td>' in idle
    assert '<td class="durations">-</td>' in idle


def test_admin_tasks_page_says_what_each_task_is(
    staff: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LUMASTRA_HISTORY_RETENTION_EVERY", "6h")
    client = Client()
    client.force_login(staff)

    page = client.get(ADMIN_TASKS).content.decode()

    for definition in registry.get().values():
        row = _row(page, definition.id)
        assert f'<td class="class">{definition.resource_class}</td>' in row
        queue = queue_name(definition, settings.CONFIG.per_task_queues)
        assert f'<td class="queue-name"><code>{queue}</code></td>' in row
    noop = _row(page, "test-noop")
    assert '<td class="priority">by trigger</td>' in noop
    assert '<td class="schedule">-</td>' in noop
    # The schedule beat runs, its override applied as `sync_schedules` applies it.
    assert (
        '<td class="schedule">every 6h (from LUMASTRA_HISTORY_RETENTION_EVERY; declared 1d)</td>'
        in _row(page, "history-retention")
    )
    assert '<td class="schedule">dynamic (rows from its loader)</td>' in _row(page, "epg-refresh")
    monkeypatch.delenv("LUMASTRA_HISTORY_RETENTION_EVERY")
    again = client.get(ADMIN_TASKS).content.decode()
    assert '<td class="schedule">every 1d</td>' in _row(again, "history-retention")


def test_admin_tasks_page_shows_how_long_a_force_enable_holds(
    staff: User, clock: FrozenClock
) -> None:
    _open_circuit(clock)
    client = Client()
    client.force_login(staff)
    client.post(_admin_force_url(CIRCUIT))

    circuit = _row(client.get(ADMIN_TASKS).content.decode(), CIRCUIT)

    ttl = timedelta(seconds=settings.CONFIG.circuit_force_enable_ttl_s)
    assert f"(expires in {describe(ttl)})" in circuit


def test_operators_get_a_start_link_with_the_task_chosen(staff: User) -> None:
    operator_client = Client()
    operator_client.force_login(staff)
    viewer_client = Client()
    viewer_client.force_login(account("viewer", Access.VIEW))

    page = operator_client.get(ADMIN_TASKS).content.decode()
    viewed = viewer_client.get(ADMIN_TASKS).content.decode()

    link = f"{START_URL}?task=slow-progress"
    assert f'<a class="start-run" href="{link}">Start a run</a>' in _row(page, "slow-progress")
    assert 'class="start-run"' not in viewed
    form = operator_client.get(link).content.decode()
    assert '<option value="slow-progress" selected>' in form
    assert 'name="input-steps"' in form


def test_the_tasks_page_reads_the_history_in_two_queries_whatever_the_runs() -> None:
    _seed_a_day_of_runs()
    definitions = sorted(registry.get().values(), key=lambda d: d.id)

    with CaptureQueriesContext(connection) as queries:
        found = tasks_page.rows(definitions, can_operate=True)

    assert [row.definition.id for row in found] == [d.id for d in definitions]
    # The overview's three, the last day's ends, the newest run of every task, the pauses in
    # force (a small table, not the history).
    assert len(queries) == 6
