-- The live run that holds an idempotency key, if any. The key is read with `->>` and the
-- state list is the index's own, so the planner answers from the partial unique index
-- task_history_live_idempotency_key ((task_id, trigger ->> 'idempotencyKey') WHERE state is
-- live); `trigger -> 'idempotencyKey' = '"key"'`, what the ORM's JSON lookup compiles to, could
-- use no index and read every row of the task.
-- Parameters: task_id, key, live_states (the live run states).
SELECT id, identity, priority
  FROM task_history
 WHERE task_id = %(task_id)s
   AND trigger ->> 'idempotencyKey' = %(key)s
   AND state = ANY(%(live_states)s)
