"""The operator console as a browser test sees it: small page objects over Playwright's page,
one per admin page, so a test reads as what an operator does ("start a run", "cancel it") and
a page's markup is named in one place when it changes.

Waiting: a page that updates itself is read again until it shows what is expected; a page
that does not is reloaded until it does (`Console.eventually`). Either way a test never
sleeps for a fixed time. What a live page showed between two reads is recorded by the page
itself (`Console.watch`), so a test can tell it changed in place, without a reload.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from playwright.sync_api import Locator, Page

ADMIN = "/admin"
RUNS = f"{ADMIN}/orchestrator/taskhistory/"
START = f"{RUNS}start/"
TASKS = f"{RUNS}tasks/"
NODES = f"{RUNS}nodes/"
DEAD_LETTERS = f"{RUNS}dead-letters/"
SCHEDULES = f"{RUNS}schedules/"
BACKLOG = f"{ADMIN}/coverage/mediaitemstagestate/backlog/"
_RUN_ID = re.compile(r"run_[0-9A-Z]{26}")
# Django's change list names a column's cells after its field; the runs list shows the state
# as a badge (`state_badge`), a plain list as `state`.
_STATE_CELL = "td.field-state_badge, td.field-state"

T = TypeVar("T")

# Records the text of each named element in sessionStorage whenever the page's DOM changes:
# it survives the page's own reload, so what one document showed can be read after it is gone.
_WATCH = """([key, selectors]) => {
    const seen = [];
    const read = () => {
        const now = Object.fromEntries(Object.entries(selectors).map(
            ([name, css]) => [name, document.querySelector(css)?.textContent.trim() ?? null]));
        if (JSON.stringify(seen[seen.length - 1]) === JSON.stringify(now)) return;
        seen.push(now);
        sessionStorage.setItem(key, JSON.stringify(seen));
    };
    new MutationObserver(read).observe(document.body,
        {subtree: true, childList: true, characterData: true, attributes: true});
    read();
}"""


@dataclass
class Screenshots:
    """PNGs of the console's main pages for the README, written over the last ones; without
    a folder (the default: LUMASTRA_SCREENSHOTS unset) none is taken, so a test run leaves
    the tracked pictures alone."""

    folder: Path | None
    taken: set[str] = field(default_factory=set)

    def take(self, page: Page, name: str) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(self.folder / f"{name}.png"))
        self.taken.add(name)


@dataclass
class Watch:
    """What one document showed of some elements, each time it changed (`Console.watch`)."""

    page: Page
    key: str

    def seen(self, name: str) -> list[str | None]:
        """The texts element `name` showed, in order, while the watched document lived."""
        stored = self.page.evaluate("key => sessionStorage.getItem(key)", self.key)
        return [snapshot[name] for snapshot in json.loads(stored or "[]")]


@dataclass
class Console:
    """One signed-in (or not yet) browser tab on the console at `base_url`."""

    page: Page
    base_url: str
    screenshots: Screenshots | None = None

    def goto(self, path: str) -> Console:
        response = self.page.goto(f"{self.base_url}{path}")
        assert response is not None and response.ok, f"GET {path}: {response and response.status}"
        return self

    def log_in(self, username: str, password: str) -> None:
        """Through the admin's own login form, as an operator would."""
        self.page.goto(f"{self.base_url}{ADMIN}/login/?next={ADMIN}/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("input[type=submit]")
        self.page.wait_for_url(f"{self.base_url}{ADMIN}/")

    def shoot(self, name: str) -> None:
        if self.screenshots is not None:
            self.screenshots.take(self.page, name)

    def watch(self, **selectors: str) -> Watch:
        """Starts recording, in this document only, the text of each element (a CSS selector
        per name) every time the page changes it."""
        key = f"watch-{time.monotonic_ns()}"
        self.page.evaluate(_WATCH, [key, selectors])
        return Watch(self.page, key)

    def messages(self) -> list[str]:
        """The admin's messages on the page (what an action reported)."""
        return [text.strip() for text in self.page.locator("ul.messagelist li").all_text_contents()]

    def said(self, text: str) -> bool:
        """Whether a message on the page contains `text` (the admin capitalizes each one)."""
        return any(text.lower() in message.lower() for message in self.messages())

    def eventually(self, read: Callable[[], T], timeout: float = 20.0, *, reload: bool = True) -> T:
        """`read()` until it returns something true, reloading the page between tries unless
        `reload=False` (a page that updates itself)."""
        deadline = time.monotonic() + timeout
        while True:
            value = read()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.page.url}: not as expected within {timeout}s")
            self.page.wait_for_timeout(250)
            if reload:
                self.page.reload()

    # --- pages -------------------------------------------------------------------------

    def runs(self, search: str = "") -> RunsList:
        self.goto(f"{RUNS}?q={search}" if search else RUNS)
        return RunsList(self)

    def start_form(self) -> StartForm:
        self.goto(START)
        return StartForm(self)

    def tasks(self) -> TasksPage:
        self.goto(TASKS)
        return TasksPage(self)

    def backlog(self) -> BacklogPage:
        self.goto(BACKLOG)
        return BacklogPage(self)

    def run(self, run_id: str) -> RunPage:
        self.goto(f"{RUNS}{run_id}/change/")
        return RunPage(self, run_id)

    def dead_letters(self) -> DeadLettersPage:
        self.goto(DEAD_LETTERS)
        return DeadLettersPage(self)

    def schedules(self) -> SchedulesPage:
        self.goto(SCHEDULES)
        return SchedulesPage(self)


