-- bench/console.py, after console_history.sql: an operator's retry names the run it retried
-- (`retryOf`): the failed run created just before.
-- Parameters: none.
UPDATE task_history AS r
   SET trigger = r.trigger || jsonb_build_object('retryOf', (
         SELECT f.id FROM task_history AS f
          WHERE f.state = 'failed' AND f.created_at < r.created_at
          ORDER BY f.created_at DESC LIMIT 1))
 WHERE r.trigger ->> 'kind' = 'operator-retry';
