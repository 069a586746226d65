"""The Django admin as the operator console (docs/console.md): runs (the list, and each run's
page with cancel, kill, retry and resume), the operator pages (Start a run, Tasks with
force-enable, Cluster, Dead letters, Schedules), API tokens and webhooks, one module each.

What every page shares:
- `site`: the admin site itself: its titles, its first page, and a login that counts failed
  sign-ins
- `pages`: the operator pages' permission guard, `log_action` and the admin's page context
- `paginator`: big lists' paginator: an exact count up to a cap, Postgres's estimate past it

The first page:
- `overview`: the overview (view): its panels, each also served alone for the page to refetch
- `activity`: the overview's ends per minute and per day, and the tasks failing most
- `waiting`: the overview's queues per class, held runs and dead letters (/metrics' figures)
- `charts`: the overview's charts, drawn on the server as SVG

Runs:
- `runs`: the runs list (filters, bulk cancel and retry, live progress); every page's URL
- `filters`: the runs list's filters that the admin's own field filters cannot express
- `run_detail`: a run's page (timeline, stages, log) and its cancel, kill, retry, resume actions

The operator pages:
- `start_form`: "Start a run" (operate): a task, its input, a priority, an idempotency key
- `input_fields`: the start form's fields, generated from the task's input schema
- `tasks_page`: "Tasks" (view): each task, its last run, its last day, its admission status
- `stats`: the Tasks page's read: each task's newest run, its last day's success rate, p50/p95
- `force_enable`: the Tasks page's force-enable of a task's circuit (operate, a POST)
- `pause`: the Tasks page's pause and resume of a task or its class (operate, a POST)
- `nodes`: "Cluster" (view): the live nodes, the leader, each pool's queue depth and runs
- `limits_page`: "Limits" (view): named limits and keyed concurrency, each key's use now
- `providers_page`: "Providers" (view): metadata providers' calls, errors, latency and circuit
- `dead_letters`: "Dead letters": all that stopped being retried, a section per kind, with actions
- `schedules`: "Schedules": every static and dynamic schedule, switched on or off (operate)

API tokens and webhooks:
- `tokens`: API tokens, listed and revoked, never created or shown here
- `webhooks`: webhook endpoints (the secret shown once) and their deliveries, with redeliver
- `notifications`: the notifications operators receive, and "Send test notification" (operate)

Every run page and action checks `orchestrator.api.access` like the API does: reading (the runs
list and a run's page, Tasks, Cluster, Dead letters, Schedules) needs view, acting (start,
cancel, kill, retry, resume, force-enable, pause, requeue, replay, discard, redeliver, switch a
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
from orchestrator.admin import notifications, runs, site, tokens, webhooks  # noqa: E402

__all__ = ["notifications", "runs", "site", "tokens", "webhooks"]
