"""Per-task circuit breaker: stops starting a task that keeps failing, then tests it with one run.

A `RunHook`, in the chain of `orchestrator.apps.hook_chain` before the quota so that a refused
start takes no quota unit.

- **closed**: every start is admitted. A counted failure adds one to the task's consecutive
  count and to its failure window; a success resets the consecutive count (not the window).
  The circuit opens at LUMASTRA_CIRCUIT_FAILURE_THRESHOLD consecutive counted failures
  (default 5), or at 10 counted failures within 30 minutes, successes in between or not.
- **open**: starts are refused with `CircuitOpen` (code `circuit_open`, HTTP 503, `retry_after`
  = the time to half-open; the message names the task and when it half-opens). It stays open
  1 min the first time, then 5 min, 30 min and 2 h for each reopening in a row (saturating).
- **half-open**, once that time has passed: the next start is admitted as the probe; the slot
  is taken in one Lua script, so across processes exactly one start gets it, and the others
  are refused while it is held. The probe's success closes the circuit and resets everything
  (counts, window, backoff); its counted failure reopens it for the next backoff step; an
  outcome that counts neither way frees the slot for another probe.

Which outcomes count, once per run (`Outcome.final` is False for an attempt that will be
retried; such attempts are ignored, so retries of one run count once):

- failure: `fatal`, `internal` (an unexpected exception), `timeout`, `stalled`, `worker_lost`
  (the process running it died: `os._exit`, the OOM killer — poison payloads), and
  `transient` once the run's attempts are exhausted — each says the task, or something it
  depends on, is broken. An operator's kill of a worker also ends its runs as `worker_lost`;
  it takes LUMASTRA_CIRCUIT_FAILURE_THRESHOLD such ends of one task in a row to open it.
  `orphaned` (a whole worker host went silent) does not count: it says nothing of the task.
- neither: `permanent` and `validation` (this input is bad, not the task), `cancelled`
  (someone asked), `stale_version` (a deploy artefact). They do not reset the count either.
- success: `completed`.

Probe slot: taken at admission for PROBE_PROVISIONAL_TTL (30 s), long enough for start_run's
transaction to commit; on commit, and again when a worker claims the probe, it is extended to
the task's hard timeout. The probe's message says it is the probe (`Admission.notes`), so a
pickup asks Valkey about the slot only for that run, never for the runs of a closed circuit.
A start refused by a later hook gives the slot back (`abandoned`); a probe that never
reports (its worker died, its caller's transaction rolled back) holds it until it expires,
and then another start becomes the probe.

Operators: `force_enable(task_id, actor=...)` closes the circuit, resets counts and backoff,
and keeps it admitting for LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S (default 24 h). Failures in
that time are counted but do not open it; after it, the next counted failure is judged by the
normal rules on the counts gathered meanwhile. `status` and `statuses` read the state for the
admin and the API.

Storage: one Valkey hash per task (`keys.circuit`), changed only by `lua/circuit_*.lua`, is
authoritative for admission. After each change the whole hash is upserted into
`task_circuit_state` (ordered by the hash's version, so racing upserts never go backwards); a
probe's admission is copied to Postgres when its start commits. A missing hash (Valkey restarted or
flushed) is rebuilt from that row, or created closed when there is none, by the first call
that needs it. Admitting to a closed circuit and recording a success that changes nothing
write nothing, and a run that completes while its circuit is closed with no failure counted in
a row is not even told to this hook: the end's own script (`end_run.lua`) reads the hash and
asks for this hook only when the end would change it (`RunHook.excused_at_end`).

Not guaranteed:
- The probe slot is not copied to Postgres: after Valkey lost the hash, a probe in flight may
  be joined by a second one, and its outcome then counts like any other run's. So does the
  outcome of a probe whose slot expired before it reported (a start stuck in a caller's
  transaction for more than 30 s, or a queue wait longer than the hard timeout). A probe
  published again (its retry, or its worker lost) no longer says it is the probe: its slot is
  not extended at that pickup.
- Runs admitted before the circuit opened still run; their outcomes update the counts, but
  only the probe closes or reopens the circuit.
- A change whose Postgres upsert failed (Postgres unreachable), or whose start rolled back, is
  missing from the Postgres copy until the next change; if Valkey is lost meanwhile, so is the
  change.
- A failure reported twice for one run (`finished` is retried) counts once only while it is
  among the newest 10 counted failures of the window.
- Time is each process's clock: hosts whose clocks disagree shift backoffs and the window.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import Any, ClassVar, cast

from django.conf import settings
from redis.client import Pipeline
from redis.exceptions import NoScriptError, ResponseError

from orchestrator.clock import SYSTEM, Clock, describe, span_ms
from orchestrator.hooks import circuit_copy
from orchestrator.hooks.base import Admission, Outcome, Part, Pickup, Refused, RunHook
from orchestrator.hooks.circuit_copy import CircuitHash
from orchestrator.models import CircuitState, TaskCircuitState
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.errors import ErrorKind
from tasks.registry import UnknownTaskError

log = logging.getLogger(__name__)

WINDOW = timedelta(minutes=30)
WINDOW_FAILURES = 10
# How long it stays open the 1st, 2nd, 3rd, 4th and every later time it opens in a row.
BACKOFF = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
)
PROBE_PROVISIONAL_TTL = timedelta(seconds=30)
# The note on a probe's message (`Admission.notes`) that has its pickup extend the slot.
PROBE_NOTE = "circuit_probe"
# A probe usually ends long before its slot expires; callers refused meanwhile come back sooner.
BUSY_RETRY_AFTER = timedelta(minutes=1)

COUNTED_FAILURES = frozenset(
    {
        ErrorKind.FATAL,
        ErrorKind.INTERNAL,
        ErrorKind.TIMEOUT,
        ErrorKind.TRANSIENT,
        ErrorKind.STALLED,
        ErrorKind.WORKER_LOST,
    }
)


class Verdict(Enum):
    SUCCESS = "success"  # resets the consecutive count; a probe's closes the circuit
    FAILURE = "failure"  # counts toward opening; a probe's reopens the circuit
    NEUTRAL = "neutral"  # says nothing about the task; a probe's frees its slot


class CircuitOpen(Refused):
    code = "circuit_open"
    http_status = 503


@dataclass(frozen=True)
class CircuitStatus:
    task_id: str
    state: CircuitState  # an open circuit whose backoff has passed reads as half-open
    consecutive_failures: int
    reopen_count: int
    opened_at: datetime | None
    half_open_at: datetime | None
    time_to_half_open: timedelta | None  # only while open
    forced_until: datetime | None  # only while a force-enable is in effect
    forced_by: str | None  # only while a force-enable is in effect
    probe_run_id: str | None  # the half-open probe holding the slot, if any


def verdict(outcome: Outcome) -> Verdict:
    """What one run's final outcome says about its task (see the module docstring)."""
    if outcome.state == RunState.COMPLETED:
        return Verdict.SUCCESS
    if outcome.state == RunState.FAILED and outcome.error_kind in COUNTED_FAILURES:
        return Verdict.FAILURE
    return Verdict.NEUTRAL


