-- Top hubs: for each method, the five gallery items that appear most often in
-- the top-10 lists (their k-occurrence N_10), with their text.
-- Reads: results (hubnorm run), gallery (the run's gallery input, with a `text` column).
-- Run:   hubnorm sql --run out/ --file queries/top_hubs.sql
WITH occurrence AS (
    SELECT method, gallery_id, COUNT(*) AS k_occurrence
    FROM results
    WHERE rank <= 10
    GROUP BY method, gallery_id
), ranked AS (
    SELECT method, gallery_id, k_occurrence,
           ROW_NUMBER() OVER (PARTITION BY method ORDER BY k_occurrence DESC, gallery_id) AS hub_rank
    FROM occurrence
)
SELECT r.method, r.hub_rank, r.gallery_id, g.text, r.k_occurrence
FROM ranked r
JOIN gallery g ON g.id = r.gallery_id
WHERE r.hub_rank <= 5
ORDER BY r.method, r.hub_rank;
