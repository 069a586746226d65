"""The operator CLI (`manage.py lumastra`, issue 42) against a real stack: each command in its
table and `--json` forms (the JSON parsed, and for `show` compared with the API's own answer),
the refusals and their exit codes (no user, an unknown, inactive or non-staff one, a viewer
acting), not found, not allowed in the run's state, bad input, the admin log an action leaves,
`watch` following runs a real worker runs to their end, and a real `python manage.py lumastra`
process for the exit codes a script sees (Ctrl-C included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.management.cli import exits
from orchestrator.models import TaskHistory, TaskPause
from orchestrator.routing import queue_name
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.start import start_run
from orchestrator.scheduler.sync import sync
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import database_url, wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.users import account, operator

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
PARKED = "test-library-scan"  # no worker takes its queue: its runs stay pending
WATCHED = "slow-progress"  # reports progress and logs a line per step
NO_SUCH_RUN = "run_00000000000000000000000000"


def _queue(task: str) -> str:
    return queue_name(registry.get()[task], settings.CONFIG.per_task_queues)


@pytest.fixture(autouse=True)
def _empty_queues() -> Iterator[None]:
    yield
    empty_queues(_queue(PARKED), _queue(WATCHED))


@pytest.fixture
def users() -> None:
    operator("ops")
    account("viewer", Access.VIEW)
    idle = account("idle", Access.VIEW, Access.OPERATE)
    idle.is_active = False
    idle.save()
    account("outsider", Access.VIEW, Access.OPERATE, staff=False)


def cli(*args: str) -> tuple[int, str, str]:
    """`manage.py lumastra ARGS` in this process: its exit code, stdout and stderr."""
    out, err = StringIO(), StringIO()
    try:
        call_command("lumastra", *args, stdout=out, stderr=err)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> object:
    code, out, err = cli(*args, "--json")
    assert code == exits.OK, err
    return json.loads(out)


def _parked(library_id: object, tags: tuple[str, ...] = ()) -> str:
    return start_run(
        PARKED, {"library_id": library_id}, trigger=TriggerKind.MANUAL, tags=tags
    ).run_id


def _exhausted() -> str:
    """A run as a worker leaves one that failed its last attempt."""
    run_id = _parked(99)
    error = {"kind": "transient", "message": "still down", "exhausted": True}
    TaskHistory.objects.filter(id=run_id).update(state=RunState.FAILED, error=error, attempts=3)
    return run_id


def _logged(username: str) -> list[str]:
    return list(
        LogEntry.objects.filter(user__username=username)
        .order_by("id")
        .values_list("change_message", flat=True)
    )


# --- runs, show -----------------------------------------------------------------------------


def test_runs_finds_runs_by_input_tag_state_and_time_in_a_table_and_as_json(users: None) -> None:
    sevens = [_parked(7), _parked("7"), _parked(7, tags=("nightly",))]
    others = [_parked(8), _parked("17")]

    listed = cli_json("runs", "--as", "viewer", "--input", "library_id=7")
    assert isinstance(listed, dict)
    assert {item["run_id"] for item in listed["items"]} == set(sevens)
    assert listed["items"][0]["run_id"] == sevens[-1]  # newest first
    assert listed["next_cursor"] is None

    code, table, _ = cli("runs", "--as", "viewer", "--task", PARKED, "--state", "pending")
    assert code == exits.OK
    header, *rows = table.splitlines()
    assert header.split() == ["RUN", "TASK", "STATE", "PRIORITY", "PROGRESS", "CREATED", "FINISHED"]
    assert [row.split()[0] for row in rows] == list(reversed(sevens + others))
    assert all(row.split()[1:3] == [PARKED, "pending"] for row in rows)

    tagged = cli_json("runs", "--as", "viewer", "--tag", "nightly", "--input", "library_id=7")
    assert [item["run_id"] for item in tagged["items"]] == [sevens[-1]]  # type: ignore[index]
    assert cli_json("runs", "--as", "viewer", "--state", "completed") == {
        "items": [],
        "next_cursor": None,
    }

    first = TaskHistory.objects.get(id=sevens[0]).created_at.astimezone(UTC)
    before = (first - timedelta(seconds=1)).replace(tzinfo=None).isoformat()
    after = (first + timedelta(hours=1)).isoformat()
    assert len(cli_json("runs", "--as", "viewer", "--since", before)["items"]) == 5  # type: ignore[index]
    assert len(cli_json("runs", "--as", "viewer", "--since", "1h")["items"]) == 5  # type: ignore[index]
    assert cli_json("runs", "--as", "viewer", "--since", after)["items"] == []  # type: ignore[index]

    paged = cli_json("runs", "--as", "viewer", "--limit", "2")
    assert len(paged["items"]) == 2 and paged["next_cursor"]  # type: ignore[index]
    rest = cli_json("runs", "--as", "viewer", "--limit", "5", "--cursor", paged["next_cursor"])  # type: ignore[index]
    assert len(rest["items"]) == 3  # type: ignore[index]
    code, _, err = cli("runs", "--as", "viewer", "--limit", "2")
    assert code == exits.OK and "more: --cursor " in err


def test_bad_input_gets_a_clear_error_and_its_exit_code(users: None) -> None:
    code, out, err = cli("runs", "--as", "viewer", "--input", "1bad=7")
    assert (code, out) == (exits.USAGE, "")
    assert "'1bad' is not an input field's name" in err
    code, _, err = cli("runs", "--as", "viewer", "--task", "no-such-task")
    assert code == exits.NOT_FOUND and "no task 'no-such-task'" in err
    code, _, err = cli("show", NO_SUCH_RUN, "--as", "viewer")
    assert code == exits.NOT_FOUND and f"no run '{NO_SUCH_RUN}'" in err
    code, _, err = cli("runs", "--as", "viewer", "--limit", "0")
    assert code == exits.USAGE and "limit" in err
    # argparse's own refusals: a CommandError in process, exit 2 from a shell (the subprocess test)
    with pytest.raises(CommandError, match="is not a run id"):
        cli("show", "run_nope", "--as", "viewer")
    with pytest.raises(CommandError, match="is not a time"):
        cli("runs", "--as", "viewer", "--since", "yesterday")
    with pytest.raises(CommandError, match="is not KEY=VALUE"):
        cli("runs", "--as", "viewer", "--input", "library_id")


def test_show_prints_the_api_s_document(users: None) -> None:
    run_id = _parked(7, tags=("nightly",))
    token = tokens.issue(account("reader", Access.VIEW), "cli test")[1]
    answered = Client().get(f"/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {token}"})

    assert cli_json("show", run_id, "--as", "viewer") == answered.json()

    code, table, _ = cli("show", run_id, "--as", "viewer")
    fields = dict(line.split(None, 1) for line in table.splitlines())
    assert code == exits.OK
    assert (fields["run"], fields["task"], fields["state"]) == (run_id, PARKED, "pending")
    assert fields["finished"] == "-" and fields["created"].endswith("Z")
    assert fields["tags"] == "nightly" and fields["input"] == '{"full": false, "library_id": 7}'


# --- who may ------------------------------------------------------------------------------


def test_without_an_acting_user_or_the_permission_nothing_is_read_or_done(users: None) -> None:
    run_id = _parked(7)

    for args, refusal in [
        ((), "no acting user: give --as USERNAME or set LUMASTRA_CLI_USER"),
        (("--as", "ghost"), "no user 'ghost'"),
        (("--as", "idle"), "idle is not an active staff account"),
        (("--as", "outsider"), "outsider is not an active staff account"),
    ]:
        code, out, err = cli("runs", *args)
        assert (code, out) == (exits.REFUSED, ""), args
        assert refusal in err

    code, _, err = cli("cancel", run_id, "--as", "viewer")
    assert code == exits.REFUSED
    assert "viewer: this needs the operate permission" in err
    assert cli("dead-letters", "--requeue", "--as", "viewer")[0] == exits.REFUSED
    assert cli("pause", PARKED, "--reason", "x", "--as", "viewer")[0] == exits.REFUSED
    assert TaskHistory.objects.get(id=run_id).state == RunState.PENDING
    assert not TaskPause.objects.exists()
    assert not LogEntry.objects.exists()


# --- cancel, retry ------------------------------------------------------------------------


def test_cancel_and_retry_act_as_the_user_and_refuse_what_the_state_does_not_allow(
    users: None,
) -> None:
    run_id = _parked(7)

    code, table, _ = cli("cancel", run_id, "--as", "ops")
    assert code == exits.OK
    assert table.splitlines()[1].split() == [run_id, "cancelled"]
    code, _, err = cli("cancel", run_id, "--as", "ops")
    assert code == exits.NOT_NOW and "has already ended (cancelled)" in err
    assert cli("cancel", NO_SUCH_RUN, "--as", "ops")[0] == exits.NOT_FOUND

    retried = cli_json("retry", run_id, "--as", "ops")
    assert isinstance(retried, dict)
    assert (retried["state"], retried["outcome"], retried["priority"]) == ("pending", "started", 1)
    new = TaskHistory.objects.get(id=retried["run_id"])
    assert new.trigger["retryOf"] == run_id and new.trigger["actor"] == "ops"
    code, _, err = cli("retry", new.id, "--as", "ops")
    assert code == exits.NOT_NOW and "only failed or cancelled runs are retried" in err

    killed = cli_json("cancel", new.id, "--kill", "--as", "ops")
    assert killed == {"run_id": new.id, "state": "cancelled"}
    code, table, _ = cli("retry", new.id, "--fresh", "--as", "ops")
    assert code == exits.OK
    header, row = table.splitlines()
    assert header.split() == ["RUN", "NEW", "RUN", "STATE", "OUTCOME"]
    fresh = row.split()[1]
    assert row.split() == [new.id, fresh, "pending", "started"]

    assert _logged("ops") == [
        f"cancelled run {run_id} (now cancelled) (CLI)",
        f"retried run {run_id} as {new.id} (CLI)",
        f"killed run {new.id} (now cancelled) (CLI)",
        f"retried run {new.id} as {fresh} (CLI)",
    ]
    entry = LogEntry.objects.filter(user__username="ops").order_by("id").first()
    assert entry is not None and entry.object_id == run_id


# --- pause, resume ------------------------------------------------------------------------


def test_pause_and_resume_a_task_and_a_class(users: None) -> None:
    code, table, _ = cli("pause", PARKED, "--reason", "backup window", "--as", "ops")
    assert code == exits.OK
    assert table.splitlines()[1].split()[:4] == ["task", PARKED, "no", "ops"]
    code, _, err = cli("pause", PARKED, "--reason", "again", "--as", "ops")
    assert code == exits.NOT_NOW and "already paused" in err
    resumed = cli_json("resume", PARKED, "--as", "ops")
    assert isinstance(resumed, dict)
    assert (resumed["scope"], resumed["name"], resumed["resumed_by"]) == ("task", PARKED, "ops")
    assert resumed["released"] == 0  # no worker took a message of its to park
    assert cli("resume", PARKED, "--as", "ops")[0] == exits.NOT_NOW

    paused = cli_json("pause", "io", "--reason", "disk swap", "--refuse-starts", "--as", "ops")
    assert isinstance(paused, dict)
    assert (paused["scope"], paused["name"], paused["refuse_starts"]) == ("class", "io", True)
    assert cli_json("resume", "io", "--as", "ops")["scope"] == "class"  # type: ignore[index]

    code, _, err = cli("pause", "no-such-task", "--reason", "x", "--as", "ops")
    assert code == exits.NOT_FOUND and "no-such-task" in err
    assert _logged("ops") == [
        f"paused task {PARKED} (CLI)",
        f"resumed task {PARKED}: 0 held runs published again (CLI)",
        "paused class io (refusing starts) (CLI)",
        "resumed class io: 0 held runs published again (CLI)",
    ]


# --- schedules, limits, dead letters -----------------------------------------------------


def test_schedules_and_limits_in_a_table_and_as_json(users: None) -> None:
    sync()

    code, table, _ = cli("schedules", "--as", "viewer")
    assert code == exits.OK
    assert table.splitlines()[0].split()[:3] == ["KIND", "NAME", "ENABLED"]
    rows = [line.split()[:3] for line in table.splitlines()]
    assert ["static", "history-retention", "yes"] in rows
    schedules = cli_json("schedules", "--as", "viewer")
    assert isinstance(schedules, dict)
    (retention,) = [s for s in schedules["static"] if s["name"] == "history-retention"]
    assert retention["enabled"] and retention["next_fire_at"]
    assert "dynamic" in schedules

    code, table, _ = cli("limits", "--as", "viewer")
    assert code == exits.OK
    by_name = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert by_name["test-shared-rate"][1:3] == ["limit", "40/10s"]
    limits = cli_json("limits", "--as", "viewer")
    assert isinstance(limits, list)
    (shared,) = [limit for limit in limits if limit["name"] == "test-shared-rate"]
    assert (shared["kind"], shared["rate"], shared["keyed"]) == ("limit", "40/10s", False)


def test_dead_letters_are_listed_and_requeued(users: None) -> None:
    dead = _exhausted()

    code, table, _ = cli("dead-letters", "--as", "viewer", "--kind", "exhausted_run")
    assert code == exits.OK
    assert table.splitlines()[1].split()[:4] == ["exhausted_run", dead, PARKED, dead]
    listed = cli_json("dead-letters", "--as", "viewer")
    assert isinstance(listed, dict)
    assert [(i["kind"], i["id"], i["requeued_as"]) for i in listed["items"]] == [
        ("exhausted_run", dead, [])
    ]

    # Admission refuses the rerun while its task refuses starts: an outcome, and exit 5.
    cli("pause", PARKED, "--reason", "upstream down", "--refuse-starts", "--as", "ops")
    code, out, _ = cli("dead-letters", "--requeue", "--as", "ops", "--json")
    assert code == exits.NOT_NOW
    ((refused),) = json.loads(out)["results"]
    assert (refused["id"], refused["outcome"]) == (dead, "refused")
    assert "paused" in refused["detail"]
    cli("resume", PARKED, "--as", "ops")

    requeued = cli_json("dead-letters", "--requeue", "--as", "ops")
    assert isinstance(requeued, dict)
    ((outcome),) = requeued["results"]
    assert (outcome["id"], outcome["outcome"]) == (dead, "requeued")
    rerun = TaskHistory.objects.get(id=outcome["run_id"])
    assert rerun.trigger["retryOf"] == dead and rerun.state == RunState.PENDING
    assert _logged("ops")[-1] == f"requeued dead letter {dead}: requeued as run {rerun.id} (CLI)"
    again = cli_json("dead-letters", "--as", "viewer")
    assert again["items"][0]["requeued_as"] == [rerun.id]  # type: ignore[index]


# --- watch --------------------------------------------------------------------------------


@pytest.fixture
def worker() -> Iterator[object]:
    with worker_process([_queue(WATCHED)], concurrency=1, name="cli-watch") as process:
        yield process


@pytest.mark.worker
def test_watch_follows_a_run_to_its_end(users: None, worker: object) -> None:
    run_id = start_run(
        WATCHED, {"steps": 3, "step_seconds": 0.3}, trigger=TriggerKind.MANUAL
    ).run_id

    code, out, _ = cli("watch", run_id, "--as", "viewer", "--interval", "0.1", "--timeout", "60")

    assert code == exits.OK
    lines = out.splitlines()
    assert lines[-1] == "-- completed"
    logged = [line.split(None, 2)[1:] for line in lines if not line.startswith("--")]
    assert logged == [["info", f"step {n} of 3"] for n in (1, 2, 3)]
    assert "-- progress 3/3 step 3" in [line.split(" (eta")[0] for line in lines]
    assert lines.index("-- active") < lines.index(next(line for line in lines if "step 1" in line))

    run_id = start_run(
        WATCHED, {"steps": 2, "step_seconds": 0.2}, trigger=TriggerKind.MANUAL
    ).run_id
    code, out, _ = cli("watch", run_id, "--as", "viewer", "--interval", "0.1", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == exits.OK
    assert events[0] == {"event": "state", "state": events[0]["state"]}
    assert events[-1] == {"event": "end", "state": "completed", "error": None}
    assert [e["msg"] for e in events if e["event"] == "log"] == ["step 1 of 2", "step 2 of 2"]
    assert {"seq", "ts", "level", "stage", "msg"} <= set(
        next(e for e in events if e["event"] == "log")
    )
    final = [e for e in events if e["event"] == "progress"][-1]
    assert (final["done"], final["total"], final["item"]) == (2, 2, "step 2")


@pytest.mark.worker
def test_watch_exits_1_for_a_cancelled_run_and_for_its_timeout(users: None, worker: object) -> None:
    run_id = start_run(
        WATCHED, {"steps": 50, "step_seconds": 0.2}, trigger=TriggerKind.MANUAL
    ).run_id

    def cancel_once_running() -> None:
        try:
            wait_for(lambda: TaskHistory.objects.get(id=run_id).state == RunState.ACTIVE)
            request_cancel(run_id, actor="ops")
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    code, out, _ = cli("watch", run_id, "--as", "viewer", "--interval", "0.1", "--timeout", "60")
    canceller.join()
    assert code == exits.NOT_COMPLETED
    assert out.splitlines()[-1].startswith("-- cancelled")

    waiting = _parked(7)
    code, out, err = cli("watch", waiting, "--as", "viewer", "--timeout", "0.5")
    assert (code, out.splitlines()) == (exits.NOT_COMPLETED, ["-- pending"])
    assert f"{waiting} is still pending after 0.5 s" in err
    assert cli("watch", NO_SUCH_RUN, "--as", "viewer")[0] == exits.NOT_FOUND


# --- as a script runs it ------------------------------------------------------------------


def _manage(*args: str, user: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": database_url()}
    env.pop("LUMASTRA_CLI_USER", None)
    if user is not None:
        env["LUMASTRA_CLI_USER"] = user
    return subprocess.Popen(
        [sys.executable, "manage.py", "lumastra", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _script(*args: str, user: str | None = None) -> tuple[int, str, str]:
    process = _manage(*args, user=user)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_a_script_sees_the_exit_codes(users: None) -> None:
    run_id = _parked(7)

    code, out, err = _script("runs", "--json", "--input", "library_id=7", user="viewer")
    assert code == exits.OK, err
    assert [item["run_id"] for item in json.loads(out)["items"]] == [run_id]
    code, out, err = _script("cancel", run_id)
    assert (code, out) == (exits.REFUSED, "")
    assert err.strip() == (
        "lumastra cancel: no acting user: give --as USERNAME or set LUMASTRA_CLI_USER"
    )
    code, _, err = _script("cancel", run_id, user="viewer")
    assert code == exits.REFUSED and "operate permission" in err
    code, _, err = _script("show", "run_nope", user="viewer")
    assert code == exits.USAGE and "is not a run id" in err
    code, out, _ = _script("--help")
    assert code == exits.OK and "exit codes:" in out and "130  watch: interrupted" in out

    watching = _manage("watch", run_id, "--interval", "0.1", user="viewer")
    assert watching.stdout is not None
    assert watching.stdout.readline() == "-- pending\n"
    watching.send_signal(signal.SIGINT)
    out, err = watching.communicate(timeout=30)
    assert watching.returncode == exits.INTERRUPTED
    assert err.strip() == f"stopped watching; {run_id} goes on" and "Traceback" not in err
    assert TaskHistory.objects.get(id=run_id).state == RunState.PENDING
