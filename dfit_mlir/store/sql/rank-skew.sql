-- rank-skew: per step of a multi-rank job, the slowest rank against the median rank.
-- A job is the runs of one backend and model under one label; a step is the event's
-- training step, else its program invocation. A rank's time for a step is the step
-- time it logged (metric `step_time`, seconds), else the span of its events in that step.
-- Only steps seen on two or more ranks are reported.
WITH placed AS (
    SELECT e.backend, e.model, COALESCE(r.label, '') AS label, e.rank,
           COALESCE(e.step, CAST(e.invocation AS BIGINT)) AS step,
           e.kind, e.name, e.value, e.start_ns, e.duration_ns
    FROM events e
    JOIN runs r ON r.run = e.run AND r.backend = e.backend AND r.model = e.model
    WHERE e.rank IS NOT NULL AND COALESCE(e.step, CAST(e.invocation AS BIGINT)) IS NOT NULL
),
per_rank AS (
    SELECT backend, model, label, step, rank,
           COALESCE(CAST(MAX(CASE WHEN kind = 'metric' AND name = 'step_time' THEN value * 1e9 END) AS BIGINT),
                    MAX(start_ns + duration_ns) - MIN(start_ns)) AS step_ns
    FROM placed
    GROUP BY backend, model, label, step, rank
),
ranked AS (
    SELECT backend, model, label, step, rank, step_ns,
           MAX(step_ns) OVER (PARTITION BY backend, model, label, step) AS slowest_ns
    FROM per_rank
    WHERE step_ns IS NOT NULL
)
SELECT backend, model, label, step,
       COUNT(*) AS ranks,
       MIN(CASE WHEN step_ns = slowest_ns THEN rank END) AS slowest_rank,
       MAX(step_ns) AS slowest_ns,
       CAST(median(step_ns) AS DOUBLE) AS median_ns,
       MIN(step_ns) AS fastest_ns,
       ROUND(MAX(step_ns) / CAST(median(step_ns) AS DOUBLE), 3) AS skew
FROM ranked
GROUP BY backend, model, label, step
HAVING COUNT(*) >= 2
ORDER BY backend NULLS LAST, model NULLS LAST, label NULLS LAST, step NULLS LAST
