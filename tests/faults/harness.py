"""What a fault scenario works with: real worker subprocesses, the loops process, a load of runs
(started in the driver, or through a web role's API as a client does), the faults it injects
(timed), and the wait for everything to settle.

Imported by the driver after Django is set up against the battery's own Valkey (see
`tests/faults/driver.py`): everything here, and every subprocess it starts, uses that server.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

from celery import current_app
from django.db import close_old_connections, connection, connections

from lumastra.workers import descendants
from orchestrator.hooks.base import Refused
from orchestrator.runs.start import start_run
from orchestrator.states import LIVE_RUN_STATES
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.faults.netns import Host, Network
from tests.faults.servers import PostgresServer, ValkeyServer
from tests.support.fixtures import ROOT, worker_process
from tests.support.processes import stop

QUEUES = (
    "task.t.test-fault-work",
    "task.t.test-fault-poison",
    "task.t.test-fault-crash",
    "task.t.test-fault-limited",
    "task.t.test-fault-pipe",
    "task.t.test-fault-pipe.b",
    "task.t.test-fault-resume",
    "task.t.test-fault-encode",
    # The children scenario's (tests/faults/cluster_tasks.py).
    "task.t.test-fault-fan",
    "task.t.test-fault-child",
)
LOG_DIR = ROOT / ".pytest_cache"
# What a writer logs when a fence refuses its late write (`Harness.late_writes_refused`):
# runs/terminal.py, runs/execute.py and runs/stage_attempts.py for Postgres, runs/terminal.py
# (settle) for Valkey.
FENCE_REFUSALS = ("not recorded", "live hash left to its owner")
# Where a host's web role listens (on the host's own address: one per host).
WEB_PORT = 8000
RUNS_PATH = "/api/v1/runs"
# How long a client of the web role waits for an answer: far above what a start takes when
# a store is away (a store timeout, 2 s here), so no answer is a web role that hung.
ANSWER_WITHIN_S = 30.0


@dataclass(frozen=True)
class Answer:
    """What a web role answered to one start (`POST /api/v1/runs`)."""

    status: int | None  # None: no answer (see `error`)
    body: str
    asked_at: float  # time.time() when the request was sent
    took_s: float
    error: str = ""  # why there was no answer: the client's exception

    @property
    def run_id(self) -> str | None:
        """The started run, from a 2xx answer's body."""
        if self.status is None or not 200 <= self.status < 300:
            return None
        return str(json.loads(self.body)["run_id"])

    def detail(self) -> str:
        """An error answer's `detail` (the API's error body), or "" when it has none."""
        try:
            found = json.loads(self.body)
        except ValueError:
            return ""
        return str(found.get("detail") or "") if isinstance(found, dict) else ""


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    stack: ExitStack

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def children(self) -> list[int]:
        return descendants(self.pid) if self.alive() else []

    def pool(self) -> list[int]:
        """The pool processes: the main process's own children. A command a run started sits
        below one of them; between its fork and its exec it carries none of its marks yet."""
        return [pid for pid in self.children() if _parent(pid) == self.pid]

    def signal_all(self, signum: int) -> None:
        """The main process and its pool children (SIGSTOP/SIGCONT a whole worker)."""
        for pid in [self.pid, *self.children()]:
            with suppress(ProcessLookupError):
                os.kill(pid, signum)


