"""Registry test module: valid definitions, a watch-sync pair and mutual exclusion.

`ghost-task` exists here so `registry_defs_exclusive` loads when listed together with this module.
"""

from tasks import define_task, define_watch_sync


def _noop(ctx: object, params: object) -> None:
    return None


alpha = define_task(
    id="alpha-task", resource_class="io", execute=_noop, exclusive_with=["beta-task"]
)
beta = define_task(
    id="beta-task", resource_class="cpu", execute=_noop, exclusive_with=["alpha-task"]
)
also_alpha = alpha  # the same definition under two names is one task, not a duplicate
ghost = define_task(id="ghost-task", resource_class="maintenance", execute=_noop)
library = define_watch_sync("library-sync", push=_noop, pull=_noop)
NOT_A_TASK = "ignored: only TaskDefinition and WatchSync values are registered"
