"""Who may do what (orchestrator/api/access.py), checked the same way on every API operation and
every admin page and action: each role against each, the answer it gets, and, for a refused
write, that nothing changed.

Roles: anonymous; an active user with both permissions but not staff; staff without
permissions; a viewer (view); an operator (view and operate); a superuser.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.http import HttpResponse
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from orchestrator.api import access, tokens
from orchestrator.api.access import Access
from orchestrator.hooks import circuit
from orchestrator.models import SchedulerState, TaskHistory
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.start import start_run
from orchestrator.scheduler.names import state_key
from orchestrator.triggers import TriggerKind
from tests.support.users import account

pytestmark = pytest.mark.django_db

# Nothing consumes this task's queue during these tests (tests/support/fixtures.py).
PARKED = "test-record-order"
CIRCUIT = "test-circuit"  # a circuit of its own
STATIC = "perm-static"  # an operator's own beat row
DYNAMIC = ("epg-refresh", "perm-row")  # a row of a dynamic schedule (tasks/definitions/demo.py)
NO_POISON = "0" * 40  # a poison record id no record has
API = "/api/v1"
ADMIN_RUNS = "/admin/orchestrator/taskhistory/"


class Role(Enum):
    ANONYMOUS = "anonymous"
    NOT_STAFF = "not-staff"
    STAFF = "staff"
    VIEWER = "viewer"
    OPERATOR = "operator"
    SUPERUSER = "superuser"


def _user(role: Role) -> User | None:
    match role:
        case Role.ANONYMOUS:
            return None
        case Role.NOT_STAFF:
            # Permissions count for nothing without staff status.
            return account("not-staff", Access.VIEW, Access.OPERATE, staff=False)
        case Role.STAFF:
            return account("staff")
        case Role.VIEWER:
            return account("viewer", Access.VIEW)
        case Role.OPERATOR:
            return account("operator", Access.VIEW, Access.OPERATE)
        case Role.SUPERUSER:
            return account("root", superuser=True)


@dataclass(frozen=True)
class World:
    """What each test starts from: a run to cancel, an ended run to retry."""

    pending: str
    ended: str
    runs: int

    @classmethod
    def seed(cls) -> World:
        pending = _start("pending")
        ended = _start("ended")
        request_cancel(ended, actor="setup")
        daily = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.DAYS)
        PeriodicTask.objects.update_or_create(
            name=STATIC, defaults={"task": "an.operators.own.task", "interval": daily}
        )
        return cls(pending, ended, TaskHistory.objects.count())

    def started_one(self) -> bool:
        return TaskHistory.objects.count() == self.runs + 1

    def cancelled(self) -> bool:
        return TaskHistory.objects.get(id=self.pending).state == "cancelled"

    @staticmethod
    def static_switched_off() -> bool:
        return not PeriodicTask.objects.get(name=STATIC).enabled

    @staticmethod
    def dynamic_switched_off() -> bool:
        return SchedulerState.objects.filter(key=state_key(*DYNAMIC), disabled=True).exists()


def _start(label: str) -> str:
    return start_run(PARKED, {"label": label}, trigger=TriggerKind.MANUAL).run_id


def _forced() -> bool:
    return circuit.status(CIRCUIT).forced_until is not None


@dataclass(frozen=True)
class Op:
    name: str
    needs: Access
    call: Callable[[Client, World], HttpResponse]
    ok: int  # the status of a success
    done: Callable[[World], bool] | None = None  # a write's effect, absent when refused

    def __str__(self) -> str:
        return self.name


def _post_json(path: str, body: object = None) -> Callable[[Client, World], HttpResponse]:
    def call(client: Client, world: World) -> HttpResponse:
        target = path.format(pending=world.pending, ended=world.ended)
        sent = json.dumps(body or {}).replace("{ended}", world.ended)
        return client.post(target, sent, content_type="application/json")

    return call


def _get(path: str) -> Callable[[Client, World], HttpResponse]:
    def call(client: Client, world: World) -> HttpResponse:
        return client.get(path.format(pending=world.pending, ended=world.ended))

    return call


def _admin_post(path: str, fields: Callable[[World], dict[str, Any]]) -> Callable[..., Any]:
    def call(client: Client, world: World) -> HttpResponse:
        return client.post(path.format(pending=world.pending, ended=world.ended), fields(world))

    return call


API_OPS = [
    Op("list-runs", Access.VIEW, _get(f"{API}/runs"), 200),
    Op("get-run", Access.VIEW, _get(f"{API}/runs/{{pending}}"), 200),
    Op(
        "start",
        Access.OPERATE,
        _post_json(f"{API}/runs", {"task": PARKED, "input": {"label": "api-start"}}),
        202,
        World.started_one,
    ),
    Op(
        "cancel", Access.OPERATE, _post_json(f"{API}/runs/{{pending}}/cancel"), 200, World.cancelled
    ),
    Op("retry", Access.OPERATE, _post_json(f"{API}/runs/{{ended}}/retry"), 202, World.started_one),
    Op(
        "trigger",
        Access.OPERATE,
        _post_json(f"{API}/triggers/test-parked-hook", {"label": "by-token"}),
        202,
        World.started_one,
    ),
    Op(
        "kill-now",
        Access.OPERATE,
        _post_json(f"{API}/runs/{{pending}}/cancel", {"kill": True}),
        200,
        World.cancelled,
    ),
    Op(
        "retry-fresh",
        Access.OPERATE,
        _post_json(f"{API}/runs/{{ended}}/retry", {"mode": "fresh"}),
        202,
        World.started_one,
    ),
    Op("dead-letters", Access.VIEW, _get(f"{API}/dead-letters?task={PARKED}"), 200),
    Op(
        "requeue",
        Access.OPERATE,
        _post_json(f"{API}/dead-letters/requeue", {"kind": "exhausted_run", "ids": ["{ended}"]}),
        200,
    ),
    Op("poison", Access.VIEW, _get(f"{API}/drain/poison"), 200),
    Op(
        "replay",
        Access.OPERATE,
        _post_json(f"{API}/drain/poison/replay", {"ids": [NO_POISON]}),
        200,
    ),
    Op(
        "discard",
        Access.OPERATE,
        _post_json(f"{API}/drain/poison/discard", {"ids": [NO_POISON]}),
        200,
    ),
    Op("schedules", Access.VIEW, _get(f"{API}/schedules"), 200),
    Op(
        "switch-static",
        Access.OPERATE,
        _post_json(f"{API}/schedules/static/switch", {"name": STATIC, "enabled": False}),
        200,
        lambda world: World.static_switched_off(),
    ),
    Op(
        "switch-dynamic",
        Access.OPERATE,
        _post_json(
            f"{API}/schedules/dynamic/switch",
            {"task": DYNAMIC[0], "row": DYNAMIC[1], "enabled": False},
        ),
        200,
        lambda world: World.dynamic_switched_off(),
    ),
    Op("nodes", Access.VIEW, _get(f"{API}/cluster/nodes"), 200),
    Op("leaders", Access.VIEW, _get(f"{API}/cluster/leaders"), 200),
    Op("list-tasks", Access.VIEW, _get(f"{API}/tasks"), 200),
    Op("get-task", Access.VIEW, _get(f"{API}/tasks/{CIRCUIT}"), 200),
    Op(
        "force-enable",
        Access.OPERATE,
        _post_json(f"{API}/tasks/{CIRCUIT}/circuit/force-enable"),
        200,
        lambda world: _forced(),
    ),
]

ADMIN_OPS = [
    Op("runs-list", Access.VIEW, _get(ADMIN_RUNS), 200),
    Op("run-detail", Access.VIEW, _get(f"{ADMIN_RUNS}{{pending}}/change/"), 200),
    Op("start-form", Access.OPERATE, _get(f"{ADMIN_RUNS}start/"), 200),
    Op(
        "start",
        Access.OPERATE,
        _admin_post(
            f"{ADMIN_RUNS}start/", lambda w: {"task": PARKED, "input": '{"label": "admin"}'}
        ),
        302,
        World.started_one,
    ),
    Op(
        "cancel-action",
        Access.OPERATE,
        _admin_post(ADMIN_RUNS, lambda w: {"action": "cancel_runs", "_selected_action": w.pending}),
        302,
        World.cancelled,
    ),
    Op(
        "retry-action",
        Access.OPERATE,
        _admin_post(ADMIN_RUNS, lambda w: {"action": "retry_runs", "_selected_action": w.ended}),
        302,
        World.started_one,
    ),
    Op(
        "run-page-cancel",
        Access.OPERATE,
        _admin_post(f"{ADMIN_RUNS}{{pending}}/act/cancel/", lambda w: {}),
        302,
        World.cancelled,
    ),
    Op(
        "run-page-retry",
        Access.OPERATE,
        _admin_post(f"{ADMIN_RUNS}{{ended}}/act/retry/", lambda w: {}),
        302,
        World.started_one,
    ),
    Op("tasks", Access.VIEW, _get(f"{ADMIN_RUNS}tasks/"), 200),
    Op(
        "force-enable",
        Access.OPERATE,
        _admin_post(f"{ADMIN_RUNS}tasks/{CIRCUIT}/force-enable/", lambda w: {}),
        302,
        lambda world: _forced(),
    ),
    Op("nodes", Access.VIEW, _get(f"{ADMIN_RUNS}nodes/"), 200),
    Op("dead-letters", Access.VIEW, _get(f"{ADMIN_RUNS}dead-letters/"), 200),
    Op("schedules", Access.VIEW, _get(f"{ADMIN_RUNS}schedules/"), 200),
]


def _allowed(role: Role, needs: Access) -> bool:
    if role in (Role.OPERATOR, Role.SUPERUSER):
        return True
    return role is Role.VIEWER and needs is Access.VIEW


def _api_client(user: User | None, via: str) -> Client:
    if user is None:
        return Client()
    if via == "token":
        return Client(headers={"Authorization": f"Bearer {tokens.issue(user)[1]}"})
    client = Client()
    client.force_login(user)
    return client


def _api_expected(role: Role, needs: Access, ok: int) -> int:
    if role is Role.ANONYMOUS:
        return 401
    return ok if _allowed(role, needs) else 403


# Each role by token and by session; anonymous has neither, so it is one case.
API_CASES = [
    pytest.param(role, op, via, id=f"{role.value}-{op}-{via}")
    for role in Role
    for op in API_OPS
    for via in (("none",) if role is Role.ANONYMOUS else ("token", "session"))
]


@pytest.mark.parametrize(("role", "op", "via"), API_CASES)
def test_api_matrix(role: Role, op: Op, via: str) -> None:
    world = World.seed()
    client = _api_client(_user(role), via)

    response = op.call(client, world)

    expected = _api_expected(role, op.needs, op.ok)
    assert response.status_code == expected, response.content
    if expected == 403:
        assert response.json()["detail"] in (
            "the API is open to active staff accounts only",
            access.refusal(op.needs),
        )
    if op.done is not None:
        assert op.done(world) is (expected == op.ok)


@pytest.mark.parametrize("op", ADMIN_OPS, ids=str)
@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
def test_admin_matrix(role: Role, op: Op) -> None:
    world = World.seed()
    client = Client()
    user = _user(role)
    if user is not None:
        client.force_login(user)

    response = op.call(client, world)

    if role in (Role.ANONYMOUS, Role.NOT_STAFF):
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
        allowed = False
    else:
        allowed = _allowed(role, op.needs)
        assert response.status_code == (op.ok if allowed else 403)
        if response.status_code == 302:
            assert not response["Location"].startswith("/admin/login/")
    if op.done is not None:
        assert op.done(world) is allowed


def test_admin_offers_operate_controls_to_operators_only() -> None:
    viewer, operator = Client(), Client()
    viewer.force_login(account("viewer", Access.VIEW))
    operator.force_login(account("operator", Access.VIEW, Access.OPERATE))
    force = f'action="{ADMIN_RUNS}tasks/{CIRCUIT}/force-enable/"'

    for client, shown in ((viewer, False), (operator, True)):
        runs = client.get(ADMIN_RUNS).content.decode()
        tasks = client.get(f"{ADMIN_RUNS}tasks/").content.decode()
        assert (f'href="{ADMIN_RUNS}start/"' in runs) is shown
        assert ('value="cancel_runs"' in runs) is shown
        assert (force in tasks) is shown


def test_the_groups_hand_out_view_and_operate() -> None:
    # The migration's own function: a transactional test elsewhere may have flushed its rows.
    migration = importlib.import_module("orchestrator.migrations.0008_run_permissions")
    migration.create_groups(apps, None)
    migration.create_groups(apps, None)  # again: nothing doubles

    def codenames(name: str) -> set[str]:
        return set(Group.objects.get(name=name).permissions.values_list("codename", flat=True))

    assert codenames(access.VIEWERS) == {Access.VIEW.codename}
    assert codenames(access.OPERATORS) == {Access.VIEW.codename, Access.OPERATE.codename}
    for group, can_operate in ((access.VIEWERS, False), (access.OPERATORS, True)):
        user = account(f"member-{can_operate}")
        user.groups.add(Group.objects.get(name=group))
        client = _api_client(user, "token")
        started = _post_json(f"{API}/runs", {"task": PARKED, "input": {"label": group}})
        assert client.get(f"{API}/runs").status_code == 200
        assert started(client, World.seed()).status_code == (202 if can_operate else 403)
