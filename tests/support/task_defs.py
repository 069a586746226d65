"""Task definitions the test suite runs on real workers (loaded via LUMASTRA_TASK_MODULES)."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from orchestrator.cluster.instance import instance_id
from orchestrator.hooks import ratelimit
from orchestrator.stores import keys, valkey
from tasks import (
    Concurrency,
    CoverageBatch,
    CoverageItem,
    CoveredStage,
    Debounce,
    FatalError,
    NoInput,
    PermanentError,
    Quotas,
    Retry,
    Stage,
    Stall,
    TaskContext,
    Throttle,
    Timeout,
    TransientError,
    define_limit,
    define_task,
    define_trigger,
    skipped,
)
from tasks.definitions.catalog import HAS_PRESENT_FILE

ORDER_KEY = "test:pickup-order"


def _noop(ctx: TaskContext, params: NoInput) -> dict[str, bool]:
    return {"ok": True}


# Its schedule tests fire slot after slot with no worker taking the runs: "allow", or every
# slot after the first would be skipped for the live run before it (tasks.definition.Overlap).
noop = define_task(id="test-noop", resource_class="io", execute=_noop, overlap="allow")


def _noop_keyed(ctx: TaskContext, params: BaseModel) -> dict[str, bool]:
    return {"ok": True}


class FailInput(BaseModel, extra="forbid"):
    how: Literal["permanent", "fatal", "transient", "crash"]


def _fail(ctx: TaskContext, params: FailInput) -> None:
    errors = {"permanent": PermanentError, "fatal": FatalError, "transient": TransientError}
    if params.how == "crash":
        raise ZeroDivisionError("the handler divided by zero")
    raise errors[params.how](f"asked to fail as {params.how}")


fail = define_task(id="test-fail", resource_class="io", execute=_fail, input_model=FailInput)


class LabelInput(BaseModel, extra="forbid"):
    label: str
    seconds: float = 0.0


def _record_order(ctx: TaskContext, params: LabelInput) -> None:
    valkey.client().rpush(ORDER_KEY, params.label)
    time.sleep(params.seconds)


record_order = define_task(
    id="test-record-order",
    resource_class="maintenance",
    execute=_record_order,
    input_model=LabelInput,
)

versioned = define_task(
    id="test-versioned", resource_class="io", execute=_noop, processing_version=2
)

quota_limited = define_task(
    id="test-quota",
    resource_class="io",
    execute=_fail,
    input_model=FailInput,
    quotas=Quotas(max_runs_per_day=3),
)


class KeyInput(BaseModel, extra="forbid"):
    key: str


def _by_key(params: KeyInput) -> str:
    return params.key


# Identity-deduplicated; its queue is private so runs stay live until a test's own worker.
unique = define_task(
    id="test-unique",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
)
exclusive_a = define_task(
    id="test-excl-a",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
    exclusive_with=["test-excl-b"],
)
exclusive_b = define_task(
    id="test-excl-b",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
)
unique_with_quota = define_task(
    id="test-unique-quota",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
    quotas=Quotas(max_runs_per_day=1),
)

# Fails on request like test-fail, with a circuit of its own, so the circuit breaker test
# that opens it on a real worker does not refuse other tests' runs of test-fail.
circuit_probe = define_task(
    id="test-circuit", resource_class="io", execute=_fail, input_model=FailInput
)


def _server_ms() -> int:
    seconds, micros = valkey.client().time()
    return int(seconds) * 1000 + int(micros) // 1000


class SleepInput(BaseModel, extra="forbid"):
    label: str
    seconds: float = 0.2


LIMITED_NOW_KEY = "test:limited:now"
LIMITED_SEEN_KEY = "test:limited:seen"


def _count_concurrent(ctx: TaskContext, params: SleepInput) -> None:
    """Measures its own concurrency: how many runs are inside the handler on entry."""
    client = valkey.client()
    client.rpush(LIMITED_SEEN_KEY, json.dumps([client.incr(LIMITED_NOW_KEY), os.getppid()]))
    try:
        time.sleep(params.seconds)
    finally:
        client.decr(LIMITED_NOW_KEY)


limited = define_task(
    id="test-limited",
    resource_class="io",
    execute=_count_concurrent,
    input_model=SleepInput,
    quotas=Quotas(max_concurrent=2),
)

LEASE_STARTS_KEY = "test:lease:starts"


def _hold_slot(ctx: TaskContext, params: SleepInput) -> None:
    start = {"pid": os.getpid(), "at_ms": _server_ms()}
    valkey.client().hset(LEASE_STARTS_KEY, params.label, json.dumps(start))
    time.sleep(params.seconds)


# One slot and a short lease (hard timeout 4 s + the lease margin), for the crashed-holder test.
lease_holder = define_task(
    id="test-lease",
    resource_class="io",
    execute=_hold_slot,
    input_model=SleepInput,
    quotas=Quotas(max_concurrent=1),
    timeout=Timeout(soft=timedelta(seconds=3), hard=timedelta(seconds=4)),
)

RATED_KEY = "test:rated:starts"


def _record_admission(ctx: TaskContext, params: LabelInput) -> None:
    """Records when the rate limiter admitted this run (its entry in the window, on Valkey's
    clock) and when the handler started (Valkey's clock too)."""
    client = valkey.client()
    admitted = client.zscore(
        keys.rate_window("test-rated"), ratelimit.member(ctx.run_id, instance_id())
    )
    record = {"admitted_ms": admitted, "started_ms": _server_ms(), "worker": os.getppid()}
    client.rpush(RATED_KEY, json.dumps(record))


rated = define_task(
    id="test-rated",
    resource_class="io",
    execute=_record_admission,
    input_model=LabelInput,
    quotas=Quotas(rate="10/s"),
)

# One backpressure policy per otherwise unused class, so each test owns its class's depth.
drop_when_full = define_task(
    id="test-bp-drop", resource_class="discovery", execute=_noop, backpressure="drop"
)
fail_when_full = define_task(
    id="test-bp-fail", resource_class="embedding", execute=_noop, backpressure="fail-fast"
)
shed_when_full = define_task(
    id="test-bp-shed",
    resource_class="analysis",
    execute=_noop_keyed,
    input_model=KeyInput,
    backpressure="shed-oldest",
)


class SleepyInput(BaseModel, extra="forbid"):
    seconds: float
    # cooperative: ctx.sleep, which a cancel interrupts; otherwise a plain, deaf sleep.
    cooperative: bool = True
    progress: bool = True


def _sleepy(ctx: TaskContext, params: SleepyInput) -> dict[str, int]:
    valkey.client().hset(SLEEPY_PIDS_KEY, ctx.run_id, os.getpid())
    if params.progress:
        ctx.report_progress(0, 1)
    if params.cooperative:
        ctx.sleep(params.seconds)
    else:
        time.sleep(params.seconds)
    return {"pid": os.getpid()}


def _slow_tick(ctx: TaskContext, params: NoInput) -> dict[str, int]:
    ctx.sleep(SLOW_TICK_S)
    return {"slept": SLOW_TICK_S}


# A scheduled tick that outlasts its interval (issue 23): scheduled every 2 s by the test.
SLOW_TICK_S = 7
slow_tick = define_task(id="test-slow-tick", resource_class="io", execute=_slow_tick)
slow_tick_queued = define_task(
    id="test-slow-tick-queued",
    resource_class="io",
    execute=_slow_tick,
    overlap="queue",
    quotas=Quotas(max_concurrent=1),
)

SLEEPY_PIDS_KEY = "test:sleepy:pids"
sleepy = define_task(
    id="test-sleepy", resource_class="io", execute=_sleepy, input_model=SleepyInput
)


def _busy_forever(ctx: TaskContext, params: NoInput) -> None:
    # Keeps reporting progress and swallows the soft timeout (as careless handlers do), so
    # only the wall-clock hard timeout can stop it.
    while True:
        try:
            ctx.report_progress(0, None)
            time.sleep(0.2)
        except Exception:
            continue


hard_timeout = define_task(
    id="test-hard-timeout",
    resource_class="io",
    execute=_busy_forever,
    timeout=Timeout(soft=timedelta(seconds=1), hard=timedelta(seconds=3)),
)


class FlakyInput(BaseModel, extra="forbid"):
    label: str
    fail_times: int


def _flaky(ctx: TaskContext, params: FlakyInput) -> dict[str, int]:
    seen = valkey.client().hincrby(FLAKY_KEY, params.label, 1)
    if seen <= params.fail_times:
        raise TransientError(f"failure {seen} of {params.fail_times}")
    return {"calls": seen}


FLAKY_KEY = "test:flaky:calls"
flaky = define_task(
    id="test-flaky",
    resource_class="io",
    execute=_flaky,
    input_model=FlakyInput,
    retry=Retry(max_attempts=3, base=timedelta(milliseconds=200), cap=timedelta(seconds=1)),
)


# --- resuming after a lost worker (test_redelivery, test_reconciler; run in the test's process)

# test-sleepy with a short backoff, so a resumed run is due again within a test.
resumable = define_task(
    id="test-resumable",
    resource_class="io",
    execute=_sleepy,
    input_model=SleepyInput,
    retry=Retry(max_attempts=3, base=timedelta(milliseconds=200), cap=timedelta(seconds=1)),
)
# The same, opted out: work that must never be repeated fails when its worker is lost.
no_resume = define_task(
    id="test-no-resume",
    resource_class="io",
    execute=_sleepy,
    input_model=SleepyInput,
    retry_on_worker_loss=False,
)


# --- the fault battery (tests/faults) ---------------------------------------------------------

# The file each handler entry is appended to, set by the battery for its workers; unset, the
# fault tasks record nothing.
FAULT_EFFECTS_ENV = "LUMASTRA_FAULTS_EFFECTS_FILE"
FAULT_TIMEOUT = Timeout(soft=timedelta(seconds=15), hard=timedelta(seconds=20))


def _record_execution(run_id: str, stage: str = "") -> None:
    """The side effect the battery counts: one line per handler (or stage) entry, with the
    claiming process's instance id (the claim's owner). A file, not Valkey or Postgres, so it
    survives what the battery breaks; an O_APPEND write of one short line is never
    interleaved.

    Each entry also takes an exclusive `flock` on a file of its own run (or stage) until the
    handler leaves (`_left`): a lock the kernel releases when its process dies, so a second
    entry that finds it held ran while another process was still inside the handler for the
    same work, and records that process's pid (`overlap_with`). The checker fails on those."""
    path = os.environ.get(FAULT_EFFECTS_ENV)
    if not path:
        return
    line = {
        "run": run_id,
        "stage": stage,
        "owner": instance_id(),
        "pid": os.getpid(),
        "at": time.time(),
        "overlap_with": _enter(path, run_id, stage),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


# The entry locks this process holds, by run (and stage): released when the handler leaves.
_inside: dict[str, int] = {}


def _enter(path: str, run_id: str, stage: str) -> int | None:
    """Take the work's entry lock; None, or the pid of the process holding it already."""
    import fcntl

    name = f"{run_id}.{stage}" if stage else run_id
    folder = f"{path}.locks"
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        return int(holder) if holder.isdigit() else -1
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _inside[name] = fd
    return None


def _left(run_id: str, stage: str = "") -> None:
    fd = _inside.pop(f"{run_id}.{stage}" if stage else run_id, None)
    if fd is not None:
        os.close(fd)


@contextmanager
def _executing(run_id: str, stage: str = "") -> Iterator[None]:
    """A fault handler's body: its entry recorded, its entry lock held until it leaves."""
    _record_execution(run_id, stage)
    try:
        yield
    finally:
        _left(run_id, stage)


class FaultWorkInput(BaseModel, extra="forbid"):
    ms: int = 100
    # deaf: a plain time.sleep that no cancel interrupts (only the escalation's kill stops it)
    deaf: bool = False


def _fault_work(ctx: TaskContext, params: FaultWorkInput) -> dict[str, int]:
    with _executing(ctx.run_id):
        ctx.report_progress(0, 1)
        if params.deaf:
            time.sleep(params.ms / 1000)
        else:
            ctx.sleep(params.ms / 1000)
        return {"pid": os.getpid()}


def _fault_slow_progress(ctx: TaskContext, params: FaultWorkInput) -> dict[str, int]:
    """Like the demo's slow-progress: a long run that reports progress in small steps."""
    with _executing(ctx.run_id):
        steps = max(1, params.ms // 100)
        for done in range(steps):
            ctx.report_progress(done, steps)
            ctx.sleep(0.1)
        ctx.report_progress(steps, steps)
        return {"pid": os.getpid()}


fault_work = define_task(
    id="test-fault-work",
    resource_class="io",
    execute=_fault_work,
    input_model=FaultWorkInput,
    timeout=FAULT_TIMEOUT,
)


def _fault_stage(name: str) -> Any:
    def execute(ctx: TaskContext, params: FaultWorkInput) -> dict[str, int]:
        with _executing(ctx.run_id, name):
            ctx.sleep(params.ms / 1000)
            return {"pid": os.getpid()}

    return execute


# The resume scenario: runs of seconds, killed again and again; attempts enough that none runs
# out of them under the scenario's kills, and a short backoff.
fault_resume = define_task(
    id="test-fault-resume",
    resource_class="io",
    execute=_fault_slow_progress,
    input_model=FaultWorkInput,
    timeout=FAULT_TIMEOUT,
    retry=Retry(max_attempts=6, base=timedelta(milliseconds=300), cap=timedelta(seconds=2)),
)


class FaultEncodeInput(BaseModel, extra="forbid"):
    seconds: float = 3.0


def _fault_encode(ctx: TaskContext, params: FaultEncodeInput) -> dict[str, int]:
    """Trickplay's command on a test pattern read at its native rate (`-re`): the encode lasts
    `seconds`, so a kill or a cancel lands mid-encode (the demo's clips take 0.1 s)."""
    with _executing(ctx.run_id):
        effects = os.environ.get(FAULT_EFFECTS_ENV)
        folder = Path(f"{effects}.encodes" if effects else tempfile.gettempdir()) / ctx.run_id
        folder.mkdir(parents=True, exist_ok=True)
        source = f"testsrc=duration={params.seconds:g}:size=320x180:rate=10"
        ctx.run_process(
            [
                "ffmpeg", "-nostdin", "-v", "error", "-y", "-re", "-f", "lavfi", "-i", source,
                "-vf", "fps=1,scale=160:90,tile=5x2", "-frames:v", "1",
                "-progress", "pipe:1", "sprite.jpg",
            ],
            cwd=folder,
            on_stdout=_ffmpeg_progress(ctx, params.seconds),
            grace_s=1.0,
        )  # fmt: skip
        return {"sprite_bytes": (folder / "sprite.jpg").stat().st_size}


# The media scenario: real ffmpeg encodes, killed and cancelled (attempts as for resume).
fault_encode = define_task(
    id="test-fault-encode",
    resource_class="cpu",
    execute=_fault_encode,
    input_model=FaultEncodeInput,
    timeout=FAULT_TIMEOUT,
    retry=Retry(max_attempts=6, base=timedelta(milliseconds=300), cap=timedelta(seconds=2)),
    # Every process of the scenario's two workers encodes (the default on 2 cores is one).
    quotas=Quotas(max_concurrent=4),
    requires_commands=("ffmpeg",),
)

# The pipeline scenarios: a → b (cpu) and a → c, c → d; every stage records its entries.
fault_pipe = define_task(
    id="test-fault-pipe",
    resource_class="io",
    input_model=FaultWorkInput,
    timeout=FAULT_TIMEOUT,
    pipeline=[
        Stage(name="a", execute=_fault_stage("a")),
        Stage(name="b", execute=_fault_stage("b"), after=("a",), resource_class="cpu"),
        Stage(name="c", execute=_fault_stage("c"), after=("a",)),
        Stage(name="d", execute=_fault_stage("d"), after=("c",)),
    ],
)

# The backlog scenario: far more runs than slots, so most are postponed again and again.
fault_limited = define_task(
    id="test-fault-limited",
    resource_class="io",
    execute=_fault_work,
    input_model=FaultWorkInput,
    timeout=FAULT_TIMEOUT,
    quotas=Quotas(max_concurrent=2),
)


class PoisonInput(BaseModel, extra="forbid"):
    how: Literal["exit", "alloc", "raise"]


def _allocate_too_much() -> None:
    """A huge allocation, bounded: this process's address space is capped 256 MiB above what
    it uses for the attempt, so asking for 8 GiB fails with MemoryError instead of swapping
    the machine (or waking the OOM killer); the cap is lifted again before the handler ends."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, hard))
    try:
        bytearray(8 * 2**30)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _poison(ctx: TaskContext, params: PoisonInput) -> None:
    with _executing(ctx.run_id):
        if params.how == "exit":
            os._exit(70)  # the pool child vanishes mid-run, as a segfault or the OOM killer would
        if params.how == "alloc":
            _allocate_too_much()
        raise RuntimeError(f"poison payload ({params.how})")


# Two tasks, two circuits: one fed every kind of poison, one that only ever exits.
fault_poison = define_task(
    id="test-fault-poison",
    resource_class="io",
    execute=_poison,
    input_model=PoisonInput,
    timeout=FAULT_TIMEOUT,
)
fault_crash = define_task(
    id="test-fault-crash",
    resource_class="io",
    execute=_poison,
    input_model=PoisonInput,
    timeout=FAULT_TIMEOUT,
)

# A quota before a drop: the dropped start is committed, so its unit must be given back.
quota_then_drop = define_task(
    id="test-quota-drop",
    resource_class="embedding",
    execute=_noop,
    backpressure="drop",
    quotas=Quotas(max_runs_per_day=3),
)


# --- run in the test's own process (test_round_trips, test_runner_claim, test_prepared) ------

# These tests call the runner in their own process, so the queues stay private: a shared worker
# taking a message first would change the path they check. One without limits (the same
# as test-noop, whose queue the shared worker takes), one with every limit a task can declare.
round_trips_plain = define_task(id="test-rt-plain", resource_class="io", execute=_noop)
# Paused and its circuit set by hand (test_runner_claim, test_settle): no other test runs it.
solo = define_task(id="test-solo", resource_class="io", execute=_noop)
# Delayed and bulk starts (test_delayed_starts.py, test_batch_starts.py) count what waits in
# its queue, which no shared worker takes.
starts_noop = define_task(id="test-starts", resource_class="io", execute=_noop, overlap="allow")


class TracedInput(BaseModel, extra="forbid"):
    fail: bool = False


def _traced(ctx: TaskContext, params: TracedInput) -> dict[str, bool]:
    logging.getLogger("tests.traced").info("run %s: traced handler", ctx.run_id)
    ctx.run_process(["true"], cwd=tempfile.gettempdir())
    if params.fail:
        raise PermanentError("asked to fail")
    return {"ok": True}


class LibraryInput(BaseModel, extra="forbid"):
    library_id: int | str
    full: bool = False


# Runs found by what they were about (test_run_search): no worker takes its queue.
library_scan = define_task(
    id="test-library-scan",
    resource_class="io",
    execute=_noop_keyed,
    input_model=LibraryInput,
    overlap="allow",
)


# Traced runs (test_tracing): a log line and a command in its handler; no shared worker.
traced = define_task(
    id="test-traced", resource_class="io", execute=_traced, input_model=TracedInput
)

round_trips_limited = define_task(
    id="test-rt-limited",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
    # Limits high enough never to refuse or postpone: the guard counts the admitted path.
    quotas=Quotas(max_runs_per_day=1_000_000, max_concurrent=2, rate="1000/s"),
)


# --- pipelines (test_pipelines): probe → left (io) and right (cpu); left → final -----------

PIPE_CALLS_KEY = "test:pipe:calls:{run_id}"


class PipeInput(BaseModel, extra="forbid"):
    fail_stage: str | None = None
    skip_right: bool = False
    sleep_s: float = 0.0
    big_result: bool = False
    flaky_left: int = 0  # `left` raises TransientError this many times before it succeeds
    warn_left: bool = False
    final_needs_key: str | None = None  # `final` fails unless this Valkey key exists


def _pipe_stage(name: str) -> Any:
    """A stage body that records when it ran (in Valkey, for the test to read) and returns what
    it saw of earlier stages."""

    def execute(ctx: TaskContext, params: PipeInput) -> dict[str, Any]:
        started = time.time()
        ctx.spend("cpu_seconds", 0.25)
        ctx.count("calls")
        if params.sleep_s:
            ctx.sleep(params.sleep_s)
        if params.fail_stage == name:
            raise PermanentError(f"asked to fail in {name}")
        if name == "left" and params.flaky_left:
            tries = valkey.client().incr(f"test:pipe:flaky:{ctx.run_id}")
            if tries <= params.flaky_left:
                raise TransientError(f"flaky try {tries}")
        if name == "left" and params.warn_left:
            ctx.warn("left saw something odd")
        needs = params.final_needs_key
        if name == "final" and needs and not valkey.client().exists(needs):
            raise PermanentError(f"{needs} is missing")
        record = {"stage": name, "pid": os.getpid(), "started": started, "ended": time.time()}
        valkey.client().rpush(PIPE_CALLS_KEY.format(run_id=ctx.run_id), json.dumps(record))
        if params.big_result and name == "probe":
            return {"blob": "x" * 100_000}
        return {"stage": name, "saw": sorted(ctx.results)}

    return execute


pipe = define_task(
    id="test-pipe",
    resource_class="io",
    input_model=PipeInput,
    pipeline=[
        Stage(name="probe", execute=_pipe_stage("probe")),
        Stage(
            name="left",
            execute=_pipe_stage("left"),
            after=("probe",),
            retry=Retry(max_attempts=3, base=timedelta(milliseconds=100), cap=timedelta(seconds=1)),
        ),
        Stage(
            name="right",
            execute=_pipe_stage("right"),
            after=("probe",),
            resource_class="cpu",
            when=lambda ctx: not ctx.input.skip_right,
        ),
        Stage(name="final", execute=_pipe_stage("final"), after=("left",)),
        Stage(name="after-right", execute=_pipe_stage("after-right"), after=("right",)),
    ],
)


def _spend_tokens(ctx: TaskContext, params: NoInput) -> dict[str, bool]:
    ctx.spend("tokens", 10)
    ctx.count("requests", 2)
    ctx.warn("the model answered slowly")
    return {"ok": True}


# A daily cost cap one run reaches: the next start is refused (test_pipelines).
cost_cap = define_task(
    id="test-cost-cap",
    resource_class="io",
    execute=_spend_tokens,
    quotas=Quotas(max_cost_per_day={"tokens": 10}),
)


# --- coverage: stages the coverage tests drive (their queues are consumed by a test's own
# worker only). An item's title says how its run ends.


def _cover(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    from coverage.models import MediaItem

    title = MediaItem.objects.get(id=params.item_id).title
    if title.startswith("transient"):
        raise TransientError(f"item {params.item_id} is busy")
    if title.startswith("permanent"):
        raise PermanentError(f"item {params.item_id} is unreadable")
    if title.startswith("skip-later"):
        return skipped("locked", retry_after=timedelta(minutes=10))
    if title.startswith("skip"):
        return skipped("no-cover")
    if title.startswith("slow"):
        for _ in range(300):
            ctx.raise_if_cancelled()
            time.sleep(0.1)
    return {"item": params.item_id, "stage": params.stage}


cover_probe = define_task(
    id="test-cover",
    resource_class="io",
    execute=_cover,
    input_model=CoverageItem,
    retry=Retry(max_attempts=1),
    processing_version=int(os.environ.get("TEST_COVER_VERSION", "1")),
    covers_stages=[
        CoveredStage(
            id="test-probe",
            applies_to=("movie", "episode"),
            eligible_sql=HAS_PRESENT_FILE,
            recover_when_additional_reasons=("no-cover",),
            invalidated_by=(
                "file.linked",
                "file.unlinked",
                "file.presence_changed",
                "item.metadata_changed",
            ),
        )
    ],
)


def _cover_batch(ctx: TaskContext, params: CoverageBatch) -> dict[str, Any]:
    return {"items": params.item_ids}


cover_batch = define_task(
    id="test-cover-batch",
    resource_class="io",
    execute=_cover_batch,
    input_model=CoverageBatch,
    covers_stages=[
        CoveredStage(id="test-albums", applies_to=("album",), per_item=False),
        CoveredStage(
            id="test-tracks",
            applies_to=("track",),
            per_item=False,
            enqueueable=False,
            # Divides by zero for a track of 1999: a real failure for the dispatcher tests.
            eligible_sql="100 / (coalesce(mi.year, 2000) - 1999) > 0",
            invalidated_by=("item.metadata_changed",),
        ),
    ],
)

cover_season = define_task(
    id="test-cover-season",
    resource_class="io",
    execute=_cover,
    input_model=CoverageItem,
    covers_stages=[
        CoveredStage(
            id="test-season",
            applies_to=("season",),
            invalidated_by=("children.changed",),
        ),
        CoveredStage(
            id="test-libraries",
            applies_to=("series",),
            eligible=lambda item: item.library == "TV",
            enqueueable=False,
        ),
    ],
)


class LoggerInput(BaseModel, extra="forbid"):
    lines: int = 10
    pause_s: float = 0.0


def _logger(ctx: TaskContext, params: LoggerInput) -> dict[str, int]:
    for n in range(params.lines):
        ctx.log(f"line {n}")
        if params.pause_s:
            time.sleep(params.pause_s)
    logging.getLogger("tests.logger").warning("through logging, at the end")
    return {"lines": params.lines}


logger_task = define_task(
    id="test-logger", resource_class="io", execute=_logger, input_model=LoggerInput
)


# A deaf handler (no progress) with its own stall limits: 2 s to fail, whatever the worker's.
sleepy_strict = define_task(
    id="test-sleepy-strict",
    resource_class="io",
    execute=_sleepy,
    input_model=SleepyInput,
    stall=Stall(warn=timedelta(seconds=1), fail=timedelta(seconds=2)),
)
# The same, counted alive while it runs (an ffmpeg-like call that cannot report progress).
sleepy_auto = define_task(
    id="test-sleepy-auto",
    resource_class="io",
    execute=_sleepy,
    input_model=SleepyInput,
    stall=Stall(auto=True),
)

# Two tasks sharing the io pool, each on its own queue (private: no shared worker takes them),
# recording the order they run in: tests/integration/test_fair_pools.py.
fair_a = define_task(
    id="test-fair-a", resource_class="io", execute=_record_order, input_model=LabelInput
)
fair_b = define_task(
    id="test-fair-b", resource_class="io", execute=_record_order, input_model=LabelInput
)


class CommandInput(BaseModel, extra="forbid"):
    seconds: float  # how long the command runs
    ignore_sigterm: bool = False  # python only: ffmpeg stops on SIGTERM
    # python: a script that prints its pid and sleeps; ffmpeg: a real encode of a test
    # pattern, read at its native rate (`-re`) so it lasts `seconds`, its progress parsed.
    program: Literal["python", "ffmpeg"] = "python"


# The script `test-command` runs for python; a test finds each attempt's command pid in the
# run's log ("started … (pid N)", as `ctx.run_process` writes it) and looks for it in /proc.
_COMMAND = (
    "import os, signal, sys, time\n"
    "if sys.argv[2] == 'deaf':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def _command_argv(params: CommandInput) -> list[str]:
    if params.program == "ffmpeg":
        source = f"testsrc=duration={params.seconds:g}:size=160x90:rate=10"
        return [
            "ffmpeg", "-nostdin", "-v", "error", "-re", "-f", "lavfi", "-i", source,
            "-f", "null", "-progress", "pipe:1", "-",
        ]  # fmt: skip
    return [
        sys.executable,
        "-c",
        _COMMAND,
        str(params.seconds),
        "deaf" if params.ignore_sigterm else "-",
    ]


def _ffmpeg_progress(ctx: TaskContext, seconds: float) -> Callable[[str], None]:
    """An `on_stdout` that reports `ffmpeg -progress pipe:1`'s out_time_us of `seconds`."""
    total_us = int(seconds * 1_000_000)

    def progress(line: str) -> None:
        key, _, value = line.partition("=")
        if key == "out_time_us" and value.isdigit():
            ctx.report_progress(min(int(value), total_us), total_us)

    return progress


def _command(ctx: TaskContext, params: CommandInput) -> dict[str, int]:
    result = ctx.run_process(
        _command_argv(params),
        cwd=tempfile.gettempdir(),
        on_stdout=_ffmpeg_progress(ctx, params.seconds),
        grace_s=1.0,
    )
    return {"exit_code": result.exit_code}


# A handler whose work is a command (an ffmpeg stand-in): issue 23's ends of a run.
command = define_task(
    id="test-command",
    resource_class="io",
    execute=_command,
    input_model=CommandInput,
    stall=Stall(auto=True),
    retry=Retry(max_attempts=3, base=timedelta(seconds=1)),
)
# Watched for stalls: a command's output lines count as progress, a silent one stalls.
command_watched = define_task(
    id="test-command-watched",
    resource_class="io",
    execute=_command,
    input_model=CommandInput,
    stall=Stall(warn=timedelta(seconds=1), fail=timedelta(seconds=3)),
    retry=Retry(max_attempts=1),
)
command_timeout = define_task(
    id="test-command-timeout",
    resource_class="io",
    execute=_command,
    input_model=CommandInput,
    stall=Stall(auto=True),
    timeout=Timeout(soft=timedelta(seconds=2), hard=timedelta(seconds=3)),
)


class DebouncedInput(BaseModel, extra="forbid"):
    key: str
    n: int


DEBOUNCED_KEY = "test:debounced"


def _record_debounced(ctx: TaskContext, params: DebouncedInput) -> None:
    valkey.client().rpush(DEBOUNCED_KEY, f"{params.key}:{params.n}")


# Bursts of starts of one key make one run, with the last start's input (issue 39).
debounced = define_task(
    id="test-debounced",
    resource_class="io",
    execute=_record_debounced,
    input_model=DebouncedInput,
    identity_for=lambda params: params.key,
    debounce=Debounce(period_s=1, max_wait_s=3),
)


# At most one run per identity (its input's digest) per 2 s (issue 39).
throttled = define_task(
    id="test-throttled", resource_class="io", execute=_noop, throttle=Throttle(period_s=2)
)


FOLLOW_UP_KEY = "test:follow-up"  # one JSON entry per handler call: key, n, pid, run
FOLLOW_UP_GATE = "test:follow-up:gate"  # while it exists, a handler waits (up to 20 s)


def _follow_up(ctx: TaskContext, params: DebouncedInput) -> None:
    client = valkey.client()
    entry = {"key": params.key, "n": params.n, "pid": os.getpid(), "run": ctx.run_id}
    client.rpush(FOLLOW_UP_KEY, json.dumps(entry))
    deadline = time.monotonic() + 20
    while client.exists(FOLLOW_UP_GATE) and time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.05)


# A start that meets the running run of its key records one follow-up (issue 39).
follow_up = define_task(
    id="test-follow-up",
    resource_class="io",
    execute=_follow_up,
    input_model=DebouncedInput,
    identity_for=lambda params: params.key,
    while_active="follow_up",
)


class KeyedInput(BaseModel, extra="forbid"):
    library: str
    n: int
    seconds: float = 0.0


KEYED_STARTS_KEY = "test:keyed:starts"  # one JSON entry per handler call, in the order of calls


def _keyed(ctx: TaskContext, params: KeyedInput) -> None:
    entry = {"run": ctx.run_id, "library": params.library, "n": params.n, "pid": os.getpid()}
    valkey.client().rpush(KEYED_STARTS_KEY, json.dumps({**entry, "at_ms": _server_ms()}))
    time.sleep(params.seconds)


# Two runs at once per library, libraries taking turns (issue 39); a short lease (hard timeout
# 4 s + the lease margin) for the killed-holder test.
keyed_runs = define_task(
    id="test-keyed",
    resource_class="io",
    execute=_keyed,
    input_model=KeyedInput,
    concurrency=Concurrency(key=lambda params: params.library, max=2),
    timeout=Timeout(soft=timedelta(seconds=3), hard=timedelta(seconds=4)),
)


def _bad_key(params: KeyedInput) -> str:
    if params.library == "broken":
        raise ValueError("no such library")
    return params.library


# A key function that fails on some inputs: their starts are refused (issue 39).
keyed_badly = define_task(
    id="test-keyed-bad-key",
    resource_class="io",
    execute=_keyed,
    input_model=KeyedInput,
    concurrency=Concurrency(key=_bad_key, max=1),
)


# Named limits (issue 39, tests/integration/test_named_limits.py): a rate two tasks share, one
# run at a time per library inside handlers, and one that gives up waiting at once.
shared_rate = define_limit("test-shared-rate", rate="40/10s")
per_library = define_limit("test-per-library", concurrency=1, key=lambda params: params.library)
impatient = define_limit("test-impatient", concurrency=1, wait_s=0.2)
LIMITED_KEY = "test:limited"  # one JSON entry per handler event: run, what, library, at_ms


def _note(ctx: TaskContext, params: KeyedInput, what: str) -> None:
    entry = {"run": ctx.run_id, "what": what, "library": params.library, "at_ms": _server_ms()}
    valkey.client().rpush(LIMITED_KEY, json.dumps(entry))


def _rated(ctx: TaskContext, params: KeyedInput) -> None:
    _note(ctx, params, "start")


rated_a = define_task(
    id="test-rated-a",
    resource_class="io",
    execute=_rated,
    input_model=KeyedInput,
    limits=("test-shared-rate",),
)
rated_b = define_task(
    id="test-rated-b",
    resource_class="io",
    execute=_rated,
    input_model=KeyedInput,
    limits=("test-shared-rate",),
)


def _library_key(params: KeyedInput) -> str:
    if not params.library:
        raise ValueError("no library")
    return params.library


# A limit whose key function fails on an empty library: such a start is refused (a 422).
keyed_rate = define_limit("test-keyed-rate", rate="100/s", key=_library_key)
rated_by_key = define_task(
    id="test-rated-by-key",
    resource_class="io",
    execute=_rated,
    input_model=KeyedInput,
    limits=("test-keyed-rate",),
)


one_at_a_time = define_limit("test-one-at-a-time", concurrency=1)


def _hold_limit(ctx: TaskContext, params: KeyedInput) -> None:
    _note(ctx, params, "start")
    time.sleep(params.seconds)


# Takes the one place of its limit at pickup: a second run waits for it.
limited_pickup = define_task(
    id="test-limited-pickup",
    resource_class="io",
    execute=_hold_limit,
    input_model=KeyedInput,
    limits=("test-one-at-a-time",),
)


def _in_limit(ctx: TaskContext, params: KeyedInput) -> None:
    name = "test-impatient" if params.n < 0 else "test-per-library"
    with ctx.limit(name):
        _note(ctx, params, "enter")
        time.sleep(params.seconds)
        _note(ctx, params, "exit")


# Takes a limit inside its handler: per library, or the impatient one for a negative n.
in_limit = define_task(
    id="test-in-limit", resource_class="io", execute=_in_limit, input_model=KeyedInput
)


# Inbound triggers (tests/integration/test_triggers.py): one onto a parked task, whose runs
# stay pending, and one onto a task the shared worker runs.
parked_trigger = define_trigger(
    name="test-parked-hook",
    task="test-record-order",
    input_from=lambda body: {"label": body["label"]},
)
noop_trigger = define_trigger(
    name="test-noop-hook", task="test-noop", input_from=lambda body: {}, priority=5
)
