-- Recall by method: R@1, R@5 and R@10 (the fraction of queries whose target
-- is within the first K results) and MRR@10, over every query (queries whose
-- target is not in the top-10 count as misses).
-- Reads: results (hubnorm run, k ≥ 10), queries (with `target_id`).
-- Run:   hubnorm sql --run out/ --file queries/recall_by_method.sql
WITH hits AS (
    SELECT r.method, r.query_id, MIN(r.rank) AS hit_rank
    FROM results r
    JOIN queries q ON q.id = r.query_id AND r.gallery_id = q.target_id
    GROUP BY r.method, r.query_id
), methods AS (
    SELECT DISTINCT method FROM results
), n AS (
    SELECT CAST(COUNT(*) AS DOUBLE) AS queries FROM queries
)
SELECT m.method,
       SUM(CASE WHEN h.hit_rank <= 1 THEN 1 ELSE 0 END) / n.queries  AS r_at_1,
       SUM(CASE WHEN h.hit_rank <= 5 THEN 1 ELSE 0 END) / n.queries  AS r_at_5,
       SUM(CASE WHEN h.hit_rank <= 10 THEN 1 ELSE 0 END) / n.queries AS r_at_10,
       SUM(CASE WHEN h.hit_rank <= 10 THEN 1.0 / h.hit_rank ELSE 0 END) / n.queries AS mrr_at_10
FROM methods m
CROSS JOIN n
LEFT JOIN hits h ON h.method = m.method
GROUP BY m.method, n.queries
ORDER BY r_at_1 DESC, m.method;
