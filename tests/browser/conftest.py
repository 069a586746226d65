"""Browser tests: the real admin pages in headless Chromium, driven by Playwright.

The browser is Debian's `chromium` package (`/usr/bin/chromium`, or `$CHROMIUM_PATH`), never
a build Playwright downloads; `deploy/system-deps.sh test` (run by `make test`) installs it
when it is missing. Without it every test here fails, unless LUMASTRA_TEST_SKIP=browser says
to skip them (tests/support/categories.py): a skip nobody asked for would hide a console
nobody checked.

One web role process (deploy/start-web.sh, on the test database) and one browser serve
these tests; each test gets fresh accounts, a fresh browser context (its own cookies) and
the shared Celery worker (tests.support.fixtures: slow-progress, test-fail, test-circuit, ...).
The tasks no shared worker takes that these tests need (a deaf sleeper, a pipeline, a flaky
task: BROWSER_TASKS) have a worker of these tests' own, up while they run; a test that starts
them asks for `private_worker`, which ends what they left running.
Tests are transactional: what a test writes is committed, so the web process sees it.

Screenshots are saved only with LUMASTRA_SCREENSHOTS=1 (`make screenshots`), so a test run
never rewrites the tracked pictures.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from playwright.sync_api import Browser, BrowserContext, Playwright, ViewportSize, sync_playwright

from orchestrator.api import access
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name, stage_queue
from orchestrator.runs.cancel import NotCancellable, request_cancel
from orchestrator.states import LIVE_RUN_STATES
from orchestrator.stores import broker
from tasks import registry
from tests.support.browser import Console, Screenshots
from tests.support.fixtures import ROOT, worker_process
from tests.support.servers import web_process
from tests.support.users import PASSWORD

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "docs" / "screenshots"
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
# The admin's app sidebar folded, as Django remembers it: the console's wide tables get the room.
FOLD_SIDEBAR = "localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
# How long a locator waits for an element or a navigation before the test fails.
ACTION_TIMEOUT_MS = 10_000
# The tasks `private_worker` runs: private to their own tests elsewhere (each starts its own
# worker for them), so only while these tests run, when no other test's worker is up.
BROWSER_TASKS = ("test-sleepy", "test-pipe", "test-flaky")
# A run the private worker still runs at a test's end is killed and ends within this.
PRIVATE_IDLE_TIMEOUT_S = 15.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the admin in headless Chromium")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.needs("browser"))
            item.add_marker(pytest.mark.worker)


@pytest.fixture(scope="package")
def console_url(django_db_setup: None, celery_worker: subprocess.Popen[bytes]) -> Iterator[str]:
    """The web role on the test database, for these tests (it starts in seconds, not
    milliseconds); the shared worker runs the runs its pages start."""
    with web_process("web-browser") as url:
        yield url


@pytest.fixture(scope="package")
def chromium() -> Path:
    # Its absence fails each test first (the `needs("browser")` mark, tests.support.categories).
    return CHROMIUM


@pytest.fixture(scope="package")
def playwright(
    chromium: Path, console_url: str, _browser_worker: list[str]
) -> Iterator[Playwright]:
    """Playwright's driver, for these tests only: its sync API keeps an event loop running in
    this thread, so Django refuses the tests' own ORM calls (SynchronousOnlyOperation) unless
    told that this thread is not serving requests. Both last only while these tests run, and
    start after the web and worker processes, which must not inherit the escape."""
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as driver:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield driver


@pytest.fixture(scope="package")
def browser(playwright: Playwright, chromium: Path) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=str(chromium), headless=True)
    yield launched
    launched.close()


@pytest.fixture(scope="session")
def screenshots() -> Screenshots:
    return Screenshots(SCREENSHOTS if os.environ.get("LUMASTRA_SCREENSHOTS") == "1" else None)


def _browser_queues() -> list[str]:
    per_task = settings.CONFIG.per_task_queues
    queues: set[str] = set()
    for task_id in BROWSER_TASKS:
        definition = registry.get()[task_id]
        queues.add(queue_name(definition, per_task))
        queues.update(stage_queue(definition, s, per_task) for s in definition.pipeline)
    return sorted(queues)


@pytest.fixture(scope="package")
def _browser_worker(celery_worker: subprocess.Popen[bytes]) -> Iterator[list[str]]:
    with worker_process(_browser_queues(), concurrency=2, name="browser"):
        yield _browser_queues()


@pytest.fixture
def private_worker(transactional_db: None, _browser_worker: list[str]) -> Iterator[None]:
    """The worker of BROWSER_TASKS for one test. At its end, before its tables are flushed,
    the runs it left live are killed and waited for: the worker's writes racing the flush's
    TRUNCATE deadlock (as the shared worker's would; tests.support.fixtures)."""
    yield
    live = TaskHistory.objects.filter(
        task_id__in=BROWSER_TASKS, state__in=[s.value for s in LIVE_RUN_STATES]
    )
    for run_id in live.values_list("id", flat=True):
        with contextlib.suppress(NotCancellable):  # it ended meanwhile
            request_cancel(run_id, actor="browser-tests", kill=True)
    deadline = time.monotonic() + PRIVATE_IDLE_TIMEOUT_S
    while (live.exists() or broker.depth(_browser_worker)) and time.monotonic() < deadline:
        time.sleep(0.05)


@functools.cache
def _password_hash() -> str:
    # Hashed once: the hasher is slow on purpose, and every test makes its accounts afresh.
    return make_password(PASSWORD)


def _member(username: str, *groups: str) -> User:
    """A staff account in the console's real groups (migration 0008's, made again: a
    transactional test's flush removes them)."""
    migration = importlib.import_module("orchestrator.migrations.0008_run_permissions")
    migration.create_groups(apps, None)
    user = User.objects.create(username=username, password=_password_hash(), is_staff=True)
    user.groups.add(*Group.objects.filter(name__in=groups))
    return user


@pytest.fixture
def operator_user(transactional_db: None) -> User:
    return _member("operator", access.VIEWERS, access.OPERATORS)


@pytest.fixture
def viewer_user(transactional_db: None) -> User:
    return _member("viewer", access.VIEWERS)


@pytest.fixture
def open_console(
    browser: Browser, console_url: str, screenshots: Screenshots
) -> Iterator[Callable[[User | None], Console]]:
    """Opens a console tab in a context of its own (own cookies), signed in as the user
    given (None: not signed in)."""
    contexts: list[BrowserContext] = []

    def open_as(user: User | None) -> Console:
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.add_init_script(FOLD_SIDEBAR)
        contexts.append(context)
        console = Console(context.new_page(), console_url, screenshots)
        if user is not None:
            console.log_in(user.username, PASSWORD)
        return console

    yield open_as
    for context in contexts:
        context.close()


@pytest.fixture
def console(open_console: Callable[[User | None], Console], operator_user: User) -> Console:
    """A tab signed in as an operator (view and operate)."""
    return open_console(operator_user)


@pytest.fixture
def viewer_console(open_console: Callable[[User | None], Console], viewer_user: User) -> Console:
    """A tab signed in as a viewer (view only)."""
    return open_console(viewer_user)
