"""Runs: one run's path from start to end, readable top to bottom.

`start` (admission, the INSERT, seed and publish on commit) → `publish` → `celery_tasks`
(one Celery task per task id, every body the runner) → `runner` (version guard, claim,
execute) with its `context`, `watch` (heartbeats, cancel listener, watchdogs) and `process`
(the commands a handler runs, `ctx.run_process`; `leftovers` kills what they leave) →
`terminal` (the guarded end in Postgres) → `settle` (Valkey follows, hooks hear of it). Beside
them: `drain` (terminal writes Postgres refused, replayed), `cancel` (operator cancels and
shed runs) and `rerun` (an operator's retry: a new run of the same work).

May import: hooks, cluster, stores and the base modules. Never recovery, api or admin.
"""
