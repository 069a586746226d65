"""Process roles: the web role serves and may start runs, but never consumes.

"Consumes" is checked from the outside, two ways, each shown to detect a real worker:
Celery's own view (a worker answers `inspect().stats()` with its pid) and the broker's view
(a consumer holds a Redis connection blocked in BRPOP or subscribed to the pidbox channel).
The web role's connections are found through its sockets in /proc and matched against
`CLIENT LIST` by port.
"""

from __future__ import annotations

import http.cookiejar
import io
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from orchestrator.cluster import roster
from orchestrator.models import TaskHistory
from orchestrator.stores import keys, valkey
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.servers import free_port, http_status, serving

# Commands a consuming connection sits in; a publisher's connection never does.
CONSUMING_COMMANDS = {"brpop", "blpop", "brpoplpush", "blmove", "bzpopmin", "bzpopmax"}
# The web role publishes to per-class queues, which no worker of the test session consumes,
# so its message can only disappear into a consumer inside the web role itself.
WEB_QUEUE = "task.io"


@dataclass
class WebRole:
    process: subprocess.Popen[bytes]
    base_url: str
    log: Path


@pytest.fixture
def web_role(transactional_db: None) -> Iterator[WebRole]:
    """`deploy/start-web.sh` as a subprocess on a free port, against the test database."""
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
        "LUMASTRA_PER_TASK_QUEUES": "false",
    }
    base_url = f"http://127.0.0.1:{port}"
    try:
        with serving(
            [str(ROOT / "deploy/start-web.sh")],
            env,
            "web-role",
            lambda: http_status(f"{base_url}/admin/login/") == 200,
        ) as process:
            yield WebRole(process, base_url, ROOT / f".pytest_cache/web-role-{os.getpid()}.log")
    finally:
        with current_app.connection_for_write() as conn:
            conn.default_channel.queue_purge(WEB_QUEUE)


