"""The cluster: who this process is, and who may act once for the cluster.

- `instance`: this process's instance id, unique per process start, never just the host
- `locks`: loop locks (`LoopLock`, `lock:orch:<name>`) and the one fence protocol loops write under
- `leaders`: the cluster's one leader seat (`lock:orch:cluster`): the election and its fence
- `roster`: the node roster operators see: each worker-role process announces itself

There is no leader per resource class: one seat runs every once-per-cluster loop (`leaders`).

May import: `orchestrator.stores` and the base modules. Never hooks, runs or recovery.
"""
