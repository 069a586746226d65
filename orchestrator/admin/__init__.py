"""The Django admin as the operator console (docs/console.md): runs (the list, and each run's
page with cancel, kill, retry and resume), the operator pages (Start a run, Tasks with
force-enable, Cluster, Dead letters, Schedules), API tokens and webhooks, one module each.

Every run page and action checks `orchestrator.api.access` like the API does: reading (the runs
list and a run's page, Tasks, Cluster, Dead letters, Schedules) needs view, acting (start,
cancel, kill, retry, resume, force-enable, requeue, replay, discard, redeliver, switch a
schedule) needs operate; staff without the permission get a 403. The site's login counts
failed sign-ins per client address with the API's bearer tokens (`orchestrator.api.throttle`).

Every operator action (start, cancel, retry, force-enable, and the coverage and webhook
actions) is written to the admin log under the operator's name (`pages.log_action`).

Only the orchestrator writes run state: the start form calls `start_run` and nothing else,
the force-enable button `circuit.force_enable` and nothing else, and no admin page can add,
change or delete a run row.
"""

import django_stubs_ext

# ModelAdmin[Model] in this package is for the type checker; this makes it valid at run time,
# before the modules below subscript it.
django_stubs_ext.monkeypatch()

# Importing the modules registers their model admins and the site's login wrapper.
from orchestrator.admin import runs, site, tokens, webhooks  # noqa: E402

__all__ = ["runs", "site", "tokens", "webhooks"]
