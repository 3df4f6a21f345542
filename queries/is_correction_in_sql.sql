-- The inverted-softmax correction recomputed in SQL from a long-format
-- similarity table, next to the native pass's value: hub_is_correction is the
-- same mergeable statistic as pass 1, so the difference is float rounding.
-- Reads: bank and gallery (the run's inputs; cosine, as the run normalises
--        rows by default), gallery_stats (hubnorm run with is, β = 20).
-- Run:   hubnorm sql --run out/ --file queries/is_correction_in_sql.sql
WITH bank_sims AS (
    SELECT g.id AS gallery_id, hub_cosine(b.embedding, g.embedding) AS score
    FROM bank b CROSS JOIN gallery g
), in_sql AS (
    SELECT gallery_id, hub_is_correction(score, 20.0) AS correction
    FROM bank_sims
    GROUP BY gallery_id
)
SELECT COUNT(*)                                          AS gallery_items,
       MAX(ABS(s.correction - n."is_beta20_correction")) AS max_abs_difference
FROM in_sql s
JOIN gallery_stats n ON n.gallery_id = s.gallery_id;
