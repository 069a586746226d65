"""The scheduler: static schedules through celery beat, dynamic rows through a 10 s tick.

One job per module:

- `names`: the dispatch task's name and queue (no Django imports; the worker supervisor reads it).
(When a schedule fires, the one function every part reads, is `orchestrator.slots`: an
interval's slots, a cron's in its time zone across daylight saving, a slot's jitter.)
- `fire`: the one fire path, shared by beat, the dynamic tick and the boot catch-up:
  `SET lock:scheduler:<taskId>:<bucket> NX EX 30`, then a guarded upsert of `scheduler_state`
  and `start_run` with trigger kind `schedule`, in one transaction.
- `sync`: static schedules → django-celery-beat `PeriodicTask` rows (`manage.py sync_schedules`).
- `dispatch`: the Celery task beat fires, `lumastra.schedule.dispatch(task_id)`.
- `catchup`: the boot catch-up, one run per static schedule that missed a full interval.
- `dynamic`: the tick that fires each static slot as it begins (its jitter over) and the due
  rows of `schedule=dynamic(loader)` tasks.
- `policies`: a schedule's policies beyond firing: `pause_on_failure`, `catch_up_within_s`,
  `jitter_s` (declared by `every()` and `cron()`).
- `backfill`: an operator fires the slots a static schedule missed between two moments, once.

For the admin's Schedules page:

- `overview`: every schedule with its last fire, its next fire and whether it is on (read-only).
- `switch`: switches a schedule on or off, a beat row's `enabled` or a dynamic row's `disabled`.
- `overrides`: an operator's cadence for a schedule, kept across syncs until reset.
"""
