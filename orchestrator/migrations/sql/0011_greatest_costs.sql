-- Two cost maps merged kind by kind, keeping the larger figure (the rollup never lowers one).
-- Parameters: none.
CREATE OR REPLACE FUNCTION lumastra_greatest_costs(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT COALESCE(jsonb_object_agg(kind, units), '{}'::jsonb)
    FROM (SELECT kind, max(units::numeric) AS units
            FROM (SELECT * FROM jsonb_each_text(COALESCE(a, '{}'::jsonb))
                  UNION ALL SELECT * FROM jsonb_each_text(COALESCE(b, '{}'::jsonb)))
                 AS both_maps(kind, units)
           GROUP BY kind) AS larger
$$;
