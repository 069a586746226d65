-- A resumed pipeline run, still pending in its starter's transaction, takes the stages the
-- run it resumes completed: their states, results and step records (orchestrator/runs/
-- pipeline.py, `reuse_completed`). Parameters: run_id, stages, results, steps (JSON text).
UPDATE task_history
   SET stages = stages || %(stages)s::jsonb,
       stage_results = %(results)s::jsonb,
       steps = %(steps)s::jsonb,
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'pending'
