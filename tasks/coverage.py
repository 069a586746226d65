"""Per-item coverage, as a task author declares it: which catalog items a task's stage covers.

A task that processes catalog items one by one (a checksum, a fingerprint, artwork) declares
the stages it covers:

    checksum = define_task(
        id="checksum", resource_class="io", execute=..., input_model=CoverageItem,
        covers_stages=[CoveredStage(
            id="checksum",
            applies_to=("movie", "episode"),
            eligible_sql="EXISTS (SELECT 1 FROM media_file_items fi JOIN media_files f"
                         " ON f.id = fi.file_id WHERE fi.item_id = mi.id AND NOT f.is_missing)",
            invalidated_by=("file.linked", "file.content_changed"),
        )],
    )

The catalog keeps one row per (item, stage) and the engine starts one run per item that needs
the stage (`coverage/` says how). Eligibility is said once: a positive SQL condition over the
item row `mi` (`media_items`), or, for code with no SQL to say it in, `eligible`, a predicate
over the item's immutable fields (`ItemFacts`) — asked once, when its row is created.

A run's input names its item (`CoverageItem`) or, for a stage covered by one run at a time
(`per_item=False`), a batch of items (`CoverageBatch`). A handler that finds an item it cannot
process returns `skipped(reason)`; `skipped(reason, retry_after=…)` asks again later.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

# The catalog's item kinds (coverage.models.ItemKind holds the same names; a test keeps them so).
ITEM_KINDS = ("movie", "series", "season", "episode", "album", "track")

# The catalog events a stage may be invalidated by, and whether each changes an item's
# content (then it also resets `completed` rows: the work done is out of date).
EVENT_KINDS: dict[str, bool] = {
    "item.metadata_changed": False,  # title, year, library or number edited
    "external_id.changed": True,  # an id at a metadata provider added, changed or removed
    "file.linked": True,  # a file now holds the item
    "file.unlinked": True,  # a file no longer holds it
    "file.modified": True,  # a file of the item was rewritten on disk (a new size or mtime)
    "file.content_changed": True,  # a file of the item was probed again or its hash changed
    "file.presence_changed": False,  # a file of the item went missing or came back
    "children.changed": True,  # an episode, season or track was added to or removed from it
}

_STAGE_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


@dataclass(frozen=True)
class ItemFacts:
    """The fields of an item that never change once it exists."""

    id: int
    kind: str
    library: str


@dataclass(frozen=True, kw_only=True)
class CoveredStage:
    id: str
    applies_to: tuple[str, ...]
    # A positive SQL condition over the item row `mi`; None with no `eligible`: every item.
    # Sent with parameters: a literal `%` is written `%%`.
    eligible_sql: str | None = None
    eligible: Callable[[ItemFacts], bool] | None = None
    # Reasons a handler skipped an item for (beside `ineligible`) that are undone, like an
    # ineligible skip, once the eligibility condition holds for the item.
    recover_when_additional_reasons: tuple[str, ...] = ()
    invalidated_by: tuple[str, ...] = ()
    # False: the stage is tracked but nothing starts its runs (an operator or event does).
    enqueueable: bool = True
    # False: one run at a time covers a batch of items (a global identity for the stage).
    per_item: bool = True


class CoverageItem(BaseModel, extra="forbid"):
    """The input of a per-item run the coverage sweep starts."""

    stage: str = Field(min_length=1, max_length=64)
    item_id: int = Field(ge=1)


class CoverageBatch(BaseModel, extra="forbid"):
    """The input of a run that covers a batch of items of one stage (`per_item=False`)."""

    stage: str = Field(min_length=1, max_length=64)
    item_ids: list[int] = Field(min_length=1, max_length=1000)


def skipped(reason: str, retry_after: timedelta | None = None) -> dict[str, Any]:
    """The result of a run that did not process its item and says why: the item's row becomes
    `skipped_permanent` (or `skipped_transient`, asked again after `retry_after`)."""
    doc: dict[str, Any] = {"reason": reason}
    if retry_after is not None:
        doc["retry_after_s"] = int(retry_after.total_seconds())
    return {"skipped": doc}


def normalised_stage(stage: CoveredStage) -> CoveredStage:
    """A stage with its sequences as tuples (a list given for `applies_to` is kept as a tuple:
    the stage is immutable and hashable, like the rest of a definition)."""
    return dataclasses.replace(
        stage,
        applies_to=tuple(stage.applies_to),
        invalidated_by=tuple(stage.invalidated_by),
        recover_when_additional_reasons=tuple(stage.recover_when_additional_reasons),
    )


def stage_problem(stage: object, input_model: type[BaseModel]) -> str | None:
    """What is wrong with one `covers_stages` entry, if anything (define_task's check)."""
    if not isinstance(stage, CoveredStage):
        return "entries must be CoveredStage(id=, applies_to=, ...)"
    if not isinstance(stage.id, str) or not _STAGE_ID.match(stage.id):
        return f"stage id {stage.id!r}: lowercase letters, digits, '-' and '_', from a letter"
    where = f"stage {stage.id!r}"
    if isinstance(stage.applies_to, str) or not stage.applies_to:
        return f"{where}: applies_to must be a non-empty sequence of item kinds"
    unknown = [kind for kind in stage.applies_to if kind not in ITEM_KINDS]
    if unknown:
        return f"{where}: unknown item kind(s) {unknown}; known: {', '.join(ITEM_KINDS)}"
    if stage.eligible_sql is not None and stage.eligible is not None:
        return f"{where}: say eligibility once: eligible_sql or eligible, not both"
    if stage.eligible_sql is not None and (
        not isinstance(stage.eligible_sql, str) or not stage.eligible_sql.strip()
    ):
        return f"{where}: eligible_sql must be a non-empty SQL condition over `mi`"
    if stage.eligible is not None and not callable(stage.eligible):
        return f"{where}: eligible must be callable as eligible(ItemFacts) -> bool"
    unknown = [kind for kind in _names(stage.invalidated_by) if kind not in EVENT_KINDS]
    if isinstance(stage.invalidated_by, str) or unknown:
        return f"{where}: invalidated_by: unknown event kind(s); known: {', '.join(EVENT_KINDS)}"
    if isinstance(stage.recover_when_additional_reasons, str):
        return f"{where}: recover_when_additional_reasons must be a sequence of reasons"
    sample: dict[str, Any] = (
        {"stage": stage.id, "item_id": 1}
        if stage.per_item
        else {"stage": stage.id, "item_ids": [1]}
    )
    try:
        input_model.model_validate(sample)
    except ValueError:
        expected = "CoverageItem" if stage.per_item else "CoverageBatch"
        return f"{where}: the task's input_model must accept {expected}'s fields ({sample})"
    return None


def _names(value: Sequence[str] | str) -> list[str]:
    return [value] if isinstance(value, str) else list(value)
