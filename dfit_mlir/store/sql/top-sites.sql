-- top-sites: measured time by source location, across every run in the store.
-- A location is the op's module path (as the frontend names it), else its source
-- file:line, else its stable ID; an event's time goes to its root op (a dispatch's
-- time to the root of its fusion group). share: of the model's timed events on that backend.
-- Parameters: limit (rows).
WITH located AS (
    SELECT e.backend, e.model, e.run, e.root_id, e.duration_ns,
           COALESCE(o.module_path, o.source_file || ':' || CAST(o.source_line AS STRING), e.root_id) AS location,
           CASE WHEN o.module_path IS NOT NULL THEN 'module_path'
                WHEN o.source_file IS NOT NULL AND o.source_line IS NOT NULL THEN 'source_line'
                ELSE 'op' END AS located_by
    FROM events e
    LEFT JOIN operators o ON o.run = e.run AND o.backend = e.backend AND o.model = e.model AND o.id = e.root_id
    WHERE e.duration_ns IS NOT NULL AND e.root_id IS NOT NULL
),
per_location AS (
    SELECT backend, model, location, located_by,
           COUNT(DISTINCT run) AS runs,
           COUNT(*) AS events,
           COUNT(DISTINCT root_id) AS ops,
           CAST(SUM(duration_ns) AS BIGINT) AS total_ns
    FROM located
    GROUP BY backend, model, location, located_by
)
SELECT backend, model, location, located_by, runs, events, ops, total_ns,
       ROUND(CAST(total_ns AS DOUBLE) / events, 1) AS mean_ns,
       ROUND(CAST(total_ns AS DOUBLE) / SUM(total_ns) OVER (PARTITION BY backend, model), 4) AS share
FROM per_location
ORDER BY total_ns DESC NULLS LAST, backend NULLS LAST, model NULLS LAST, location NULLS LAST
LIMIT ${limit}
