"""The engine's own maintenance tasks: always registered, whatever LUMASTRA_TASK_MODULES says
(`tasks.registry.BUILT_IN_MODULES`), and kept apart from the demo pack."""

from __future__ import annotations

from django.conf import settings

from tasks import NoInput, TaskContext, define_task, every, registry


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days"


def history_retention(ctx: TaskContext, params: NoInput) -> dict[str, int]:
    # Each table in short batches of their own transactions (orchestrator.stores.retention).
    from coverage.retention import prune_dead_events
    from orchestrator.stores.retention import prune_history

    own = {task.id: task.retention for task in registry.get().values() if task.retention}
    history = prune_history(retention=own)
    dead_events = prune_dead_events()
    config = settings.CONFIG
    history_days = _days(config.history_retention_s)
    ctx.log(
        f"deleted {history.runs} ended runs past retention ({history_days}, or their task's own "
        f"for {len(own)} tasks) with their state changes, {history.audit} more state changes "
        f"older than {history_days}, {history.webhook_deliveries} webhook deliveries older than "
        f"{_days(config.webhook_retention_s)}, {dead_events} outbox events dead "
        f"for more than {_days(settings.COVERAGE.outbox_retention_s)}, {history.batches} "
        f"batches of runs whose runs were all deleted, {history.notifications} notifications"
    )
    return {
        "deleted": history.runs,
        "audit_deleted": history.audit,
        "webhook_deliveries_deleted": history.webhook_deliveries,
        "batches_deleted": history.batches,
        "notifications_deleted": history.notifications,
        "dead_events_deleted": dead_events,
    }


history_retention_task = define_task(
    id="history-retention",
    resource_class="maintenance",
    execute=history_retention,
    schedule=every("1d", env_override="LUMASTRA_HISTORY_RETENTION_EVERY"),
    description="deletes old ended runs (each task's own retention, else the global one), "
    "state changes, webhook deliveries and dead outbox events, each past its retention "
    "setting, in short batches",
)
