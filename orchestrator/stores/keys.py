"""Every Valkey key name the system uses. No key literal lives anywhere else.

The broker's list names are kombu's, reproduced here so depth checks and shedding can read
them: kombu's Redis transport keeps each priority of a queue in its own list.

Keys live in the DB the deployment's URL selects, but pub/sub channels are the server's: a
PUBLISH reaches every subscriber of the server whatever DB either selected. So every channel
name begins with the deployment's namespace (`_channel`, LUMASTRA_NAMESPACE), and two
deployments sharing a server on different DBs never hear each other.
"""

from __future__ import annotations

from django.conf import settings

# kombu's Redis transport: the separator of priority sub-queues, and our priority steps.
BROKER_PRIORITY_SEPARATOR: str = "\x06\x16"
BROKER_PRIORITY_STEPS: tuple[int, ...] = (1, 2, 3, 5, 7)


# kombu's Redis transport (Channel.unacked_key): the hash of messages workers have taken and
# not yet acknowledged, delivery tag → JSON [message, exchange, routing key]. With acks_late a
# running run's message waits here, and so does a delayed (countdown) message a worker holds.
BROKER_UNACKED = "unacked"
# kombu's Redis transport (Channel.unacked_index_key): sorted set, delivery tag → when the
# worker took the message (the worker's clock, seconds since the epoch).
BROKER_UNACKED_INDEX = "unacked_index"


def broker_queue(queue: str, priority: int) -> str:
    """The broker list holding `queue`'s messages of one priority step."""
    return f"{queue}{BROKER_PRIORITY_SEPARATOR}{priority}"


def run_active(run_id: str) -> str:
    return f"task:run:active:{run_id}"


def run_terminal(run_id: str) -> str:
    return f"task:run:terminal:{run_id}"


def run_reseeded(run_id: str) -> str:
    """Set while a live hash seeded again after Valkey lost it settles (`live.reseed`)."""
    return f"task:run:reseeded:{run_id}"


def identity(task_id: str, formula: str) -> str:
    return f"task:identity:{task_id}:{formula}"


def throttle(task_id: str, identity: str) -> str:
    """String: the run a throttled task's identity started this period (`hooks.throttle`),
    expiring with the period."""
    return f"task:throttle:{task_id}:{identity}"


def run_log(run_id: str) -> str:
    return f"task:log:{run_id}"


def run_log_seq(run_id: str) -> str:
    """The last sequence number given to a line of the run's log."""
    return f"task:log:{run_id}:seq"


def metrics(family: str) -> str:
    """A cluster-wide counter family for /metrics (`stores.counters`)."""
    return f"metrics:{family}"


def _channel(name: str) -> str:
    """A pub/sub channel of this deployment: `<namespace>:<name>` (`<ns>:` in docstrings)."""
    return f"{settings.CONFIG.namespace}:{name}"


def run_events() -> str:
    """Pub/sub: runs' live events (progress, stage moves) for `GET /events` followers."""
    return _channel("task:events")


def run_ended(run_id: str) -> str:
    """Pub/sub: the run ended (the message is its terminal state); `runs.wait` listens."""
    return _channel(f"task:ended:{run_id}")


def run_log_feed(run_id: str) -> str:
    """Pub/sub: a run's log grew (the message is the last line's sequence number)."""
    return _channel(f"task:logfeed:{run_id}")


def cancel_channel(owner: str) -> str:
    """Pub/sub: one worker process's cancel channel, named by its instance id (what a claimed
    run's live hash holds as `owner`); the process's run watch listens on it for its whole
    life (`runs.watch`). Each message names one run (`cancel_message`): "cancel <runId>" asks
    the run's handler to stop (request_cancel.lua, which appends the owner to
    `cancel_channel_prefix()`), "kill <runId>" tells its watch not to wait for it."""
    return cancel_channel_prefix() + owner


def cancel_channel_prefix() -> str:
    """What every process's cancel channel begins with: `cancel_channel(owner)` is this
    followed by the owner, which is how request_cancel.lua names the channel of the owner it
    reads from the run's hash."""
    return _channel("task:cancel:")


CANCEL = "cancel"
CANCEL_KILL = "kill"
CANCEL_STOP = "stop"  # a run window closed (on_close="stop"): stop and go back to pending


def cancel_message(run_id: str, *, kill: bool = False, stop: bool = False) -> str:
    """A message on a cancel channel: "cancel <runId>", "kill <runId>" or "stop <runId>"
    (request_cancel.lua writes the first the same way)."""
    return f"{CANCEL_KILL if kill else CANCEL_STOP if stop else CANCEL} {run_id}"


def read_cancel_message(data: object) -> tuple[str, str] | None:
    """(run id, verb) of a cancel channel's message; None if it is not one."""
    verb, _, run_id = str(data).partition(" ")
    if verb not in (CANCEL, CANCEL_KILL, CANCEL_STOP) or not run_id:
        return None
    return run_id, verb


def orchestrator_lock(name: str) -> str:
    """A `LoopLock`'s key (`cluster.locks`); the one in use is the leader's, `lock:orch:cluster`."""
    return f"lock:orch:{name}"


def scheduler_lock(task_id: str, bucket: str) -> str:
    return f"lock:scheduler:{task_id}:{bucket}"


def cluster_node(instance_id: str) -> str:
    return f"cluster:node:{instance_id}"


def refusals(task_id: str, day: str) -> str:
    """Hash of refusal code → count for one task and UTC day (YYYY-MM-DD)."""
    return f"task:refusals:{task_id}:{day}"


def cost_day(task_id: str, day: str) -> str:
    """Hash of cost kind → units one task spent on one UTC day (YYYY-MM-DD), rolled up into
    task_quota_usage.cost (orchestrator/hooks/costs.py)."""
    return f"task:cost:{task_id}:{day}"


