-- rank-skew: in a multi-rank job, the slowest rank against the median rank, on every
-- measure the ranks record: per step where they log steps, else per run.
--
-- A job is the runs of one backend and model under one label. A rank is the event's rank
-- (collect --rank, or the reader's tag), else the task (pid) that logged it: the tasks of a
-- data-parallel log (SambaFlow 1.17 names no rank, only a "Process ID"). Compile events
-- are not a rank's work and are left out.
--
-- measure (what was compared; unit `ns` unless a rate):
--   step_time       per step: the step time the rank logged (metric step_time, seconds)
--   step_span       per step, else per program invocation: the span of the rank's timed events in it
--   KIND:NAME[:PHASE]  per run, for records of no step: a phase or figure of each rank's whole
--                   run (the time of events of that kind and name, their `phase` attribute
--                   told apart; a metric in seconds), or a rate (a metric whose unit ends in
--                   `/s`: the slowest rank has the lowest)
-- slowest/median/fastest are in `unit`; skew is how many times slower the slowest rank is
-- than the median (slowest / median for times, median / slowest for rates).
--
-- A measure no step of which two ranks report is not silently dropped: one row says which
-- rank reports it alone (`ranks` 1, `note`), so a job where only one task logs steps shows
-- that, beside the measures its tasks do share. `job_ranks` is the ranks the job's events name.
WITH placed AS (
    SELECT e.backend, e.model, COALESCE(r.label, '') AS label, e.host, e.rank, e.pid,
           COALESCE(e.step, CAST(e.invocation AS BIGINT)) AS step,
           e.kind, e.name, e.value, e.start_ns, e.duration_ns, e.attributes
    FROM events e
    JOIN runs r ON r.run = e.run AND r.backend = e.backend AND r.model = e.model
    WHERE (e.rank IS NOT NULL OR e.pid IS NOT NULL) AND e.kind <> 'compile'
),
per_step AS (
    -- Per event row only integer keys: names and texts are made once per rank and step.
    SELECT backend, model, label, host, rank, pid, step,
           CASE WHEN COUNT(CASE WHEN kind = 'metric' AND name = 'step_time' THEN 1 END) > 0
                THEN 'step_time' ELSE 'step_span' END AS measure,
           'ns' AS unit,
           COALESCE(CAST(MAX(CASE WHEN kind = 'metric' AND name = 'step_time' THEN value * 1e9 END) AS DOUBLE),
                    CAST(MAX(start_ns + duration_ns) - MIN(start_ns) AS DOUBLE)) AS amount
    FROM placed
    WHERE step IS NOT NULL
    GROUP BY backend, model, label, host, rank, pid, step
),
run_attributes AS (
    -- JSON is read only here: step records (most events of a long job) need none of it.
    SELECT backend, model, label, host, rank, pid, kind, name, value, duration_ns,
           get_json_object(attributes, '$$.unit') AS unit,
           get_json_object(attributes, '$$.phase') AS phase
    FROM placed
    WHERE step IS NULL
),
run_records AS (
    SELECT backend, model, label, host, rank, pid,
           kind || ':' || name || COALESCE(':' || phase, '') AS measure,
           CASE WHEN duration_ns IS NULL AND unit LIKE '%/s' THEN unit ELSE 'ns' END AS unit,
           CASE WHEN duration_ns IS NOT NULL THEN CAST(duration_ns AS DOUBLE)
                WHEN kind = 'metric' AND unit = 's' THEN value * 1e9
                WHEN kind = 'metric' AND unit LIKE '%/s' THEN value END AS amount
    FROM run_attributes
),
per_run AS (
    -- A rank's time in a phase is the sum of its events' times; a rate, their mean.
    SELECT backend, model, label, host, rank, pid, CAST(NULL AS BIGINT) AS step, measure, unit,
           CASE WHEN unit = 'ns' THEN SUM(amount) ELSE AVG(amount) END AS amount
    FROM run_records
    GROUP BY backend, model, label, host, rank, pid, measure, unit
),
every_record AS (
    SELECT backend, model, label, host, rank, pid, step, measure, unit, amount FROM per_step
    UNION ALL
    SELECT backend, model, label, host, rank, pid, step, measure, unit, amount FROM per_run
),
jobs AS (
    -- Every rank or task the job's events name, timed or not.
    SELECT backend, model, label,
           COUNT(DISTINCT COALESCE(host, '') || '|' || COALESCE(CAST(rank AS STRING), '') || '|'
                          || COALESCE(CAST(pid AS STRING), '')) AS job_ranks
    FROM every_record
    GROUP BY backend, model, label
),
ordered AS (
    SELECT m.*,
           COALESCE('rank ' || CAST(rank AS STRING), 'pid ' || CAST(pid AS STRING)) AS who,
           ROW_NUMBER() OVER (PARTITION BY backend, model, label, measure, unit, step
                              ORDER BY CASE WHEN unit = 'ns' THEN amount ELSE -amount END DESC,
                                       rank NULLS LAST, pid NULLS LAST, host NULLS LAST) AS place,
           COUNT(*) OVER (PARTITION BY backend, model, label, measure, unit, step) AS reporting
    FROM every_record m
    WHERE amount IS NOT NULL
),
compared AS (
    SELECT backend, model, label, measure, unit, step,
           COUNT(*) AS ranks,
           MAX(CASE WHEN place = 1 THEN rank END) AS slowest_rank,
           MAX(CASE WHEN place = 1 THEN pid END) AS slowest_pid,
           CASE WHEN MAX(unit) = 'ns' THEN MAX(amount) ELSE MIN(amount) END AS slowest,
           CAST(median(amount) AS DOUBLE) AS median,
           CASE WHEN MAX(unit) = 'ns' THEN MIN(amount) ELSE MAX(amount) END AS fastest
    FROM ordered
    WHERE reporting >= 2
    GROUP BY backend, model, label, measure, unit, step
),
alone AS (
    -- Measures no step (or run) of which two ranks report: who reports them, over how many steps.
    SELECT backend, model, label, measure, unit,
           MIN(who) AS who, MIN(rank) AS rank, MIN(pid) AS pid,
           COUNT(DISTINCT COALESCE(host, '') || '|' || who) AS reporters,
           COUNT(step) AS steps
    FROM ordered
    GROUP BY backend, model, label, measure, unit
    HAVING MAX(reporting) = 1
)
SELECT c.backend, c.model, c.label, c.measure, c.unit, c.step, c.ranks, j.job_ranks,
       c.slowest_rank, c.slowest_pid, c.slowest, c.median, c.fastest,
       CASE WHEN c.unit = 'ns' THEN c.slowest / c.median ELSE c.median / c.slowest END AS skew,  -- not rounded (see top-sites)
       CAST(NULL AS STRING) AS note
FROM compared c
JOIN jobs j ON j.backend = c.backend AND j.model = c.model AND j.label = c.label
UNION ALL
SELECT a.backend, a.model, a.label, a.measure, a.unit, CAST(NULL AS BIGINT) AS step,
       1 AS ranks, j.job_ranks,
       CASE WHEN a.reporters = 1 THEN a.rank END AS slowest_rank,
       CASE WHEN a.reporters = 1 THEN a.pid END AS slowest_pid,
       CAST(NULL AS DOUBLE) AS slowest, CAST(NULL AS DOUBLE) AS median, CAST(NULL AS DOUBLE) AS fastest,
       CAST(NULL AS DOUBLE) AS skew,
       CASE WHEN a.reporters = 1
            THEN 'only ' || a.who || ' reports it'
                 || CASE WHEN a.steps > 0 THEN ' (' || CAST(a.steps AS STRING) || ' steps)' ELSE '' END
            ELSE 'no step of it is reported by two ranks (' || CAST(a.reporters AS STRING) || ' report some)'
       END
       || ' of the ' || CAST(j.job_ranks AS STRING) || ' ranks/tasks in the job: nothing to compare' AS note
FROM alone a
JOIN jobs j ON j.backend = a.backend AND j.model = a.model AND j.label = a.label
ORDER BY backend NULLS LAST, model NULLS LAST, label NULLS LAST, measure NULLS LAST, unit NULLS LAST, step NULLS LAST
