//! Ground truth: resolving `target_id` values to gallery rows, and the score
//! of the best positive under each method.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::DataType;

use crate::cache::TableBlocks;
use crate::error::Result;
use crate::ids::{id_at, IdIndex};
use crate::kernel::gemm::TileScorer;
use crate::kernel::Positives;
use crate::query::method::{QueryGaussian, Scoring};
use crate::source::{EmbeddingBlock, EmbeddingTable};

/// Gallery rows of each query's ground truth in `block` (empty lists when the
/// table has no target column). An id missing from the gallery is an input
/// error naming the query file, row and column.
pub fn resolve_targets(
    block: &EmbeddingBlock,
    queries: &EmbeddingTable,
    index: &IdIndex,
) -> Result<Positives> {
    let Some(targets) = &block.targets else {
        return Ok(Positives::none(block.rows));
    };
    let column = &queries.options().target_column;
    // With --skip-missing a query keeps the targets that are in the gallery;
    // one left with none has no ground truth and is counted as skipped.
    let skip_missing = queries.options().skip_missing_targets;
    let id_type = index.ids().data_type().clone();
    // `given`: a query's target ids as the file has them; `values`: the
    // same cast to the gallery's id type (null where a value does not cast).
    let lookup = |given: &ArrayRef, values: &ArrayRef, row: usize| -> Result<Vec<u32>> {
        let mut rows = Vec::with_capacity(values.len());
        for i in 0..values.len() {
            let global = block.first_row + row as u64;
            if given.is_null(i) && skip_missing {
                continue;
            }
            if given.is_null(i) {
                return Err(queries.row_error(
                    global,
                    column,
                    "null target id (pass --skip-missing to skip queries without a target)",
                ));
            }
            if values.is_null(i) {
                let shown = arrow::util::display::array_value_to_string(given, i)
                    .unwrap_or_else(|_| "this".into());
                return Err(queries.row_error(
                    global,
                    column,
                    format!(
                        "target id {shown} ({}) cannot be matched with the gallery's ids ({id_type}): give the targets the ids' type",
                        given.data_type()
                    ),
                ));
            }
            let id = id_at(values.as_ref(), i);
            match index.find(id) {
                Some(g) => rows.push(g),
                None if skip_missing => {}
                None => {
                    return Err(queries.row_error(
                        global,
                        column,
                        format!("target {id} is not in the gallery (pass --skip-missing to skip such queries)"),
                    ))
                }
            }
        }
        if rows.is_empty() && !skip_missing {
            return Err(queries.row_error(
                block.first_row + row as u64,
                column,
                "empty list of targets",
            ));
        }
        // An id named twice is one target (and is taken out of its own rank
        // count once).
        rows.sort_unstable();
        rows.dedup();
        Ok(rows)
    };
    let mut lists = Vec::with_capacity(block.rows);
    match targets.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            for row in 0..block.rows {
                if targets.is_null(row) && skip_missing {
                    lists.push(Vec::new());
                    continue;
                }
                if targets.is_null(row) {
                    return Err(queries.row_error(
                        block.first_row + row as u64,
                        column,
                        "null target list (pass --skip-missing to skip queries without a target)",
                    ));
                }
                let values = match targets.data_type() {
                    DataType::List(_) => targets.as_list::<i32>().value(row),
                    _ => targets.as_list::<i64>().value(row),
                };
                lists.push(lookup(&values, &cast_ids(&values, &id_type)?, row)?);
            }
        }
        _ => {
            let all = cast_ids(targets, &id_type)?;
            for row in 0..block.rows {
                lists.push(lookup(&targets.slice(row, 1), &all.slice(row, 1), row)?);
            }
        }
    }
    Ok(Positives::from_lists(lists))
}

/// The similarity of query row `qv` and gallery row `gv` as pass 2's tiles
/// compute it: with their bits where [`TileScorer`] reproduces them
/// (whatever tile holds the pair), else the f64 dot product rounded to f32
/// (a system BLAS's tiles may differ from it in the last place).
fn tile_similarity(qv: &[f32], gv: &[f32]) -> f32 {
    match TileScorer::new(qv.len()) {
        Some(scorer) => {
            let mut s = [0f32];
            scorer.scores(&[(qv, gv)], &mut s);
            s[0]
        }
        None => qv
            .iter()
            .zip(gv)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum::<f64>() as f32,
    }
}

/// Keeps `(score, raw similarity)` in `slot` when it ranks before what the
/// slot holds under `scoring` (the first offered stays on a tie).
fn offer(slot: &mut Option<(f32, f32)>, (v, s): (f32, f32), scoring: &Scoring) {
    let better = match (*slot, scoring) {
        (None, _) => true,
        (Some((bv, bs)), Scoring::BankRank { .. }) => v > bv || (v == bv && s > bs),
        (Some((bv, _)), _) => v > bv,
    };
    if better {
        *slot = Some((v, s));
    }
}