def quota_counts(task_id: str, day: str) -> str:
    """Hash of started / completed / failed → count for one task without a daily cap and one
    UTC day (YYYY-MM-DD), rolled up into task_quota_usage (orchestrator/hooks/quotas.py)."""
    return f"task:quota:{task_id}:{day}"


def circuit(owner: str) -> str:
    """Hash of one task's circuit breaker state (orchestrator/hooks/circuit.py), or a
    provider's (owner `provider:<id>`: a task id holds no colon); no TTL."""
    return f"task:circuit:{owner}"


def pauses() -> str:
    """Hash of `<scope>:<name>` (`pause_field`) → `hold` or `refuse`: the pauses in force, a
    mirror of `task_pause` (orchestrator/hooks/pause.py), and `window` for a closed run window
    (`orchestrator.windows`); rebuilt by the leader's windows loop; no TTL."""
    return "task:paused"


def window_releases() -> str:
    """Set of the `pauses()` fields whose run window opened and whose held runs are not all
    published yet (`recovery.windows`): added in the same MULTI that clears the field, removed
    once the release went through, so a release that failed is tried again; no TTL."""
    return "task:window:releases"


def pause_field(scope: str, name: str) -> str:
    """A field of `pauses()`: scope `task` or `class`, and the task id or class name."""
    return f"{scope}:{name}"


def concurrency_holders(task_id: str) -> str:
    """Sorted set of `<runId>|<owner>` → lease expiry (ms, Valkey's clock): runs holding a slot."""
    return f"task:concurrency:{task_id}:holders"


def concurrency_waiters(task_id: str) -> str:
    """Sorted set of run id → when it first found no slot (ms): the waiting line, oldest first."""
    return f"task:concurrency:{task_id}:waiters"


def concurrency_postponed(task_id: str) -> str:
    """Hash of run id → `<postponements>:<last seen ms>` for the runs in the waiting line."""
    return f"task:concurrency:{task_id}:postponed"


def keyed(task_id: str) -> list[str]:
    """The keys of a task's keyed concurrency (`hooks.keyed`, `lua/keyed.lua`), in the script's
    order: the registered runs (hash run id → `<version>\t<member>\t<jobId>`), the waiting runs
    (members `<key>\n<priority><first wait ms>\n<runId>`, scores 0: ordered by key, then
    priority, then age), the holders (`<key>\n<runId>|<owner>` → lease expiry, ms), the same
    holders by key (scores 0, counted by lex range), and each key's dispatched run (hash key →
    `<runId>\t<when, ms>`; its field `\n` is where the last sweep stopped)."""
    base = f"task:keyed:{task_id}"
    return [f"{base}:runs", f"{base}:waiting", f"{base}:holders", f"{base}:held", f"{base}:queued"]


def limit(limit_id: str, key: str) -> list[str]:
    """The keys of one key of a named limit (`hooks.limits`, `lua/limit_take.lua`), in the
    script's order: its rate's window (sorted set `<token>#<unit>` → admission, ms), its
    holders (the same → lease expiry, ms), the limit's keys seen (key → last use, ms) and the
    limit's waiting runs (`<key>\n<runId>` → when it last found no room, ms)."""
    return [
        f"limit:{limit_id}:{key}:window",
        f"limit:{limit_id}:{key}:holders",
        f"limit:{limit_id}:keys",
        f"limit:{limit_id}:waiting",
    ]


def rate_window(task_id: str) -> str:
    """Sorted set of `<runId>|<owner>` → admission time (ms, Valkey's clock) within the window."""
    return f"task:ratelimit:{task_id}"


def drain_pending() -> str:
    """List of terminal writes Postgres refused on a transient error, waiting for replay
    (orchestrator/runs/drain.py, replayed by orchestrator/recovery/drain_replay.py): pushed on the
    left, replayed from the right; bounded."""
    return "task:drain:pending"


def drain_inflight() -> str:
    """List of the drain entries the replayer holding the drain lock is applying right now."""
    return "task:drain:inflight"


def drain_poison() -> str:
    """List of drain entries that failed too often, newest first, kept for an operator."""
    return "task:drain:poison"


def drain_failures() -> str:
    """Counter of drain replay passes that failed in a row (resets after a clean pass)."""
    return "task:drain:failures"


def drain_backoff() -> str:
    """Present (with a PX lease) while drain replays back off after failed passes."""
    return "task:drain:backoff"


def auth_failures(address: str) -> str:
    """Counter of failed sign-ins (API tokens and the admin login) from one client address in
    the current window (orchestrator/api/throttle.py); expires when the window ends."""
    return f"auth:failures:{address}"


def trigger_signature(trigger: str, digest: str) -> str:
    """An inbound trigger's signed request already accepted (SET NX), kept while its timestamp
    is within the tolerance (`webhooks.inbound`): the same request again is a replay."""
    return f"trigger:seen:{trigger}:{digest}"


def poison_noticed() -> str:
    """The drain poison list's length when the notification loop last looked
    (`notifications.delivery`): it notifies each growth once."""
    return "notify:poison:noticed"


def provider_answer(provider_id: str, query_digest: str) -> str:
    """A provider's answer to one query (`orchestrator.providers`), with when it was fetched;
    only the cache Valkey holds these keys."""
    return f"cache:provider:{provider_id}:{query_digest}"


def provider_latency(provider_id: str) -> str:
    """List of a provider's newest fetch latencies (ms), newest first, capped: its p50/p95."""
    return f"provider:latency:{provider_id}"


def cached(read_model: str) -> str:
    """A read model kept in the cache Valkey (`stores.cache`), e.g. `metrics`: the last /metrics
    body. Only the cache Valkey holds these keys."""
    return f"cache:{read_model}"