@dataclass
class Harness:
    scenario: str
    valkey: ValkeyServer
    effects_path: Path
    scale: float = 1.0
    # The scenario's own Postgres (`Scenario.own_postgres`), which DATABASE_URL names.
    postgres: PostgresServer | None = None
    # The partition scenarios' hosts and the cuts between them (`Scenario.hosts`).
    network: Network | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(4))
    workers: list[Worker] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    last_fault: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    # Seconds from a cut of the cluster seat's holder to another host holding it.
    leader_failover_s: float | None = None
    # Processes the scenario SIGSTOPped: an entry beside one of them is reported apart.
    frozen_pids: set[int] = field(default_factory=set)
    since: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loops: subprocess.Popen[bytes] | None = None
    _loops_log: Any = None
    _worker_count: int = 0
    _worker_names: list[str] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)

    # --- processes ----------------------------------------------------------------------

    def worker(
        self, *, concurrency: int = 2, env: Mapping[str, str] | None = None, name: str = ""
    ) -> Worker:
        """A real `celery worker` on the fault queues (tests.support.fixtures.worker_process)."""
        self._worker_count += 1
        label = name or f"faults-{self.scenario}-{self._worker_count}"
        stack = ExitStack()
        process = stack.enter_context(
            worker_process(list(QUEUES), concurrency=concurrency, name=label, env=env)
        )
        worker = Worker(label, process, stack)
        self.workers.append(worker)
        self._worker_names.append(label)
        return worker

    def role(self, *, concurrency: int = 2, env: Mapping[str, str] | None = None) -> Worker:
        """A worker role as a deploy runs it (`tests.faults.role`: the role's supervisor, its
        graceful shutdown, around one `celery worker` on the fault queues)."""
        self._worker_count += 1
        label = f"faults-{self.scenario}-role-{self._worker_count}"
        hostname = f"{label}-{os.getpid()}@localhost"
        argv = [sys.executable, "-m", "tests.faults.role", hostname, str(concurrency)]
        env = {**os.environ, **self.database_env(), **(env or {})}
        return self._started(label, [*argv, ",".join(QUEUES)], env, _answers(hostname), within_s=30)

    def retire(self, worker: Worker) -> None:
        """Stop a worker (SIGTERM, as the fixture does) and forget it."""
        if worker in self.workers:
            self.workers.remove(worker)
        worker.signal_all(signal.SIGCONT)
        worker.stack.close()
        for pid in descendants(worker.pid):
            _kill(pid)

    def retire_all(self) -> None:
        for worker in list(self.workers):
            self.retire(worker)

    def log_count(self, worker: Worker | None, needle: str) -> int:
        """Lines holding `needle` in one worker's log, or in every log of the scenario."""
        return len(self.log_lines(worker, needle))

    def late_writes_refused(self) -> int:
        """Writes refused by a fence, as the writers log them: an end, a retry or a stage move
        Postgres refused (`... not recorded`), a live hash move for an owner that lost it."""
        return sum(self.log_count(None, needle) for needle in FENCE_REFUSALS)

    def log_lines(self, worker: Worker | None, needle: str) -> list[str]:
        """The lines `log_count` counts, log by log."""
        names = [worker.name] if worker else self._worker_names
        paths = [LOG_DIR / f"worker-{name}-{os.getpid()}.log" for name in names]
        if worker is None:
            paths.append(LOG_DIR / f"faults-{self.scenario}-loops.log")
        return [
            line
            for path in paths
            if path.exists()
            for line in path.read_text(errors="replace").splitlines()
            if needle in line
        ]

    def host_role(self, host: Host) -> Worker:
        """The real worker role (`deploy/start-worker.sh`: a Celery worker per pool and the
        loops, under the role's supervisor) on a host of the partition scenarios' network,
        in its namespace and under its own hostname."""
        assert self.network is not None, "a host role runs on the scenario's own network"
        argv = self.network.argv(host, [str(ROOT / "deploy" / "start-worker.sh")])
        env = {**os.environ, "LUMASTRA_PYTHON": sys.executable}
        label = f"faults-{self.scenario}-{host.name}"
        return self._started(label, argv, env, _answers(f"io@{host.name}"), within_s=60)

    def host_web(self, host: Host) -> tuple[Worker, str]:
        """The real web role (`deploy/start-web.sh`: uvicorn serving the API) on a host of the
        partition scenarios' network, listening on the host's address; returns it (stopped
        with the workers) and its base URL, once its readiness probe says every store
        answers."""
        assert self.network is not None, "a host role runs on the scenario's own network"
        argv = self.network.argv(host, [str(ROOT / "deploy" / "start-web.sh")])
        env = {
            **os.environ,
            "LUMASTRA_PYTHON": sys.executable,
            "LUMASTRA_WEB_HOST": host.address,
            "LUMASTRA_WEB_PORT": str(WEB_PORT),
            "LUMASTRA_ALLOWED_HOSTS": host.address,
        }
        url = f"http://{host.address}:{WEB_PORT}"
        label = f"faults-{self.scenario}-{host.name}"
        return self._started(label, argv, env, lambda: _ready(url), within_s=60), url

    def _started(
        self,
        label: str,
        argv: list[str],
        env: Mapping[str, str],
        ready: Callable[[], bool],
        *,
        within_s: float,
    ) -> Worker:
        """`argv` started, its output in the scenario's log for `label`, and waited for until
        `ready()` says it serves: one of the scenario's workers from then on."""
        log = open(LOG_DIR / f"worker-{label}-{os.getpid()}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            argv, cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT
        )
        stack = ExitStack()
        stack.callback(log.close)
        stack.callback(stop, process, 60.0)
        deadline = time.monotonic() + within_s
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                stack.close()
                raise RuntimeError(f"{label} did not start; see {log.name}")
        worker = Worker(label, process, stack)
        self.workers.append(worker)
        self._worker_names.append(label)
        return worker

    def loops(self, env: Mapping[str, str] | None = None) -> None:
        """`python -m orchestrator.loops`: boot recovery, then the reconciler and the drain."""
        self._loops_log = open(LOG_DIR / f"faults-{self.scenario}-loops.log", "wb")  # noqa: SIM115
        self._loops = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.loops"],
            cwd=ROOT,
            env={**os.environ, **self.database_env(), **(env or {})},
            stdout=self._loops_log,
            stderr=subprocess.STDOUT,
        )

    def database_env(self) -> dict[str, str]:
        from tests.support.fixtures import database_url

        return {"DATABASE_URL": database_url()}

    def close(self) -> None:
        self.retire_all()
        if self._loops is not None:
            self._loops.terminate()
            try:
                self._loops.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self._loops.kill()
                self._loops.wait()
            self._loops_log.close()
        self._stack.close()

    # --- load ---------------------------------------------------------------------------

    def n(self, count: int) -> int:
        """A load size scaled by FAULTS_SCALE (the soak)."""
        return max(1, round(count * self.scale))

    def start(self, task_id: str, data: dict[str, Any]) -> str | None:
        try:
            handle = start_run(task_id, data, trigger=TriggerKind.API)
        except Refused as refusal:
            with self._lock:
                self.refused[refusal.code] += 1
            return None
        except Exception as exc:  # Valkey or Postgres away: the caller is told, nothing recorded
            with self._lock:
                self.refused[type(exc).__name__] += 1
            return None
        with self._lock:
            self.started.append(handle.run_id)
        return handle.run_id

    @contextmanager
    def load(
        self, count: int, make: Callable[[int], tuple[str, dict[str, Any]]], per_s: float = 0
    ) -> Iterator[threading.Thread]:
        """Start `count` runs from a thread (at `per_s` a second, or as fast as it can);
        the block runs meanwhile, and the load is finished when it exits."""

        def body() -> None:
            try:
                began = time.monotonic()
                for index in range(count):
                    if per_s:
                        time.sleep(max(0.0, began + index / per_s - time.monotonic()))
                    self.start(*make(index))
            finally:
                connections.close_all()

        thread = threading.Thread(target=body, name="load", daemon=True)
        thread.start()
        try:
            yield thread
        finally:
            thread.join()

    def api_token(self) -> str:
        """A bearer token of a staff account allowed to start runs, as an operator has."""
        from orchestrator.api import tokens
        from tests.support.users import operator

        return tokens.issue(operator(f"faults-{self.scenario}"), "fault battery")[1]

    def post_run(self, url: str, token: str, task_id: str, data: dict[str, Any]) -> Answer:
        """One start through a web role's API, as a client makes it."""
        parts = urlsplit(url)
        client = http.client.HTTPConnection(
            parts.hostname or "", parts.port, timeout=ANSWER_WITHIN_S
        )
        asked_at, began = time.time(), time.monotonic()
        try:
            client.request(
                "POST",
                RUNS_PATH,
                body=json.dumps({"task": task_id, "input": data}),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            response = client.getresponse()
            body = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            took = time.monotonic() - began
            return Answer(None, "", asked_at, took, error=f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
        return Answer(response.status, body, asked_at, time.monotonic() - began)

    @contextmanager
    def http_load(
        self,
        url: str,
        token: str,
        count: int,
        make: Callable[[int], tuple[str, dict[str, Any]]],
        per_s: float,
        *,
        clients: int = 8,
    ) -> Iterator[list[Answer]]:
        """Start `count` runs through a web role's API at `per_s` a second, from `clients`
        threads (so a slow answer does not hold the others back); the block runs meanwhile.
        Yields the answers, all in once the block exits. A 2xx answer's run is one of the
        scenario's started runs; any other answer, or none, counts as a refused start."""
        answers: list[Answer] = []
        indexes = iter(range(count))
        began = time.monotonic()

        def body() -> None:
            while True:
                with self._lock:
                    index = next(indexes, None)
                    if index is None:
                        return
                    task_id, data = make(index)
                time.sleep(max(0.0, began + index / per_s - time.monotonic()))
                answer = self.post_run(url, token, task_id, data)
                with self._lock:
                    answers.append(answer)
                    if answer.run_id is not None:
                        self.started.append(answer.run_id)
                    else:
                        refusal = f"HTTP {answer.status}" if answer.status else "no answer"
                        self.refused[refusal] += 1

        threads = [
            threading.Thread(target=body, name=f"http-load-{n}", daemon=True)
            for n in range(clients)
        ]
        for thread in threads:
            thread.start()
        try:
            yield answers
        finally:
            for thread in threads:
                thread.join()
            answers.sort(key=lambda a: a.asked_at)

    def work(
        self,
        low_ms: int,
        high_ms: int,
        *,
        deaf_share: float = 0.0,
        long_share: float = 0.0,
        long_ms: tuple[int, int] = (1500, 3000),
    ) -> Callable[[int], Any]:
        """Inputs of test-fault-work: `low_ms`..`high_ms` long, a share of them long enough
        to heartbeat a few times, a share deaf to cancels."""

        def make(index: int) -> tuple[str, dict[str, Any]]:
            span = long_ms if long_share and self.rng.random() < long_share else (low_ms, high_ms)
            data: dict[str, Any] = {"ms": self.rng.randint(*span)}
            if deaf_share and self.rng.random() < deaf_share:
                data["deaf"] = True
            return "test-fault-work", data

        return make

    # --- faults and waiting -------------------------------------------------------------

    def fault(self, name: str) -> None:
        with self._lock:
            self.faults[name] += 1
            self.last_fault = time.monotonic()

    def state(self, run_id: str) -> str | None:
        close_old_connections()
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM task_history WHERE id = %s", [run_id])
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def live_count(self) -> int:
        close_old_connections()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM task_history WHERE state = ANY(%s) "
                "AND (id = ANY(%s) OR created_at >= %s)",
                [[s.value for s in LIVE_RUN_STATES], list(self.started), self.since],
            )
            return int(cursor.fetchone()[0])

    def active_runs(self) -> list[str]:
        """Started runs a worker runs now, as Valkey says: Postgres hears of a run's claim only
        once it has gone on for a second (`runs.watch.CLAIM_AFTER_S`), or at its end."""
        return list(self.live_claims(list(self.started)))

    def active_runs_of(self, worker: Worker) -> list[str]:
        """Started runs one of `worker`'s pool children runs now (Valkey's live claims)."""
        pids = {str(pid) for pid in worker.children()}
        # An owner is "<host>:<pid>:<suffix>" (orchestrator.cluster.instance).
        return [
            run_id
            for run_id, owner in self.live_claims(list(self.started)).items()
            if owner.partition(":")[2].split(":")[0] in pids
        ]

    @staticmethod
    def live_claims(run_ids: list[str]) -> dict[str, str]:
        """run id → owner, for the runs whose live hash says active."""
        pipe = valkey.client().pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(keys.run_active(run_id), "state", "owner")
        found = valkey.execute(pipe)
        return {
            run_id: str(owner)
            for run_id, (state, owner) in zip(run_ids, found, strict=True)
            if state == "active" and owner
        }

    def settle(self, bound_s: float) -> float | None:
        """Wait until every run of the scenario is terminal, at most `bound_s` after the last
        fault (or now); returns seconds from the last fault to all-terminal, None if not."""
        origin = self.last_fault or time.monotonic()
        while True:
            if self.live_count() == 0:
                return time.monotonic() - origin
            if time.monotonic() - origin > bound_s:
                return None
            time.sleep(0.25)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{self.scenario}: {what} not within {timeout:.0f} s")

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def cut_for(
        self,
        host: Host,
        ports: tuple[int, ...],
        seconds: float,
        what: str,
        *,
        loss_percent: int = 100,
    ) -> tuple[float, float]:
        """Cut `host` from the stores on `ports` (`Network.cut`) for `seconds`, then heal it;
        the cut and its heal are counted as the faults `what` and "`what`: healed". Returns when
        the cut began and when it was healed (time.time())."""
        assert self.network is not None, "a cut needs the partition scenarios' network"
        self.network.cut(host, ports, loss_percent=loss_percent)
        self.fault(what)
        cut_at = time.time()
        self.pause(seconds)
        self.network.heal(host)
        self.fault(f"{what}: healed")
        return cut_at, time.time()

    def kill_random_child(self) -> bool:
        """SIGKILL one pool process, never a command a run started."""
        candidates = [(w, pid) for w in self.workers for pid in w.pool()]
        if not candidates:
            return False
        _, pid = self.rng.choice(candidates)
        _kill(pid)
        self.fault("SIGKILL pool child")
        return True


def _answers(node: str) -> Callable[[], bool]:
    """Whether the Celery node `node` answers a ping."""
    return lambda: bool(current_app.control.ping(destination=[node], timeout=0.5))


def _ready(url: str) -> bool:
    """Whether the web role at `url` says it is ready (`/readyz`: every store answers)."""
    try:
        with urlopen(f"{url}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet, or a 503 (HTTPError): not ready
        time.sleep(0.2)
        return False


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _kill(pid: int, signum: int = signal.SIGKILL) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signum)
