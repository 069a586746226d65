from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    label = "orchestrator"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from orchestrator import celery_tasks
        from tasks import registry

        registry.install(registry.load(settings.CONFIG.task_modules))
        celery_tasks.register_all(registry.get())
        # Registers `lumastra.schedule.dispatch`, the task celery beat's synced rows call.
        from orchestrator.scheduler import dispatch  # noqa: F401

        if settings.CONFIG.worker_mode.value == "enabled":
            from celery.signals import worker_ready

            from orchestrator import node

            worker_ready.connect(node.on_worker_ready, weak=False)