/// Ids cast to the gallery's id type (unconvertible values become null).
fn cast_ids(values: &ArrayRef, id_type: &DataType) -> Result<ArrayRef> {
    if values.data_type() == id_type {
        Ok(values.clone())
    } else {
        Ok(arrow::compute::cast(values, id_type)?)
    }
}

/// For each query of `block` and each scoring, the (score, raw similarity)
/// of its best-ranked positive (None without ground truth). Only positive
/// rows are used: read alone when the gallery is streamed
/// ([`TableBlocks::rows_alone`]), else from the blocks the search reads
/// (its two halves at once when [`TableBlocks::fold_halves`] can). The
/// scores are computed as the kernel computes them: the similarity as the
/// search's tiles have it (`tile_similarity`), then the scoring's f32
/// arithmetic.
/// `query_parameters` holds each scoring's per-query parameters for the
/// block ([`Scoring::query_parameters`]).
pub fn target_scores(
    block: &EmbeddingBlock,
    positives: &Positives,
    gallery: &mut TableBlocks,
    scorings: &[Scoring],
    query_parameters: &[Vec<QueryGaussian>],
) -> Result<Vec<Option<(f32, f32)>>> {
    let nm = scorings.len();
    // (gallery row, query) pairs in gallery order.
    let mut wanted: Vec<(u32, u32)> = (0..block.rows)
        .flat_map(|q| positives.of(q).iter().map(move |&g| (g, q as u32)))
        .collect();
    if wanted.is_empty() {
        return Ok(vec![None; block.rows * nm]);
    }
    wanted.sort_unstable();
    let dim = block.dim;
    // Offers the pairs of a gallery row, whose embedding is `gv`.
    let offer_row = |best: &mut Vec<Option<(f32, f32)>>, pairs: &[(u32, u32)], gv: &[f32]| {
        for &(g, q) in pairs {
            let (g, q) = (g as usize, q as usize);
            let qv = &block.data[q * dim..(q + 1) * dim];
            let s = tile_similarity(qv, gv);
            for (m, scoring) in scorings.iter().enumerate() {
                let v = scoring
                    .columns(g, g + 1)
                    .with_queries(&query_parameters[m])
                    .for_query(q)
                    .score(0, s);
                offer(&mut best[q * nm + m], (v, s), scoring);
            }
        }
    };
    if let Some(best) = scores_from_rows_alone(gallery, &wanted, block.rows * nm, &offer_row) {
        return Ok(best);
    }
    let halves = gallery.fold_halves(
        || vec![None; block.rows * nm],
        |best: &mut Vec<Option<(f32, f32)>>, g_block| {
            let (first, end) = (g_block.first_row, g_block.first_row + g_block.rows as u64);
            let mut at = wanted.partition_point(|&(g, _)| (g as u64) < first);
            let to = wanted.partition_point(|&(g, _)| (g as u64) < end);
            while at < to {
                let g = wanted[at].0;
                let same = at + wanted[at..to].partition_point(|&(r, _)| r == g);
                let local = (g as u64 - first) as usize;
                let gv = &g_block.data[local * dim..(local + 1) * dim];
                offer_row(best, &wanted[at..same], gv);
                at = same;
            }
            Ok(())
        },
    )?;
    // Later halves hold later gallery rows: merged in order, they keep the
    // earlier row on a tie as one pass in gallery order does.
    let mut halves = halves.into_iter();
    let mut best = halves.next().expect("at least one state");
    for later in halves {
        for (at, found) in later.into_iter().enumerate() {
            if let Some(found) = found {
                offer(&mut best[at], found, &scorings[at % nm]);
            }
        }
    }
    Ok(best)
}

/// [`target_scores`]'s states from the positive rows read alone, a
/// block's worth of rows at a time (the room the search's blocks take
/// later), in gallery order; `None` when the gallery cannot be read so.
fn scores_from_rows_alone(
    gallery: &TableBlocks,
    wanted: &[(u32, u32)],
    states: usize,
    offer_row: &impl Fn(&mut Vec<Option<(f32, f32)>>, &[(u32, u32)], &[f32]),
) -> Option<Vec<Option<(f32, f32)>>> {
    let block_rows = gallery.block_rows();
    let mut rows: Vec<u64> = wanted.iter().map(|&(g, _)| g as u64).collect();
    rows.dedup();
    let mut best = vec![None; states];
    let mut at = 0;
    for chunk in rows.chunks(block_rows) {
        let vectors = gallery.rows_alone(chunk)?;
        let dim = vectors.len() / chunk.len();
        for (&g, gv) in chunk.iter().zip(vectors.chunks_exact(dim.max(1))) {
            let same = at + wanted[at..].partition_point(|&(r, _)| r as u64 == g);
            offer_row(&mut best, &wanted[at..same], gv);
            at = same;
        }
    }
    Some(best)
}