@dataclass
class CircuitBreaker(RunHook):
    name: str = "circuit"
    clock: Clock = SYSTEM
    # Only the probe's message carries the note; a closed circuit admits without a word, and
    # a run completed on it with no failure in a row changes nothing: the start's and the
    # end's own scripts say so (`admit_run.lua`, `end_run.lua`).
    pickup_note: ClassVar[str | None] = PROBE_NOTE
    excused_at_admission: ClassVar[bool] = True
    excused_at_end: ClassVar[bool] = True

    def plan_admit(self, admission: Admission) -> Part:
        task_id = admission.definition.id
        now = self.clock.now()
        args: list[object] = [valkey.to_ms(now), admission.run_id, span_ms(PROBE_PROVISIONAL_TTL)]

        def receive(replies: list[Any]) -> None:
            reply = _replied("circuit_admit", task_id, args, replies[0], self.clock)
            answer = reply[0]
            if answer == "closed":
                return
            circuit = _hash(reply[1:])
            if answer == "probe" and admission.not_before is not None:
                # A probe must run now, not in days: the slot goes back for the next start.
                _set_probe_expiry(task_id, admission.run_id, 0)
                raise _refusal(task_id, "busy", circuit, now)
            if answer == "probe":
                admission.notes[PROBE_NOTE] = True
                log.info(
                    "run %s: admitted as the probe of task %s's circuit", admission.run_id, task_id
                )
                admission.committed.append(partial(self._probe_committed, admission, circuit))
                return
            raise _refusal(task_id, answer, circuit, now)

        return Part(receive, partial(_queue, "circuit_admit", task_id, args))

    def _probe_committed(self, admission: Admission, circuit: CircuitHash) -> None:
        # Runs after start_run returned its run: a failure here is logged, not raised, and
        # the provisional slot expiry still bounds its effect.
        try:
            expiry = self.clock.now() + admission.definition.timeout.hard
            _set_probe_expiry(admission.definition.id, admission.run_id, valkey.to_ms(expiry))
            circuit_copy.persist(admission.definition.id, circuit)
        except Exception:
            log.exception("run %s: could not confirm its circuit probe slot", admission.run_id)

    def abandoned(self, admission: Admission) -> None:
        _set_probe_expiry(admission.definition.id, admission.run_id, 0)

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        # A probe that waited in its queue still gets its whole hard timeout to run; any
        # other run (every run while the circuit is closed) sends nothing at pickup.
        if not pickup.notes.get(PROBE_NOTE):
            return None
        expiry = self.clock.now() + pickup.definition.timeout.hard
        args: list[object] = [pickup.run_id, valkey.to_ms(expiry)]
        key = [keys.circuit(pickup.definition.id)]

        def receive(replies: list[Any]) -> None:
            valkey.script_replied("circuit_probe", key, args, replies[0])

        return Part(receive, lambda pipe: valkey.queue_script(pipe, "circuit_probe", key, args))

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if not outcome.final:
            return None
        task_id = outcome.definition.id
        args = _record_args(self.clock.now(), outcome.run_id, verdict(outcome))

        def receive(replies: list[Any]) -> None:
            reply = _replied("circuit_record", task_id, args, replies[0], self.clock)
            _recorded(task_id, outcome.run_id, reply)

        return Part(receive, partial(_queue, "circuit_record", task_id, args))