class AdminSession:
    """A browser's part in the admin: cookies and CSRF tokens."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> tuple[str, str]:
        with self._opener.open(self.base_url + path, timeout=30) as response:
            return response.geturl(), response.read().decode()

    def post_form(self, path: str, fields: dict[str, str]) -> tuple[str, str]:
        _, page = self.get(path)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, f"no CSRF token on {path}"
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token.group(1)})
        with self._opener.open(self.base_url + path, body.encode(), timeout=30) as response:
            return response.geturl(), response.read().decode()


def _process_tree(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(children.get(current, []))
    return found


def _local_tcp_ports(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue  # the process ended meanwhile
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            columns = line.split()
            if columns[9] in inodes:
                ports.add(int(columns[1].rsplit(":", 1)[1], 16))
    return ports


def _broker_clients_of(pids: set[int]) -> list[dict[str, Any]]:
    ports = _local_tcp_ports(pids)
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [c for c in broker.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]


def _consuming(client: dict[str, Any]) -> bool:
    return (
        client["cmd"] in CONSUMING_COMMANDS
        or "b" in client["flags"]
        or int(client.get("sub", 0)) > 0
        or int(client.get("psub", 0)) > 0
    )


def _celery_worker_pids() -> set[int]:
    stats = current_app.control.inspect(timeout=2.0).stats() or {}
    return {int(s["pid"]) for s in stats.values()}


@pytest.mark.worker
def test_the_consumer_checks_detect_a_real_worker(django_db_setup: None) -> None:
    with worker_process(["roles.control"], concurrency=1, name="roles-control") as worker:
        pids = _process_tree(worker.pid)

        assert worker.pid in _celery_worker_pids()
        assert any(_consuming(c) for c in _broker_clients_of(pids))


def test_static_files_have_hashed_names_gzip_and_a_long_max_age(web_role: WebRole) -> None:
    with urllib.request.urlopen(f"{web_role.base_url}/admin/login/") as page:
        css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page.read().decode())
    assert css, "the login page names base.css without a content hash"
    request = urllib.request.Request(
        web_role.base_url + css.group(1), headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request) as answer:
        assert answer.headers["Content-Encoding"] == "gzip"
        assert "max-age=315360000" in answer.headers["Cache-Control"]
        assert "immutable" in answer.headers["Cache-Control"]


def test_web_role_serves_starts_runs_and_consumes_nothing(web_role: WebRole) -> None:
    assert http_status(f"{web_role.base_url}/static/admin/css/base.css") == 200
    environ = Path(f"/proc/{web_role.process.pid}/environ").read_bytes().split(b"\0")
    assert b"LUMASTRA_WORKER_MODE=disabled" in environ
    get_user_model().objects.create_superuser("operator", "op@example.invalid", "pw-operator")

    admin = AdminSession(web_role.base_url)
    admin.post_form(
        "/admin/login/", {"username": "operator", "password": "pw-operator", "next": "/admin/"}
    )
    url, _ = admin.post_form(
        "/admin/orchestrator/taskhistory/start/", {"task": "test-noop", "input": "{}"}
    )

    run_id = re.search(r"/(run_[0-9A-Z]{26})/change/", url)
    assert run_id, f"the start form did not lead to a run page: {url}"
    run = TaskHistory.objects.get(id=run_id.group(1))
    assert run.trigger == {"kind": "admin", "actor": "operator"}
    # The web role opened a broker connection to publish; that is the one to look at.
    web_pids = _process_tree(web_role.process.pid)
    web_clients = _broker_clients_of(web_pids)
    assert web_clients, "the web role holds no connection to the broker's Redis"
    assert not [c for c in web_clients if _consuming(c)]
    assert not web_pids & _celery_worker_pids()
    # Time for a consumer hidden in the web role to take the message, were there one.
    time.sleep(1.0)
    with current_app.connection_for_write() as conn:
        waiting = conn.default_channel.queue_declare(queue=WEB_QUEUE, passive=True)
    assert waiting.message_count == 1
    run.refresh_from_db()
    assert run.state == "pending"


@pytest.mark.django_db
def test_bootstrap_demo_is_idempotent() -> None:
    # In a test transaction nothing commits, so start_run publishes nothing: no worker can
    # finish a demo run between the two calls and make the second start a new batch.
    first, second = io.StringIO(), io.StringIO()

    call_command("bootstrap_demo", stdout=first)
    call_command("bootstrap_demo", stdout=second)

    demo = get_user_model().objects.get(username="demo")
    assert demo.is_superuser and demo.check_password("lumastra-demo")
    assert set(demo.groups.values_list("name", flat=True)) == {
        "Lumastra viewers",
        "Lumastra operators",
    }
    runs = list(TaskHistory.objects.all())
    assert sorted(r.task_id for r in runs) == [
        "demo-pipeline",
        "hash-folder",
        "history-retention",
        "slow-progress",
    ]
    assert {r.trigger["kind"] for r in runs} == {"system"}
    hashed = next(r for r in runs if r.task_id == "hash-folder")
    assert Path(hashed.input["path"]).is_dir()
    for run in runs:
        assert run.id in first.getvalue() and run.id in second.getvalue()
    assert second.getvalue().count("still live") == 4
    for url in ("/admin/", "/api/v1/docs", ":5555", "lumastra-demo"):
        assert url in second.getvalue()


START_URL = "/admin/orchestrator/taskhistory/start/"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"task": "slow-progress", "input": "{not json"}, "Enter a valid JSON."),
        ({"task": "slow-progress", "input": "[1, 2]"}, "input must be a JSON object"),
        ({"task": "slow-progress", "input": '{"steps": 0}'}, "steps: Input should be"),
        ({"task": "no-such-task", "input": "{}"}, "Select a valid choice."),
        ({"task": "slow-progress", "input": "{}", "priority": "4"}, "Select a valid choice."),
    ],
)
def test_admin_start_form_shows_refusals_and_writes_nothing(
    admin_client: Any, fields: dict[str, str], error: str
) -> None:
    response = admin_client.post(START_URL, fields)

    assert response.status_code == 200
    assert error in response.content.decode()
    assert not TaskHistory.objects.exists()


@pytest.mark.django_db
def test_admin_start_form_is_for_staff_only(client: Any) -> None:
    get_user_model().objects.create_user("visitor", password="pw-visitor")
    client.login(username="visitor", password="pw-visitor")

    response = client.post(START_URL, {"task": "test-noop", "input": "{}"})

    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert not TaskHistory.objects.exists()


@pytest.mark.django_db
def test_admin_runs_list_filters_and_finds_a_run_by_id(admin_client: Any) -> None:
    response = admin_client.post(
        START_URL, {"task": "test-noop", "input": "{}", "priority": "5", "idempotency_key": "k"}
    )
    run = TaskHistory.objects.get()
    assert response["Location"].endswith(f"/{run.id}/change/")
    assert run.trigger == {"kind": "admin", "actor": "admin", "idempotencyKey": "k"}
    assert run.priority == 5

    changelist = "/admin/orchestrator/taskhistory/"
    for query, found in [
        ("?state=pending&task=test-noop&trigger=admin&priority=5", True),
        ("?trigger=api", False),
        ("?priority=1", False),
        (f"?q={run.id.lower()}", True),
        ("?q=test-noop", True),
        ("?o=7", True),
    ]:
        page = admin_client.get(changelist + query)
        assert page.status_code == 200
        assert (run.id in page.content.decode()) is found, query
    detail = admin_client.get(f"{changelist}{run.id}/change/").content.decode()
    assert "Save" not in detail and run.id in detail


@pytest.mark.django_db(transaction=True)
def test_a_worker_announces_itself_in_the_node_roster() -> None:
    with worker_process(["task.t.test-noop"], concurrency=1, name="roster") as process:
        found = wait_for(
            lambda: [n for n in roster.roster() if n.pid == process.pid and n.role == "worker"]
        )
        (me,) = found
        assert me.queues == ("task.t.test-noop",)
        ttl = valkey.client().ttl(keys.cluster_node(me.instance_id))
        assert 0 < ttl <= roster.NODE_TTL_S  # a dead worker's entry expires, never lingers
