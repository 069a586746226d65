"""Registry test module: `exclusive_with` names a task no loaded module declares."""

from tasks import define_task


def _noop(ctx: object, params: object) -> None:
    return None


lonely = define_task(
    id="lonely-task", resource_class="io", execute=_noop, exclusive_with=["ghost-task"]
)
