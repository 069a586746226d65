"""The engine: starts runs, runs them on Celery's workers, and keeps Postgres, Valkey and the
broker in agreement about them (docs/architecture.md).

By layer, top to bottom: a layer may import those below it, never those above
(`pyproject.toml`'s import contracts, checked by `lint-imports`).

The composition root and the operator's doors:
- `apps`: the composition root: the hook chain, the registry, one Celery task per task
- `admin`: the operator console on the Django admin (docs/console.md)
- `templatetags`: the template filters of the console's pages
- `management`: the engine's `manage.py` commands
- `loops`: `python -m orchestrator.loops`: the reconciler, drain, scheduler and more, a thread each
- `api`: the HTTP API at /api/v1/, the health probes and /metrics
- `scheduler`: static schedules through celery beat, dynamic rows through a 10 s tick

Below them:
- `recovery`: bringing Postgres, Valkey and the broker back into agreement after a crash
- `webhooks`: run events out to the endpoints that want them, signed, at least once
- `notifications`: what needs an operator (dead letters, circuits opened, …), sent with Apprise
- `runs`: one run's path from start to end, readable top to bottom
- `windows`: run windows (quiet hours): which task's or class's window is open, and until when
- `providers`: a metadata provider's call: cached, under its circuit, limits and timeout
- `hooks`: the cross-cutting concerns plugged into every run (dedup, circuit, quotas, limits)
- `cluster`: who this process is, and who may act once for the cluster
- `stores`: how the engine talks to Valkey, Postgres's run table and the broker

The base modules:
- `models`: the durable state: runs and their audit, tokens, quotas, circuits, schedules, webhooks
- `routing`: queues and pools: where a task's messages wait, which worker pool consumes them
- `triggers`: what started a run (`TriggerKind`), and the priority that follows from it
- `states`: run and stage states and the transitions between them, the one table
- `slots`: when a cron or interval fires, and a window opens and closes: the one function
- `clock`: time as a dependency (`Clock`), and the ms and span conversions everyone shares
- `backoff`: exponential backoff, capped before it is computed, with or without jitter
- `text`: what text from outside may be: storable in Postgres, a number in ASCII digits
- `sql`: the one reader of the `.sql` files, and what each file's header says
- `tracing`: OpenTelemetry traces, one per run from its request to its end; off, it costs nothing

The engine never imports the catalog (`coverage`), which plugs in through settings and SQL.
"""
