-- A run ends (completed or failed), only from a state states.py allows (`sources`). The
-- result and error are replaced: a run that failed an attempt and then completed keeps no
-- error. Zero rows updated means refused; the caller reads the state to say why.
-- A pipeline run's stages end with it (`lumastra_close_stages`, migration 0010): those that
-- never started are `skipped`, one still running is `failed` (its late end is refused).
-- A plain run's warnings, counters and cost, when it recorded any (`step`, else NULL), become
-- its step record and are added to its cost_breakdown (`cost`); its latest progress, when it
-- reported any (`progress`), replaces the row's.
-- Fenced by the claim (`owner`, '' for a writer that holds none): a run put back to pending
-- after its worker was lost and claimed again has a new owner, so the old claim's late end
-- is refused (`runs.put_back`).
-- A claim not written yet (a short run's claim is folded into its end: read_claimable.sql), or
-- whose commit a crash of Postgres lost (the claim does not wait for its flush:
-- claim_run.sql), left the row where the claim found it (`claimable`: pending), one attempt
-- below the claim's (`attempt`, the count the claim returned). That claim's own end takes the
-- claim's move with it here (owner, attempt count, and its start: `started_at`, else the
-- end's moment): pending → active → target in one statement, each move legal. A run
-- put back to pending after its worker was judged lost keeps the lost claim's attempt count
-- (put_back_run.sql), so that claim's late end does not match; nor does a writer that names
-- no claim (`owner` '', `attempt` NULL).
-- The two helpers are called only when they have work (a pipeline's stages, a cost): a SQL
-- function with a subquery is not inlined, and the two calls were a third of this statement's
-- time for a plain run that recorded no cost (0.60-0.77 → 0.35-0.50 ms, docs/benchmarks.md).
-- Parameters: run_id, target, sources, claimable, result, error, step, cost, progress (JSON
-- text or NULL each), finished_at, owner, attempt (or NULL), started_at (or NULL).
UPDATE task_history
   SET state = %(target)s,
       owner_instance_id = CASE WHEN state = 'pending' AND %(owner)s::text <> ''
                                THEN %(owner)s::text ELSE owner_instance_id END,
       attempts = CASE WHEN state = 'pending' AND %(owner)s::text <> ''
                       THEN %(attempt)s::int ELSE attempts END,
       started_at = CASE WHEN state = 'pending' AND %(owner)s::text <> ''
                         THEN COALESCE(%(started_at)s::timestamptz, now())
                         ELSE started_at END,
       result = %(result)s::jsonb,
       error = %(error)s::jsonb,
       finished_at = %(finished_at)s,
       stages = CASE WHEN stages = '{}'::jsonb THEN stages
                     ELSE lumastra_close_stages(stages) END,
       steps = CASE WHEN %(step)s::jsonb IS NULL THEN steps
                    ELSE jsonb_set(steps, ARRAY[task_id], %(step)s::jsonb) END,
       cost_breakdown = CASE WHEN %(cost)s::jsonb IS NULL THEN cost_breakdown
                             ELSE lumastra_add_costs(cost_breakdown, %(cost)s::jsonb) END,
       progress = COALESCE(%(progress)s::jsonb, progress),
       updated_at = now()
 WHERE id = %(run_id)s
   AND ((state = ANY(%(sources)s)
         AND (%(owner)s::text = '' OR owner_instance_id = %(owner)s::text))
        OR (state = ANY(%(claimable)s)
            AND %(owner)s::text <> ''
            AND attempts = %(attempt)s::int - 1))
