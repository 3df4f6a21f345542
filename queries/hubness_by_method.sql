-- Hubness summary per method: skewness, maximum, Robin Hood index, Gini and
-- anti-hub rate of the k-occurrence at k = 10 (REPORTS.md), computed in SQL
-- by the hub_hubness aggregate; items never retrieved count as 0.
-- Reads: results (hubnorm run), gallery (only its row count).
-- Run:   hubnorm sql --run out/ --file queries/hubness_by_method.sql
WITH n AS (SELECT COUNT(*) AS gallery_size FROM gallery)
SELECT method,
       hub_hubness(gallery_id, 'skewness', 10, gallery_size)     AS skewness,
       hub_hubness(gallery_id, 'max', 10, gallery_size)          AS max_occurrence,
       hub_hubness(gallery_id, 'robin_hood', 10, gallery_size)   AS robin_hood,
       hub_hubness(gallery_id, 'gini', 10, gallery_size)         AS gini,
       hub_hubness(gallery_id, 'antihub_rate', 10, gallery_size) AS antihub_rate
FROM results CROSS JOIN n
WHERE rank <= 10
GROUP BY method
ORDER BY skewness;
