-- Two cost maps ({"kind": units}) added kind by kind; NULL adds nothing.
-- Parameters: none.
CREATE OR REPLACE FUNCTION lumastra_add_costs(total jsonb, more jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN more IS NULL OR more = '{}'::jsonb THEN total ELSE (
    SELECT COALESCE(jsonb_object_agg(kind, units), '{}'::jsonb)
      FROM (SELECT kind, sum(units::numeric) AS units
              FROM (SELECT * FROM jsonb_each_text(total)
                    UNION ALL SELECT * FROM jsonb_each_text(more)) AS both_maps(kind, units)
             GROUP BY kind) AS summed) END
$$;
