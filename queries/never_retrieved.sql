-- Gallery items never retrieved (anti-hubs): for each method, the gallery
-- items that appear in no query's result list, with their text.
-- Reads: results (hubnorm run), gallery (the run's gallery input, with a `text` column).
-- Run:   hubnorm sql --run out/ --file queries/never_retrieved.sql
WITH methods AS (
    SELECT DISTINCT method FROM results
), retrieved AS (
    SELECT DISTINCT method, gallery_id FROM results
)
SELECT m.method, g.id AS gallery_id, g.text
FROM methods m
CROSS JOIN gallery g
LEFT JOIN retrieved r ON r.method = m.method AND r.gallery_id = g.id
WHERE r.gallery_id IS NULL
ORDER BY m.method, g.id;
