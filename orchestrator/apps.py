"""The composition root: wires the engine together once Django is ready.

It installs the hook chain every run goes through, loads the task registry, registers one
Celery task per task and, in the worker role, announces the node. Nothing below this module
chooses which hooks run or in which order.
"""

from __future__ import annotations

from collections.abc import Collection

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

from lumastra.config import Config, trigger_variable
from orchestrator.hooks.base import RunHook


def hook_chain() -> tuple[RunHook, ...]:
    """The hook chain, in the order its hooks run. Each task's runs go through the hooks of it
    that apply to the task (`RunHook.applies`, compiled per task by `dispatch.plan`).

    At admission: the admission script counts an uncapped start and says whether the pause
    or the circuit must judge it (a refused or deduplicated start gives the count back); dedup
    answers first, a pause that refuses starts and the circuit before a capped quota takes a
    unit; the queue cap (`runs.admission`, not a hook: every start meets it) judges after the
    chain, so a refused start consumes nothing and nothing is shed for a start the quota would
    refuse. At pickup: the concurrency slot, the named limits, the rate limit, then a keyed
    concurrency's place (whose turns the runs' publishing follows: taken last, once the others
    said yes, so a run they postpone keeps its key's line waiting for it), so a run a later
    hook postpones gives back what the earlier took (the dispatcher releases the hooks that
    passed); the pause is read by the claim's own script, after them, and a parked run gives
    back what they took.
    """
    from orchestrator.hooks.circuit import CircuitBreaker
    from orchestrator.hooks.concurrency import ConcurrencyLimit
    from orchestrator.hooks.costs import CostQuota
    from orchestrator.hooks.dedup import IdentityDedup
    from orchestrator.hooks.keyed import KeyedConcurrency
    from orchestrator.hooks.limits import NamedLimits
    from orchestrator.hooks.pause import PauseGate
    from orchestrator.hooks.quotas import DailyQuota
    from orchestrator.hooks.ratelimit import RateLimit
    from orchestrator.hooks.throttle import ThrottleGate
    from orchestrator.runs.publish import publish_turns

    return (
        ThrottleGate(),
        IdentityDedup(),
        PauseGate(),
        CircuitBreaker(),
        DailyQuota(),
        CostQuota(),
        ConcurrencyLimit(),
        NamedLimits(),
        RateLimit(),
        KeyedConcurrency(publish=publish_turns),
    )


def _refuse_unknown_classes(config: Config) -> None:
    """Per-class variables naming a class that does not exist stop every role at startup
    (`lumastra.config` reads them without knowing the classes)."""
    from tasks.resources import unknown_classes

    unknown = unknown_classes(
        config.concurrency_overrides,
        config.queue_depth_cap_overrides,
        config.hard_timeout_overrides,
        config.stall_fail_overrides,
        config.class_windows,
    )
    if unknown:
        raise ImproperlyConfigured(
            f"per-class variables name unknown resource classes: {sorted(unknown)} "
            "(LUMASTRA_<VARIABLE>_<CLASS>; tasks/resources.py lists the classes)"
        )


def _refuse_unknown_trigger_secrets(config: Config, triggers: Collection[str]) -> None:
    """A trigger secret naming no declared trigger stops every role at startup: a misspelt
    name would otherwise leave its trigger without a secret, open to bearer tokens only, and
    its integration's signed requests refused with no hint why."""
    unknown = sorted(set(config.trigger_secrets) - set(triggers))
    if unknown:
        named = ", ".join(trigger_variable(name) for name in unknown)
        raise ImproperlyConfigured(
            f"trigger secrets name no declared trigger: {named} (declared: "
            f"{', '.join(sorted(triggers)) or 'none'}; define_trigger in a task module)"
        )


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    label = "orchestrator"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: they use models, which Django loads after this module.
        from django.conf import settings

        from orchestrator import providers, tracing
        from orchestrator.cluster.instance import instance_id
        from orchestrator.hooks import dispatch
        from orchestrator.runs import celery_tasks
        from tasks import providers as sdk_providers
        from tasks import registry

        if tracing.configure(settings.CONFIG.otel, instance_id()):
            from celery.signals import worker_process_shutdown

            # A pool process's spans still waiting for their batch are sent before it exits.
            worker_process_shutdown.connect(lambda **_: tracing.flush(), weak=False)
        dispatch.install(hook_chain())
        sdk_providers.install(providers.call)
        _refuse_unknown_classes(settings.CONFIG)
        registry.install(registry.load(registry.BUILT_IN_MODULES + settings.CONFIG.task_modules))
        _refuse_unknown_trigger_secrets(settings.CONFIG, registry.get().triggers)
        celery_tasks.register_all(registry.get())
        # Registers `lumastra.schedule.dispatch`, the task celery beat's synced rows call.
        from orchestrator.scheduler import dispatch as schedule_dispatch  # noqa: F401

        if settings.CONFIG.worker_mode.value == "enabled":
            from celery.signals import worker_init, worker_ready, worker_shutdown

            from orchestrator.cluster import roster
            from orchestrator.runs import stopping

            worker_ready.connect(roster.on_worker_ready, weak=False)
            worker_init.connect(stopping.on_worker_init, weak=False)
            worker_shutdown.connect(stopping.on_worker_shutdown, weak=False)
