-- A pipeline run's stages as its end leaves them: never started → skipped, still running →
-- failed. Used by the run's terminal writes (stores/sql/end_run.sql, cancel_run.sql).
-- Parameters: none.
CREATE OR REPLACE FUNCTION lumastra_close_stages(stages jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN stages = '{}'::jsonb THEN stages ELSE (
    SELECT jsonb_object_agg(name, CASE stage WHEN 'waiting' THEN 'skipped'
                                             WHEN 'active' THEN 'failed'
                                             ELSE stage END)
      FROM jsonb_each_text(stages) AS s(name, stage)) END
$$;
