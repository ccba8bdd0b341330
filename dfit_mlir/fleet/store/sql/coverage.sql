-- coverage: what each backend exposed. Declared rows: the aspects the bundles' capability
-- descriptors and reconstruction coverage notes state (recovered / partial /
-- not-exposed / exposed), with how many runs said so. Observed rows: the events each
-- backend's runs actually hold, per kind: how many, how many timed, how many tied to a stable ID.
SELECT backend, aspect, status, COUNT(DISTINCT run) AS runs,
       CAST(NULL AS BIGINT) AS events, CAST(NULL AS BIGINT) AS timed, CAST(NULL AS BIGINT) AS with_id
FROM coverage
GROUP BY backend, aspect, status
UNION ALL
SELECT backend, 'events.' || kind AS aspect, 'observed' AS status, COUNT(DISTINCT run) AS runs,
       COUNT(*) AS events, COUNT(duration_ns) AS timed, COUNT(root_id) AS with_id
FROM events
GROUP BY backend, kind
ORDER BY backend NULLS LAST, aspect NULLS LAST, status NULLS LAST
