-- op_totals: the rollup table the named reports read (store layout 1.1), one row per
-- bundle and root op of its timed events (root_id and duration_ns not null).
-- One text for three uses: `dfit collect` runs it on DuckDB over each bundle's new
-- events.parquet and stores the rows as op_totals.parquet; the engines (DuckDB and
-- Spark) run it over `events` for the bundles a 1.0 layout wrote without that file;
-- tests check the stored rows against it. ${source}: a relation with the events'
-- columns and backend, model, run.
WITH per_op AS (  -- ${source} is named twice, not shared through one CTE: engines
                  -- materialize a CTE read twice, every event of it
    SELECT backend, model, run, root_id,
           COUNT(*) AS events,
           CAST(SUM(duration_ns) AS BIGINT) AS total_ns,
           MIN(duration_ns) AS min_ns,
           MAX(duration_ns) AS max_ns,
           SUM(CAST(duration_ns AS DOUBLE) * CAST(duration_ns AS DOUBLE)) AS sumsq_ns
    FROM ${source}
    WHERE root_id IS NOT NULL AND duration_ns IS NOT NULL
    GROUP BY backend, model, run, root_id
),
instances AS (  -- a run's invocations (else steps): what regressions divides its totals by
    SELECT backend, model, run, COUNT(DISTINCT COALESCE(CAST(invocation AS BIGINT), step, 0)) AS run_instances
    FROM ${source}
    WHERE root_id IS NOT NULL AND duration_ns IS NOT NULL
    GROUP BY backend, model, run
)
SELECT p.backend, p.model, p.run, p.root_id, p.events, p.total_ns, p.min_ns, p.max_ns, p.sumsq_ns,
       i.run_instances
FROM per_op p
JOIN instances i ON i.run = p.run AND i.backend = p.backend AND i.model = p.model