# --- calls that are not runs ----------------------------------------------------------------


def admit_call(owner: str, call_id: str, hold: timedelta, *, clock: Clock = SYSTEM) -> None:
    """Admit one call of a circuit's owner that is not a task (a provider's call,
    `orchestrator.providers`, owner `provider:<id>`), by the tasks' rules: raises CircuitOpen
    while the circuit refuses; a half-open circuit admits it as its probe, its slot held for
    `hold`."""
    now = clock.now()
    reply = _call("circuit_admit", owner, [valkey.to_ms(now), call_id, span_ms(hold)], clock)
    if reply[0] not in ("closed", "probe"):
        raise _refusal(owner, reply[0], _hash(reply[1:]), now)


def record_call(owner: str, call_id: str, said: Verdict, *, clock: Clock = SYSTEM) -> None:
    """An admitted call's outcome, counted as a run's final one is."""
    args = _record_args(clock.now(), call_id, said)
    _recorded(owner, call_id, _call("circuit_record", owner, args, clock))


def _record_args(now: datetime, by: str, said: Verdict) -> list[object]:
    return [
        valkey.to_ms(now),
        by,
        said.value,
        settings.CONFIG.circuit_failure_threshold,
        span_ms(WINDOW),
        WINDOW_FAILURES,
        *(span_ms(step) for step in BACKOFF),
    ]


def _recorded(owner: str, by: str, reply: list[str]) -> None:
    event = reply[0]
    if event == "unchanged":
        return
    circuit = _hash(reply[1:])
    circuit_copy.persist(owner, circuit)
    if event in ("opened", "reopened"):
        log.warning(
            "%s: circuit %s by %s (%s consecutive failures, %s times in a row); half-opens at %s",
            _named(owner),
            event,
            by,
            circuit.get("consecutive"),
            circuit.get("reopen_count"),
            circuit_copy.moment_of(circuit.get("half_open_at")),
        )
    elif event == "closed":
        log.info("%s: circuit closed by its probe %s", _named(owner), by)


def force_enable(task_id: str, *, actor: str, clock: Clock = SYSTEM) -> CircuitStatus:
    """Close `task_id`'s circuit and keep it admitting for LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S."""
    if task_id not in registry.get():
        raise UnknownTaskError(task_id)
    if not actor.strip():
        raise ValueError("force_enable needs the name of the operator forcing it")
    now = clock.now()
    until = now + timedelta(seconds=settings.CONFIG.circuit_force_enable_ttl_s)
    circuit = _hash(
        _call("circuit_force", task_id, [valkey.to_ms(now), valkey.to_ms(until), actor], clock)
    )
    circuit_copy.persist(task_id, circuit)
    log.warning("task %s: circuit force-enabled by %s until %s", task_id, actor, until)
    return _status(task_id, circuit, now)


def status(task_id: str, *, clock: Clock = SYSTEM) -> CircuitStatus:
    """The circuit of one task as the admin and the API show it."""
    return statuses([task_id], clock=clock)[task_id]


def statuses(task_ids: Iterable[str], *, clock: Clock = SYSTEM) -> dict[str, CircuitStatus]:
    """Circuits of several tasks in one Valkey round trip (and one query for lost hashes).

    Read-only: a task whose hash is missing is shown from its Postgres row, or as closed.
    """
    ids = list(dict.fromkeys(task_ids))
    pipe = valkey.client().pipeline(transaction=False)
    for task_id in ids:
        pipe.hgetall(keys.circuit(task_id))
    found: dict[str, CircuitHash] = dict(zip(ids, valkey.execute(pipe), strict=True))
    missing = [task_id for task_id, circuit in found.items() if not circuit]
    if missing:
        for row in TaskCircuitState.objects.filter(task_id__in=missing):
            found[row.task_id] = circuit_copy.from_row(row)
    now = clock.now()
    return {task_id: _status(task_id, found[task_id], now) for task_id in ids}


