"""The stores: how the engine talks to Valkey, Postgres's run table and the broker.

Owns the Valkey client (`valkey`), every key name (`keys`), the Lua scripts and their loader
(`lua/`, `scripts`), guarded run-state UPDATEs in Postgres (`durable`), the live run hash
(`live`) and what waits in the broker (`broker`). No policy lives here: callers decide, the
stores refuse any move `states.py` does not allow.

May import: the base modules (`orchestrator.models`, `states`, `clock`, `routing`) and the
SDK (`tasks`). Never anything above it (hooks, cluster, runs, recovery, api, admin).
"""
