-- regressions: per stable ID, time per invocation of the run in the candidate's runs against the
-- baseline's, reported only where the change is outside the runs' spread: the two sets
-- of runs do not overlap, the gap between their means exceeds the wider of the two
-- ranges, and it exceeds `threshold` of the baseline (noise of repeated runs).
-- IDs with fewer than `min_runs` runs on either side are left out (their spread is unknown).
-- An ID's time in a run is its ledger entries' (`op_ledger`, see top-sites): its share of
-- the dispatches it runs in, so every op of a slower dispatch is reported, each by its share.
-- Parameters: baseline, candidate (labels given to `dfit collect --label`), min_runs, threshold.
WITH chosen AS (
    SELECT run, backend, model, label FROM runs WHERE label IN (${baseline}, ${candidate})
),
per_run AS (  -- a run's time for an ID is per invocation (runs may repeat a different number of
              -- times): op_ledger holds each entry's time and the run's invocations
    SELECT o.backend, o.model, c.label, o.run, o.op_id,
           CAST(SUM(o.time_ns) AS DOUBLE) / MAX(o.run_instances) AS ns
    FROM op_ledger o
    JOIN chosen c ON c.run = o.run AND c.backend = o.backend AND c.model = o.model
    WHERE o.calls > 0 AND o.run_instances > 0
    GROUP BY o.backend, o.model, c.label, o.run, o.op_id
    HAVING SUM(o.time_ns) > 0
),
per_label AS (
    SELECT backend, model, label, op_id, COUNT(*) AS runs,
           AVG(ns) AS mean_ns, MIN(ns) AS min_ns, MAX(ns) AS max_ns
    FROM per_run
    GROUP BY backend, model, label, op_id
),
paired AS (
    SELECT b.backend, b.model, b.op_id,
           b.runs AS baseline_runs, c.runs AS candidate_runs,
           b.mean_ns AS baseline_ns, c.mean_ns AS candidate_ns,
           b.min_ns AS baseline_min, b.max_ns AS baseline_max,
           c.min_ns AS candidate_min, c.max_ns AS candidate_max,
           GREATEST(b.max_ns - b.min_ns, c.max_ns - c.min_ns) AS spread_ns
    FROM per_label b
    JOIN per_label c ON c.backend = b.backend AND c.model = b.model AND c.op_id = b.op_id
    WHERE b.label = ${baseline} AND c.label = ${candidate}
)
SELECT backend, model, op_id, baseline_runs, candidate_runs,
       baseline_ns, candidate_ns, spread_ns,
       candidate_ns / baseline_ns AS ratio,  -- not rounded: the engines round doubles differently
       CASE WHEN candidate_ns > baseline_ns THEN 'slower' ELSE 'faster' END AS change
FROM paired
WHERE baseline_runs >= ${min_runs} AND candidate_runs >= ${min_runs}
  AND (candidate_min > baseline_max OR candidate_max < baseline_min)
  AND ABS(candidate_ns - baseline_ns) > spread_ns
  AND ABS(candidate_ns - baseline_ns) > ${threshold} * baseline_ns
ORDER BY ABS(candidate_ns / baseline_ns - 1) DESC NULLS LAST, backend NULLS LAST, model NULLS LAST,
         op_id NULLS LAST