# --- Valkey ---------------------------------------------------------------------------------


def _queue(name: str, task_id: str, args: Sequence[object], pipe: Pipeline) -> None:
    valkey.queue_script(pipe, name, [keys.circuit(task_id)], list(args))


def _replied(
    name: str, task_id: str, args: Sequence[object], reply: Any, clock: Clock
) -> list[str]:
    """The reply of a `_queue`d circuit script; a missing hash is rebuilt and the script rerun."""
    if isinstance(reply, NoScriptError):
        # Valkey restarted or flushed its scripts: the script did not run. Alone, it is loaded
        # and may still find no hash (a restart without AOF loses both).
        return _call(name, task_id, args, clock)
    if isinstance(reply, ResponseError) and str(reply) == "NO_CIRCUIT":
        circuit_copy.restore(task_id, clock)
        reply = valkey.script(name, [keys.circuit(task_id)], list(args))
    return cast(list[str], valkey.script_replied(name, [keys.circuit(task_id)], list(args), reply))


def _call(name: str, task_id: str, args: Sequence[object], clock: Clock) -> list[str]:
    """Run a circuit script; a missing hash is rebuilt from Postgres and the script rerun."""
    key = keys.circuit(task_id)
    try:
        return cast(list[str], valkey.script(name, [key], list(args)))
    except ResponseError as exc:
        if str(exc) != "NO_CIRCUIT":
            raise
    circuit_copy.restore(task_id, clock)
    return cast(list[str], valkey.script(name, [key], list(args)))


def _set_probe_expiry(task_id: str, run_id: str, expiry_ms: int) -> None:
    """Move the expiry of `run_id`'s probe slot (0 frees it); a no-op for any other run."""
    valkey.script("circuit_probe", [keys.circuit(task_id)], [run_id, expiry_ms])


def _hash(flat: Sequence[str]) -> CircuitHash:
    return cast(CircuitHash, dict(zip(flat[::2], flat[1::2], strict=True)))


# --- reading --------------------------------------------------------------------------------


def _status(task_id: str, circuit: CircuitHash, now: datetime) -> CircuitStatus:
    state = CircuitState(circuit.get("state") or CircuitState.CLOSED)
    half_open_at = circuit_copy.moment_of(circuit.get("half_open_at"))
    if state == CircuitState.OPEN and half_open_at is not None and half_open_at <= now:
        state = CircuitState.HALF_OPEN
    forced_until = circuit_copy.moment_of(circuit.get("forced_until"))
    forced = forced_until is not None and forced_until > now
    probe_until = circuit_copy.moment_of(circuit.get("probe_until"))
    probing = state == CircuitState.HALF_OPEN and probe_until is not None and probe_until > now
    return CircuitStatus(
        task_id=task_id,
        state=state,
        consecutive_failures=int(circuit.get("consecutive") or 0),
        reopen_count=int(circuit.get("reopen_count") or 0),
        opened_at=circuit_copy.moment_of(circuit.get("opened_at")),
        half_open_at=half_open_at,
        time_to_half_open=(
            half_open_at - now if state == CircuitState.OPEN and half_open_at else None
        ),
        forced_until=forced_until if forced else None,
        forced_by=circuit.get("forced_by") if forced else None,
        probe_run_id=(circuit.get("probe_run") or None) if probing else None,
    )


def _refusal(task_id: str, answer: str, circuit: CircuitHash, now: datetime) -> CircuitOpen:
    if answer == "busy":
        probe_until = circuit_copy.moment_of(circuit.get("probe_until")) or now
        return CircuitOpen(
            f"{_named(task_id)} refused: its circuit is half-open and probe run "
            f"{circuit.get('probe_run')} is testing it; starts are admitted again once that "
            f"run succeeds (its probe slot expires at {probe_until.isoformat()})",
            retry_after=min(probe_until - now, BUSY_RETRY_AFTER),
        )
    half_open_at = circuit_copy.moment_of(circuit.get("half_open_at")) or now
    opened_at = circuit_copy.moment_of(circuit.get("opened_at"))
    return CircuitOpen(
        f"{_named(task_id)} refused: its circuit opened at "
        f"{opened_at.isoformat() if opened_at else '?'} after repeated failures "
        f"({circuit.get('consecutive', '0')} in a row, "
        f"{len(circuit_copy.recent_failures(circuit.get('recent', '')))} in the last "
        f"{describe(WINDOW)}); "
        f"it half-opens at {half_open_at.isoformat()} (in {describe(half_open_at - now)})",
        retry_after=half_open_at - now,
    )


def _named(owner: str) -> str:
    kind, _, name = owner.rpartition(":")
    return f"{kind or 'task'} {name!r}"
