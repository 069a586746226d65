"""The drain's poison list: entries no replay could apply, kept for an operator.

An entry is poisoned after MAX_ATTEMPTS transient failures, on any other error, or when it
cannot be read (`drain_replay`). It moves to `task:drain:poison`, newest first, at most
POISON_CAP. `poisoned()` lists them for the admin's Dead letters page, `replay_poisoned()`
puts one back on the pending list (attempts from zero, once the cause is fixed) and
`discard_poisoned()` drops one. A poisoned entry's run is still `active` in Postgres: the
reconciler ends it as an orphan, or tries a poisoned stage again; the record keeps what the
handler produced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, cast

from django.utils import timezone

from orchestrator.runs.drain import MAX_ENTRIES, Entry
from orchestrator.stores import keys, valkey

log = logging.getLogger(__name__)

POISON_CAP = 10_000


@dataclass(frozen=True)
class PoisonedEntry:
    """One entry an operator must look at; `raw` is what was pushed, as it was pushed."""

    raw: str
    run_id: str
    target: str
    attempts: int
    error: str
    poisoned_at: str
    # Names the record for replay_poisoned / discard_poisoned (a digest of the record).
    record_id: str = ""
    # False for an entry that could not be read: it can only be discarded.
    replayable: bool = False


class PoisonGone(LookupError):
    """The poisoned record is no longer listed (replayed or discarded by someone else)."""


class NotReplayable(ValueError):
    """The poisoned record holds no readable entry (it can only be discarded)."""


class DrainFull(RuntimeError):
    """The pending list is at MAX_ENTRIES: a replayed entry would not fit."""


def poisoned(limit: int = 100) -> list[PoisonedEntry]:
    """The newest poisoned entries first, for the admin's triage page."""
    records = cast(list[str], valkey.client().lrange(keys.drain_poison(), 0, limit - 1))
    return [_read_poisoned(record) for record in records]


def replay_poisoned(record_id: str) -> PoisonedEntry:
    """Put a poisoned entry back on the pending list, attempts from zero, for the next pass
    (once the cause is fixed). Atomic with its removal from the poison list
    (`drain_unpoison.lua`). Its run may have ended otherwise meanwhile (the reconciler fails a
    poisoned run as an orphan): the replay then drops it as superseded.
    Raises PoisonGone, NotReplayable or DrainFull (nothing changed)."""
    record, found = _find_poisoned(record_id)
    if not found.replayable:
        raise NotReplayable(f"poisoned record {record_id} holds no readable entry")
    entry = dataclasses.replace(Entry.from_json(found.raw), attempts=0)
    _unpoison(record, record_id, entry.to_json())
    log.warning("run %s: poisoned drain entry %s replayed by an operator", found.run_id, record_id)
    return found


def discard_poisoned(record_id: str) -> PoisonedEntry:
    """Drop a poisoned entry for good; the record is logged first. Raises PoisonGone."""
    record, found = _find_poisoned(record_id)
    log.warning("drain: poisoned record %s discarded by an operator: %s", record_id, record)
    _unpoison(record, record_id, "")
    return found


def _read_poisoned(record: str) -> PoisonedEntry:
    data = json.loads(record)
    entry = data.get("entry") or {}
    return PoisonedEntry(
        raw=str(data.get("raw", "")),
        run_id=str(entry.get("run_id", "")),
        target=str(entry.get("target", "")),
        attempts=int(entry.get("attempts", 0)),
        error=str(data.get("error", "")),
        poisoned_at=str(data.get("poisoned_at", "")),
        record_id=_record_id(record),
        replayable=bool(entry),
    )


def _record_id(record: str) -> str:
    return hashlib.sha1(record.encode(), usedforsecurity=False).hexdigest()


def _find_poisoned(record_id: str) -> tuple[str, PoisonedEntry]:
    records = cast(list[str], valkey.client().lrange(keys.drain_poison(), 0, POISON_CAP - 1))
    for record in records:
        if _record_id(record) == record_id:
            return record, _read_poisoned(record)
    raise PoisonGone(f"poisoned record {record_id} is no longer listed")


def _unpoison(record: str, record_id: str, pushed: str) -> None:
    done = valkey.script(
        "drain_unpoison",
        [keys.drain_poison(), keys.drain_pending()],
        [record, pushed, MAX_ENTRIES],
    )
    if done == 0:
        raise PoisonGone(f"poisoned record {record_id} is no longer listed")
    if done == -1:
        raise DrainFull(f"the drain holds {MAX_ENTRIES} entries; try again once it drained")


def add(raw: str, entry: Entry | None, error: str) -> None:
    """Move an in-flight entry the replay gave up on to the poison list, with why."""
    record: dict[str, Any] = {
        "error": error[:2000],
        "poisoned_at": timezone.now().isoformat(),
        "raw": raw,
    }
    if entry is not None:
        record["entry"] = json.loads(entry.to_json())
    pipe = valkey.client().pipeline(transaction=True)
    pipe.lrem(keys.drain_inflight(), 1, raw)
    pipe.lpush(keys.drain_poison(), json.dumps(record))
    pipe.ltrim(keys.drain_poison(), 0, POISON_CAP - 1)
    valkey.execute(pipe)
