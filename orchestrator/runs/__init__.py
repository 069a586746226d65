"""Runs: one run's path from start to end, readable top to bottom.

`start` (admission, the INSERT, seed and publish on commit) → `publish` → `celery_tasks`
(one Celery task per task id, every body the runner) → `runner` (version guard, claim) →
`execute` with its `context`, `watch` (heartbeats, cancel listener, watchdogs) and `process`
(the commands a handler runs, `ctx.run_process`; `leftovers` kills what they leave) →
`terminal` (the guarded end in Postgres, then Valkey follows and the hooks hear of it). Beside
them: `drain` (writes Postgres refused wait there for `recovery.drain_replay`), `cancel`
(operator cancels and shed runs) and `rerun` (an operator's retry: a new run of the same work).

Its modules, by role.

The path, in the order a run takes it:
- `start`: `start_run`, the one way to create a run: admission, the INSERT, publish on commit
- `handle`: what a start answers (`RunHandle`, its outcome counted for /metrics) and how it
  refuses (`StartRefused`, `InvalidInput`, `KeyContended`)
- `admission`: whether a start may be recorded: the admission script, the task's admission
  hooks when it has any, then the queue cap (backpressure: drop, fail fast, shed the oldest)
- `batch`: `start_runs`, many starts in one call: each admitted, one INSERT, one publish
- `batches`: a start's request (`StartRequest`), a caller's batch with callbacks (`Batch`), and
  the batch's row written with its runs
- `coalesce`: a start that meets an existing run: its idempotency key's live run, a debounced
  task's waiting run of its identity (which takes the start's input), a follow-up task's
  follow-up of its running run
- `due`: delayed starts, published by the cluster leader once their `not_before` has come
- `publish`: builds a run's or a stage's Celery message and sends it to its queue
- `celery_tasks`: registers one Celery task per task id and per pipeline stage, body the runner
- `runner`: the body of every Celery task: version guard, hooks and claim (a pause parks)
- `execute`: a claimed run's handler beside its watch (`outcome_of`: how its call ended, one
  reading for runs and stages), then its end, retry or dead letter
- `terminal`: the terminal write, Postgres first, exactly once; the winning writer settles it:
  the live hash follows, then the `finished` hooks
- `ending`: what an end is made of (`End`, `Guard`, `Replay`) and what it found (`Ended`)

While the handler runs:
- `context`: `RunContext`, the engine's implementation of the SDK's `TaskContext`, and the run's
  live log (`ctx.log`, its `logging` calls) in Valkey, a tail kept on its row
- `watch`: the threads beside a running handler: heartbeats, cancel listener, watchdogs
- `process`: `ctx.run_process`: a handler's command, stopped with the run however it ends
- `progress`: `ctx.report_progress`: done, total, rate and ETA, written no more than is useful
- `steps`: step telemetry: each step's status, timings, attempts, cost, counters, warnings
- `pipeline`: a pipeline run's DAG: its first stages, the advance after each end, cancel
- `stage_attempts`: one stage's attempt (claim, execute, end), and stages whose worker was lost
- `spawn`: `ctx.spawn` and `ctx.children`: a step's children admitted, written with its end
- `children`: a batch's ends acted on once (a stage that awaits children, a batch's callbacks,
  a child that fails its parent)

Recovery helpers, when a write or a worker is lost:
- `drain`: terminal writes and stage moves Postgres refused on a transient error, pushed to wait
- `redelivery`: a message whose run is not pending (a duplicate, a cancel before pickup, a
  worker lost mid-run), and one redelivered past LUMASTRA_MAX_DELIVERIES
- `put_back`: a run whose worker was lost goes back to `pending` for its next attempt, same run
- `handback`: a stopping worker's runs, once its grace is over, put back for another worker
- `stopping`: a stopping worker's planned kills read as one (no crash report), and a prompt exit
- `retries`: the error document, and the one retry rule: a failed attempt tried again,
  failed, or a dead letter
- `catch_up`: one store catching up with the other: a live hash brought to an end Postgres
  holds (retried through an outage), a claim only Valkey holds written to Postgres
- `leftovers`: finds processes a run's command left behind (by their environment) and kills them

Asked from outside the run:
- `cancel`: an operator's cancel (or kill now), reaching the run's children too
- `shed`: the waiting runs backpressure sheds, and the cancel signal every cancel sends
- `rerun`: an operator's retry: a new run of the same work; a pipeline reuses completed stages
- `wait`: waits for a run's end from any process (`handle.wait`, `run_and_wait`, `?wait=`)
- `search`: finding runs by task, state, input fields and tags: the filter every door shares
- `tags`: a run's tags, given at start: what they may be
- `bulk`: cancel or retry every run a filter finds (at most BULK_MAX a call), or count them

May import: hooks, cluster, stores and the base modules. Never recovery, api or admin.
"""
