"""Registry test module: importing it fails, because a manifest names an unknown class."""

from tasks import define_task


def _noop(ctx: object, params: object) -> None:
    return None


broken = define_task(id="broken-task", resource_class="gpu", execute=_noop)
