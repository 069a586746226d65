"""Registry test module: a second, different `dup-task` (see `registry_defs_dup_a`)."""

from tasks import define_task


def _noop(ctx: object, params: object) -> None:
    return None


second = define_task(id="dup-task", resource_class="cpu", execute=_noop)
