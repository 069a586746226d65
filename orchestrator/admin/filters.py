"""The runs list's filters that the admin's own field filters cannot express."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest

from orchestrator.runs.rerun import dead_letters
from orchestrator.text import is_ascii_digits
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority
from tasks.resources import RESOURCE_CLASSES


class TaskFilter(admin.SimpleListFilter):
    # Choices from the registry: a DISTINCT over task_history would scan the whole table.
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(task_id, task_id) for task_id in sorted(registry.get())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(task_id=value) if value else queryset


class TriggerKindFilter(admin.SimpleListFilter):
    title = "trigger kind"
    parameter_name = "trigger"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind.value, kind.value) for kind in TriggerKind]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        # `trigger->>'kind'` is the expression the task_history_trigger_kind index is built on;
        # `trigger__kind=` would compare JSON values and miss the index.
        by_kind: QuerySet[Any] = queryset.alias(trigger_kind=KT("trigger__kind"))
        return by_kind.filter(trigger_kind=value)


class OutcomeFilter(admin.SimpleListFilter):
    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("dead-letter", "dead letters (retries exhausted)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "dead-letter":
            return queryset & dead_letters()
        return queryset


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(p.value), f"{p.value} {p.name.lower()}") for p in Priority]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value and is_ascii_digits(value):
            return queryset.filter(priority=int(value))
        return queryset


class ResourceClassFilter(admin.SimpleListFilter):
    # A run's class is its task's, from the registry: the filter is a task_id IN (…).
    title = "class"
    parameter_name = "class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(RESOURCE_CLASSES)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        tasks = [d.id for d in registry.get().values() if d.resource_class == value]
        return queryset.filter(task_id__in=tasks)


class ParentFilter(admin.SimpleListFilter):
    """`?parent=<run id>`: a run's children (`ctx.spawn`), linked from its page; no choices to
    list, so it is not shown among the filters."""

    title = "parent run"
    parameter_name = "parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(parent_run_id=value) if value else queryset
