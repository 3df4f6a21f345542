-- Queries whose top-1 changed between two methods (edit `pair` to choose
-- them; by default the baseline `none` and `is`), with the query text, both
-- top-1 items and whether the new one is the ground truth.
-- Reads: results (hubnorm run, with both methods), queries (with `text` and `target_id`).
-- Run:   hubnorm sql --run out/ --file queries/top1_changed.sql
WITH pair AS (
    SELECT 'none' AS before_method, 'is' AS after_method
), top1 AS (
    SELECT method, query_id, gallery_id FROM results WHERE rank = 1
)
SELECT b.query_id,
       q.text                      AS query_text,
       b.gallery_id                AS before_top1,
       a.gallery_id                AS after_top1,
       q.target_id,
       b.gallery_id = q.target_id  AS before_correct,
       a.gallery_id = q.target_id  AS after_correct
FROM pair
JOIN top1 b ON b.method = pair.before_method
JOIN top1 a ON a.method = pair.after_method AND a.query_id = b.query_id
JOIN queries q ON q.id = b.query_id
WHERE a.gallery_id <> b.gallery_id
ORDER BY b.query_id;
