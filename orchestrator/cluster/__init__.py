"""The cluster: who this process is, and who may act once for the cluster.

Owns the instance id (`instance`), loop locks and the one fence protocol loops write under
(`locks`), leader election per resource class and for the cluster (`leaders`) and the node
roster operators see (`roster`).

May import: `orchestrator.stores` and the base modules. Never hooks, runs or recovery.
"""
