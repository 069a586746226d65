"""Registry test module: an inbound trigger beside the task it starts."""

from tasks import define_task, define_trigger


def _noop(ctx: object, params: object) -> None:
    return None


hooked = define_task(id="hooked-task", resource_class="io", execute=_noop)
hook = define_trigger(name="a-hook", task="hooked-task", priority=3)
