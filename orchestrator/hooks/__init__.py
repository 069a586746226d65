"""Hooks: the cross-cutting concerns plugged into a run's lifecycle, one file each.

The protocol and its caller:
- `base`: the hook protocol (`RunHook`): whether it applies to a task, one method per point
  (admit, abandoned, before_claim, release, before_stage, heartbeat, republished, finished)
  and their planned `Part`
- `dispatch`: compiles each task's plan (the hooks of the chain that apply to it, per point)
  and calls only those at each point, their Valkey commands in one pipeline

The hooks, in the order of the chain (`orchestrator.apps.hook_chain`):
- `dedup`: identity dedup: at most one live run per identity (and per `exclusive_with` group)
- `throttle`: a throttled task's identity makes at most one run per period; later starts are
  answered with the run they met
- `pause`: a paused task or class: starts refused (503) or taken (the admission script asks
  it), stages held; a run is parked at pickup by the claim's own script
- `circuit`: per-task circuit breaker: stops starting a task that keeps failing, probes it
- `circuit_copy`: each circuit's copy in Postgres, read back when Valkey lost the hash
- `quotas`: daily quotas: counts each task's runs per UTC day, refuses past `max_runs_per_day`
- `costs`: each task's spend per UTC day (`ctx.spend`), refused past `max_cost_per_day`
- `concurrency`: per-task `max_concurrent` across every worker and host, a lease semaphore
- `keyed`: keyed concurrency (`Concurrency(key=, max=)`): at most `max` runs per key, the keys'
  runs published in turns
- `limits`: named limits (`define_limit`) a task's runs take at pickup and handlers take with
  `ctx.limit`: a rate and a concurrency per key, shared across tasks
- `ratelimit`: per-task rate limit (`quotas.rate`) across the cluster, a sliding window

For operators:
- `overview`: each task's admission state as operators see it (`/tasks`, the admin), read-only

The chain and its order are chosen by the composition root (`orchestrator.apps`). A hook a task
does not declare (dedup without an identity, concurrency without `max_concurrent`, the rate
limit without a rate, costs without caps, the daily quota without a cap) is in none of its
plan's points, nor is the throttle for a task without `throttle=`. The pause and the circuit
apply to every task, but the run's own scripts (admission, claim, end) read what they would read
and call them only when they must judge. The queue cap (backpressure) is no hook: every start
meets it, after the chain (`runs.admission`). The run code calls hooks only through `dispatch`.

A hook decides, its caller acts: a hook never ends, cancels or publishes a run itself. The one
exception publishes through the function the composition root gives it: `keyed` hands on the
runs whose turn came at every point a place frees (a claim, a release, an end), since a turn
left unpublished would hold its key.
May import: `orchestrator.stores` and the base modules. Never runs, recovery or cluster.
"""
