"""Hooks: the cross-cutting concerns plugged into every run, one file each.

Owns the hook protocol and its points (`base`), the dispatcher that calls the installed chain
(`dispatch`), and the hooks: identity dedup (`dedup`), circuit breaker (`circuit`), daily
quotas (`quotas`), backpressure (`backpressure`), concurrency limit (`concurrency`) and rate
limit (`ratelimit`), plus each task's admission state as operators see it (`overview`). The
chain and its order are chosen by the composition root (`orchestrator.apps`).

A hook decides, its caller acts: a hook never ends, cancels or publishes a run itself.
May import: `orchestrator.stores` and the base modules. Never runs, recovery or cluster.
"""