@dataclass
class RunsList:
    """Runs → the list: rows by run id, the actions select and its Go button."""

    console: Console

    def row(self, run_id: str) -> Locator:
        # By the run's id in its first cell: a viewer's rows have no action checkbox.
        page = self.console.page
        return page.locator("#result_list tbody tr").filter(
            has=page.locator("th.field-id", has_text=run_id)
        )

    @staticmethod
    def cell_css(run_id: str, column: str) -> str:
        """A cell of the run's row (an operator's list) as plain CSS, for `Console.watch`."""
        return f"#result_list tr:has(input.action-select[value='{run_id}']) td.field-{column}"

    def state(self, run_id: str) -> str:
        row = self.row(run_id)
        if row.count() == 0:
            return ""
        return row.locator(_STATE_CELL).inner_text().strip()

    def wait_for_state(self, run_id: str, state: str, timeout: float = 20.0) -> None:
        self.console.eventually(lambda: self.state(run_id) == state, timeout)

    def run_ids(self) -> list[str]:
        boxes = self.console.page.locator("#result_list input.action-select")
        return [box.get_attribute("value") or "" for box in boxes.all()]

    def act(self, action: str, *run_ids: str) -> None:
        """Tick `run_ids`, pick `action` (the action's name, e.g. cancel_runs) and press Go;
        `Console.said` then tells what it reported."""
        page = self.console.page
        for run_id in run_ids:
            self.row(run_id).locator("input.action-select").check()
        page.select_option("select[name=action]", action)
        with page.expect_navigation():
            page.click("button[name=index], .actions button[type=submit]")


@dataclass
class StartForm:
    """Runs → Start a run: the task, then its input field by field (generated from its input
    schema) or as JSON, submitted to `start_run`."""

    console: Console

    def choose(self, task: str) -> StartForm:
        """Picks the task; the page reloads with its input's fields (start_form.js)."""
        with self.console.page.expect_navigation():
            self.console.page.select_option("#id_task", task)
        return self

    def fill(self, **values: str) -> StartForm:
        """The generated fields, by the input's property names."""
        for name, value in values.items():
            self.console.page.fill(f"#id_input-{name}", value)
        return self

    def fill_json(self, input_json: str) -> StartForm:
        self.console.page.fill("#id_input", input_json)
        return self

    def submit(self) -> str:
        """Starts the run; returns its id, from the page the form lands on."""
        page = self.console.page
        with page.expect_navigation():
            page.click("#content-main input[type=submit], #content-main button[type=submit]")
        found = _RUN_ID.search(page.url)
        assert found, f"no run id in {page.url}: {self.console.messages()}"
        return found.group(0)


