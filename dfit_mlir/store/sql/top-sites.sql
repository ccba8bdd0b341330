-- top-sites: measured time by source location, across every run in the store.
-- A location is the op's module path (as the frontend names it), else its source
-- file:line, else its stable ID; an event's time goes to its root op (a dispatch's
-- time to the root of its fusion group). share: of the model's timed events on that backend.
-- Reads the rollup `op_totals` (per bundle and root op: its timed events' count and
-- total, written by `dfit collect`; computed from `events` for bundles without it), not
-- every event: events are many, (run, op) pairs few.
-- Nothing is rounded here: DuckDB and Spark round a double differently (ROUND(17007157.95, 1)
-- is 17007157.9 on DuckDB, not on Spark); `dfit query` rounds when it prints.
-- Parameters: limit (rows).
WITH per_op AS (
    SELECT backend, model, run, root_id, events, total_ns
    FROM op_totals
),
located AS (
    SELECT p.backend, p.model, p.run, p.root_id, p.events, p.total_ns,
           COALESCE(o.module_path, o.source_file || ':' || CAST(o.source_line AS STRING), p.root_id) AS location,
           CASE WHEN o.module_path IS NOT NULL THEN 'module_path'
                WHEN o.source_file IS NOT NULL AND o.source_line IS NOT NULL THEN 'source_line'
                ELSE 'op' END AS located_by
    FROM per_op p
    LEFT JOIN operators o ON o.run = p.run AND o.backend = p.backend AND o.model = p.model AND o.id = p.root_id
),
per_location AS (
    SELECT backend, model, location, located_by,
           COUNT(DISTINCT run) AS runs,
           CAST(SUM(events) AS BIGINT) AS events,
           COUNT(DISTINCT root_id) AS ops,
           CAST(SUM(total_ns) AS BIGINT) AS total_ns
    FROM located
    GROUP BY backend, model, location, located_by
)
SELECT backend, model, location, located_by, runs, events, ops, total_ns,
       CAST(total_ns AS DOUBLE) / events AS mean_ns,
       CAST(total_ns AS DOUBLE) / SUM(total_ns) OVER (PARTITION BY backend, model) AS share
FROM per_location
ORDER BY total_ns DESC NULLS LAST, backend NULLS LAST, model NULLS LAST, location NULLS LAST
LIMIT ${limit}
