-- top-sites: measured time by source location, across every run in the store.
-- A location is the op's module path (as the frontend names it), else its source
-- file:line, else its stable ID. An op's time is its ledger entry's (`op_ledger`, written
-- by `dfit collect` from dfit_mlir.analysis.ledger, never re-derived here): its share of its
-- dispatch's measured time under the ledger's time model, so an elementwise op fused
-- into a matmul's dispatch gets what it adds to the dispatch, not nothing, and the ops of
-- a dispatch sum to the dispatch's time. attributed_share: of the model's attributed time on that
-- backend (the ledger's SHARE_BASIS: every share `dfit analyze` and `dfit view` print is of it).
-- events: the dispatch calls running the location's ops (a call that runs several of
-- them counts once). Only ops of dispatches that ran (calls > 0).
-- Nothing is rounded here: DuckDB and Spark round a double differently (ROUND(17007157.95, 1)
-- is 17007157.9 on DuckDB, not on Spark); `dfit query` rounds when it prints.
-- Parameters: limit (rows).
WITH located AS (
    SELECT backend, model, run, op_id, partition, calls, time_ns,
           COALESCE(module_path, source_file || ':' || CAST(source_line AS STRING), op_id) AS location,
           CASE WHEN module_path IS NOT NULL THEN 'module_path'
                WHEN source_file IS NOT NULL AND source_line IS NOT NULL THEN 'source_line'
                ELSE 'op' END AS located_by
    FROM op_ledger
    WHERE calls > 0
),
called AS (  -- one row per (run, dispatch) of a location: its calls counted once
    SELECT DISTINCT backend, model, run, location, located_by, partition, calls
    FROM located
),
per_call AS (
    SELECT backend, model, location, located_by, CAST(SUM(calls) AS BIGINT) AS events
    FROM called
    GROUP BY backend, model, location, located_by
),
per_location AS (
    SELECT backend, model, location, located_by,
           COUNT(DISTINCT run) AS runs,
           COUNT(DISTINCT op_id) AS ops,
           CAST(SUM(time_ns) AS BIGINT) AS total_ns
    FROM located
    GROUP BY backend, model, location, located_by
)
SELECT p.backend, p.model, p.location, p.located_by, p.runs, c.events, p.ops, p.total_ns,
       CAST(p.total_ns AS DOUBLE) / NULLIF(c.events, 0) AS mean_ns,
       CAST(p.total_ns AS DOUBLE) / NULLIF(SUM(p.total_ns) OVER (PARTITION BY p.backend, p.model), 0) AS attributed_share
FROM per_location p
JOIN per_call c ON c.backend = p.backend AND c.model = p.model AND c.location = p.location
                AND c.located_by = p.located_by
ORDER BY total_ns DESC NULLS LAST, backend NULLS LAST, model NULLS LAST, location NULLS LAST
LIMIT ${limit}
