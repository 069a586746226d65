"""The stores: how the engine talks to Valkey, Postgres's run table and the broker.

Valkey:
- `valkey`: the coordination Valkey client, one pool per process, a thread's own connection
  for the run's commands, and the Lua scripts under `lua/`, their versions pinned
- `keys`: every Valkey key name the system uses; no key literal lives anywhere else
- `live`: the live run hash; every change of it is one Lua script
- `counters`: the cluster-wide counters of /metrics, kept in Valkey hashes
- `cache`: the cache Valkey: read models that may be lost, computed again when they are

Postgres:
- `durable`: guarded run-state UPDATEs in Postgres: the one writer, one statement per move
- `queries`: the engine's hot-path SQL, one file each under `sql/`, prepared on busy connections
- `retention`: deletes old runs, state changes and webhook deliveries in short batches

The broker:
- `broker`: what waits in the broker: push, depth, shedding the oldest, removing a message;
  and our kombu Redis transport (one client per channel, acks sent with the next reservation)

No policy lives here: callers decide, the stores refuse any move `states.py` does not allow.

May import: the base modules (`orchestrator.models`, `states`, `clock`, `routing`) and the
SDK (`tasks`). Never anything above it (hooks, cluster, runs, recovery, api, admin).
"""
