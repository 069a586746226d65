"""Recovery: bringing Postgres, Valkey and the broker back into agreement after a crash.

Owns the reconciler (`reconciler`, one tick under the cluster lock), orphaned runs whose
worker stopped heartbeating (`orphans`), pending runs whose message the broker lost
(`pending`) and live hashes left behind a terminal write (`repair`). Every run it ends is
settled through `orchestrator.runs.settle`.

May import: runs, hooks, cluster, stores and the base modules. Never api or admin.
"""
