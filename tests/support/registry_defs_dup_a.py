"""Registry test module: declares `dup-task`, as does `registry_defs_dup_b` (a duplicate id)."""

from tasks import define_task


def _noop(ctx: object, params: object) -> None:
    return None


first = define_task(id="dup-task", resource_class="io", execute=_noop)