@dataclass
class TasksPage:
    """Runs → Tasks: one row per task (`#task-<id>`), its circuit and force-enable."""

    console: Console

    def row(self, task_id: str) -> Locator:
        return self.console.page.locator(f"#task-{task_id}")

    def circuit(self, task_id: str) -> str:
        return self.row(task_id).locator("td.circuit").inner_text().strip()

    def force_enable_buttons(self) -> Locator:
        return self.console.page.locator("form[action$='/force-enable/'] input[type=submit]")

    def force_enable(self, task_id: str) -> None:
        with self.console.page.expect_navigation():
            self.row(task_id).locator("form[action$='/force-enable/'] [type=submit]").click()


@dataclass
class BacklogPage:
    """Coverage → Backlog: one row per covered stage (`#stage-<id>`), counts and heal."""

    console: Console

    def count(self, stage: str, status: str) -> int:
        return int(self.console.page.locator(f"#stage-{stage} td.status-{status}").inner_text())

    def heal_buttons(self) -> Locator:
        return self.console.page.locator("form[action$='/heal/'] input[type=submit]")

    def heal(self, stage: str) -> None:
        with self.console.page.expect_navigation():
            self.console.page.locator(
                f"#stage-{stage} form[action$='/heal/'] [type=submit]"
            ).click()


@dataclass
class RunPage:
    """A run's page: its state, progress and log (followed live while it runs), its stages
    and its action buttons."""

    console: Console
    run_id: str

    STATE = "#run-state"
    PROGRESS = "#run-progress"
    LOG = "#run-log"

    def text(self, css: str) -> str:
        return self.console.page.locator(css).inner_text().strip()

    def state(self) -> str:
        return self.text(self.STATE)

    def followed(self) -> bool:
        """Whether the page follows the run (it was live when the page loaded)."""
        return self.console.page.locator("#run").get_attribute("data-live") == "true"

    def log_status(self) -> str:
        return self.text("#run-log-status")

    def stages(self) -> dict[str, str]:
        boxes = self.console.page.locator(".stage-dag .stage-box")
        return {
            box.get_attribute("data-stage") or "": box.locator(".stage-state").inner_text()
            for box in boxes.all()
        }

    def buttons(self) -> list[str]:
        inputs = self.console.page.locator("#content-main form[method=post] [type=submit]")
        return [button.get_attribute("value") or "" for button in inputs.all()]

    def act(self, button: str) -> None:
        """Presses an action button ("Cancel", "Kill now", "Retry", "Resume"); the page comes
        back with what it did (`Console.said`)."""
        with self.console.page.expect_navigation():
            self.console.page.locator(f".run-actions input[value='{button}']").click()

    def open(self, other_run_id: str) -> RunPage:
        """Follows the page's link to another run (the one it retried, or a retry of it)."""
        with self.console.page.expect_navigation():
            self.console.page.locator(f".run-links a:text-is('{other_run_id}')").click()
        return RunPage(self.console, other_run_id)


@dataclass
class DeadLettersPage:
    """Runs → Dead letters: a section per kind (`#<key>`), a row per dead letter."""

    console: Console

    def row(self, section: str, row_id: str) -> Locator:
        return self.console.page.locator(f"#{section} tr.dead-letter[data-id='{row_id}']")

    def buttons(self) -> Locator:
        return self.console.page.locator(".dead-letter-section button[type=submit]")

    def act(self, section: str, row_id: str, button: str) -> None:
        with self.console.page.expect_navigation():
            self.row(section, row_id).get_by_role("button", name=button).click()


@dataclass
class SchedulesPage:
    """Runs → Schedules: beat's rows (`#static-<name>`) and the dynamic schedules' rows."""

    console: Console

    def static(self, name: str) -> Locator:
        return self.console.page.locator(f"#static-{name}")

    def enabled(self, name: str) -> str:
        return self.static(name).locator("td.enabled").inner_text().strip()

    def switches(self) -> Locator:
        return self.console.page.locator("#content-main form[method=post] [type=submit]")

    def switch(self, name: str) -> None:
        """Presses the row's Disable or Enable."""
        with self.console.page.expect_navigation():
            self.static(name).locator("form.switch-form [type=submit]").click()
