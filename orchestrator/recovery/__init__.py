"""Recovery: bringing Postgres, Valkey and the broker back into agreement after a crash.

- `reconciler`: one tick under the cluster lock: the drain, orphans, pending runs, then its steps
- `orphans`: runs whose worker stopped heartbeating in both stores: put back, or ended
- `pending`: pending runs whose message the broker lost: published again, or failed at a deadline
- `repair`: a tick's step: live hashes left behind a terminal write, settled
- `stages`: a tick's step: pipeline runs stalled between stages, moved on
- `children`: a tick's step: live children of a parent that ended failed or cancelled, cancelled
- `pauses`: pause and resume a task or class (`task_pause`, its Valkey mirror, the release)
- `windows`: the leader's windows loop: the mirror kept true, what a window held released when
  it opens, running runs stopped when it closes; an operator's window set or removed
- `drain_replay`: the drain's writes made again once Postgres answers, and what follows each
- `drain_poison`: the drain's entries no replay could apply, kept for an operator

Every run it ends is settled through `orchestrator.runs.terminal.settle`; a run it gives another
attempt goes back through `orchestrator.runs.put_back`.

May import: runs, hooks, cluster, stores and the base modules. Never api or admin.
"""
