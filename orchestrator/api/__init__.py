"""The HTTP API at /api/v1/ (docs at /api/v1/docs), and the endpoints beside it: the health
probes and /metrics. Views never write run state: they call the orchestrator.

The API and its operations:
- `v1`: the API itself (django-ninja): its routers, its auth default, its error shape
- `runs`: `/runs`: start, read, list, cancel and retry runs, and a run's Markdown report
- `starting`: what starting a run takes and answers (`POST /runs`, a batch's starts, a
  trigger's, a retry's), and `start_run`'s refusals as API errors
- `batch`: `POST /runs:batch`: up to 1,000 starts in one call, each start's outcome answered
- `audit`: operators' actions in the admin log, from the console and the CLI alike
- `run_search`: the runs filter over HTTP (`GET /runs`'s `input.<field>`, `tag`, `since`), and
  `POST /runs:cancel` / `:retry` for every run a filter finds, with a dry run
- `report`: a run's Markdown report (YAML frontmatter: the run, its steps; a readable body)
- `logs`: `GET /runs/{run_id}/logs`: a run's log, followed live over Server-Sent Events
- `events`: `GET /events`: runs' state changes and live events over Server-Sent Events
- `tasks`: `/tasks`: the registry, each task's admission status, and force-enable
- `webhooks`: `/webhooks`: the endpoints run events are delivered to (create, list, delete)
- `triggers`: `POST /triggers/{name}`: an integration's inbound trigger starts its task, signed
  (the trigger's secret) or by an operator's token
- `dead_letters`: `/dead-letters`, `/drain/poison`: what stopped being retried; requeue, replay,
  discard (an outcome per id)
- `schedules`: `/schedules`: next and last fire of every schedule; switch one on or off
- `cluster`: `/cluster/nodes`, `/cluster/leaders`: the roster and the leader seat (read-only)
- `pauses`: `/pauses`, `/tasks/{id}/pause|resume`, `/classes/{class}/pause|resume`
- `windows`: `/windows`, `/tasks/{id}/window`, `/classes/{class}/window`: run windows (PUT, DELETE)
- `limit_usage`: `/limits`: named limits and keyed concurrency, each key's use now
- `providers`: `/providers`: metadata providers: calls, errors, latency, circuit
- `trickplay`: `/items/{id}/trickplay.vtt` and its tiles, served to players; a missing one queued

What the operations share:
- `errors`: the one JSON shape of every API error, ninja's own and unknown paths included
- `fields`: request field types checked at the edge (no NUL, no lone surrogate, true integers)
- `pagination`: keyset pagination over runs, newest first, by (created_at, id)
- `sse`: one Server-Sent Event, as the `logs` and `events` streams write it

Who may call:
- `access`: the two permissions, view and operate, that every API operation and admin page checks
- `auth`: a bearer token or a Django session, then the operation's permission (401, 403)
- `tokens`: API bearer tokens: issued once in clear, stored only as a SHA-256 digest
- `throttle`: failed sign-ins per client address: bad tokens and admin logins share one budget

Beside the API:
- `health`: the probes: `GET /healthz`, `GET /readyz` (and `manage.py healthcheck`)
- `metrics`: `GET /metrics`: Prometheus metrics of the whole cluster, read at scrape time
- `metrics_live`: the /metrics families of what waits on an operator (roster, drain, dead
  letters, queue caps and waits), which deploy/observability/'s dashboard and alerts read
- `limits`: request body limits, enforced before a body is read (web role and middleware)
- `text_guard`: a NUL or lone surrogate in a page's path, query or form is a 400, not a 500
"""
