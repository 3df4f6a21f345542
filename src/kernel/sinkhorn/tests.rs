//! The sweeps against direct f64 sums, and the fused iteration against the
//! sweeps, bit for bit.

use super::*;
use crate::kernel::test_values::pseudo_random;

/// Both sweeps against direct f64 sums, with a cache filled and reused,
/// across tile edges in both directions.
#[test]
fn sweeps_match_direct_sums_and_the_cache_changes_nothing() {
    let dim = 6;
    let (nr, nc) = (TILE_ROWS + 5, TILE_COLS + 9);
    let a = pseudo_random(nr * dim, 3);
    let b = pseudo_random(nc * dim, 4);
    let row_shift = pseudo_random(nr, 5);
    let col_shift = pseudo_random(nc, 6);
    let inv_tau = 10.0f32;
    let s = |i: usize, j: usize| -> f64 {
        (0..dim)
            .map(|d| a[i * dim + d] as f64 * b[j * dim + d] as f64)
            .sum()
    };
    let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
    let mut cache = vec![0f32; nr * nc];
    let mut by_row = vec![LogSumExp::default(); nr];
    lse_sweep(
        rows,
        cols,
        TileSource::Fill(&mut cache),
        Sweep::Rows {
            col_shift: &col_shift,
            row_bound: None,
        },
        inv_tau,
        &mut by_row,
        &mut [],
    );
    let mut by_col = vec![LogSumExp::default(); nc];
    lse_sweep(
        rows,
        cols,
        TileSource::Cached(&cache),
        Sweep::Columns {
            row_shift: &row_shift,
        },
        inv_tau,
        &mut [],
        &mut by_col,
    );
    let mut by_col_computed = vec![LogSumExp::default(); nc];
    lse_sweep(
        rows,
        cols,
        TileSource::Compute,
        Sweep::Columns {
            row_shift: &row_shift,
        },
        inv_tau,
        &mut [],
        &mut by_col_computed,
    );
    assert_eq!(by_col, by_col_computed);
    for i in [0, 1, TILE_ROWS - 1, TILE_ROWS, nr - 1] {
        let mut direct = LogSumExp::default();
        (0..nc).for_each(|j| direct.push((s(i, j) - col_shift[j] as f64) * inv_tau as f64));
        assert!((by_row[i].value() - direct.value()).abs() < 1e-4, "row {i}");
    }
    for j in [0, 1, TILE_COLS - 1, TILE_COLS, nc - 1] {
        let mut direct = LogSumExp::default();
        (0..nr).for_each(|i| direct.push((s(i, j) - row_shift[i] as f64) * inv_tau as f64));
        assert!(
            (by_col[j].value() - direct.value()).abs() < 1e-4,
            "column {j}"
        );
    }
}

/// One iteration's source update and weighted target update, computed
/// four ways (row sweep filling the cache or reading it, then a weighted
/// column sweep recomputed or cached, and the fused pass over cached
/// groups), asserted bit-identical. Returns the row states, their strip
/// states `[strip][row]` and the column states.
struct Iteration {
    rows: Vec<LogSumExp>,
    strips: Vec<Vec<LogSumExp>>,
    cols: Vec<LogSumExp>,
}

fn iterate_four_ways(
    (a, b, dim): (&[f32], &[f32], usize),
    cache: &mut [f32],
    f: &[f32],
    bounds: Option<&[Vec<f32>]>,
    inv_tau: f32,
    log_mass: &(dyn Fn(&LogSumExp) -> f64 + Sync),
) -> Iteration {
    let (rows, cols) = (Rows::new(a, dim), Rows::new(b, dim));
    let (nr, nc) = (rows.rows, cols.rows);
    let bound_slices: Option<Vec<&[f32]>> = bounds.map(|b| b.iter().map(Vec::as_slice).collect());
    let row_sweep = Sweep::Rows {
        col_shift: f,
        row_bound: bound_slices.as_deref(),
    };
    let mut by_row = vec![LogSumExp::default(); nr];
    let strip_states = lse_sweep(
        rows,
        cols,
        TileSource::Fill(cache),
        row_sweep,
        inv_tau,
        &mut by_row,
        &mut [],
    );
    let mut by_row_cached = vec![LogSumExp::default(); nr];
    let cached_states = lse_sweep(
        rows,
        cols,
        TileSource::Cached(cache),
        row_sweep,
        inv_tau,
        &mut by_row_cached,
        &mut [],
    );
    assert_eq!(by_row, by_row_cached);
    assert_eq!(strip_states, cached_states);

    let masses: Vec<f64> = by_row.iter().map(log_mass).collect();
    let shifts: Vec<Vec<f32>> = strip_states
        .iter()
        .map(|strip| strip.iter().map(|s| s.max as f32).collect())
        .collect();
    let weights = RowWeight::per_strip(shifts.iter().map(Vec::as_slice), &masses);
    let weight_slices: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
    let weighted = Sweep::WeightedColumns {
        col_shift: f,
        weights: &weight_slices,
    };
    let mut by_col = vec![LogSumExp::default(); nc];
    let computed = TileSource::Compute;
    lse_sweep(
        rows,
        cols,
        computed,
        weighted,
        inv_tau,
        &mut [],
        &mut by_col,
    );
    let mut by_col_cached = vec![LogSumExp::default(); nc];
    let cached = TileSource::Cached(cache);
    lse_sweep(
        rows,
        cols,
        cached,
        weighted,
        inv_tau,
        &mut [],
        &mut by_col_cached,
    );
    assert_eq!(by_col, by_col_cached);

    let mut sum = vec![0f64; nc];
    let mut fused_rows = Vec::new();
    let mut fused_strips = vec![Vec::new(); nc.div_ceil(TILE_COLS)];
    let mut partials = vec![0f32; fused_group_scratch(GROUP_ROWS, nc)];
    for g0 in (0..nr).step_by(GROUP_ROWS) {
        let g1 = (g0 + GROUP_ROWS).min(nr);
        let strips: Vec<StripRows<'_>> = (0..nc)
            .step_by(TILE_COLS)
            .enumerate()
            .map(|(strip, c0)| {
                let width = TILE_COLS.min(nc - c0);
                let base = c0 * nr;
                StripRows {
                    cells: &cache[base + g0 * width..base + g1 * width],
                    width,
                    first_col: c0,
                    bound: bounds.map(|b| &b[strip][g0..g1]),
                }
            })
            .collect();
        let group = fused_group(
            &strips,
            g1 - g0,
            f,
            inv_tau,
            log_mass,
            &mut partials,
            &mut sum,
        );
        fused_rows.extend(group.states);
        for (all, part) in fused_strips.iter_mut().zip(group.strips) {
            all.extend(part);
        }
    }
    assert_eq!(fused_rows, by_row);
    assert_eq!(fused_strips, strip_states);
    let swept_sums: Vec<f64> = by_col.iter().map(|c| c.sum).collect();
    assert_eq!(sum, swept_sums);
    Iteration {
        rows: by_row,
        strips: strip_states,
        cols: by_col,
    }
}

/// The fused iteration over cached strips gives the same bits as a row
/// sweep followed by a weighted column sweep with the new potentials
/// (cached and recomputed), for groups that end mid-tile and strips of
/// uneven width, with and without bounds on the rows' maxima; the
/// weighted column update equals the exact one, and bounded row updates
/// equal exact ones.
#[test]
fn fused_group_equals_a_row_sweep_then_a_column_sweep() {
    let dim = 5;
    let (nr, nc) = (2 * GROUP_ROWS + 37, 2 * TILE_COLS + 300);
    let a = pseudo_random(nr * dim, 13);
    let b = pseudo_random(nc * dim, 14);
    let f: Vec<f32> = pseudo_random(nc, 15).iter().map(|v| v * 0.1).collect();
    let inv_tau = 40.0f32;
    let log_m = (nr as f64).ln();
    let log_mass = |s: &LogSumExp| s.value() + log_m;
    let mut cache = vec![0f32; nr * nc];
    let tables = (a.as_slice(), b.as_slice(), dim);
    let first = iterate_four_ways(tables, &mut cache, &f, None, inv_tau, &log_mass);

    // The exact column update with g as f32 shifts, as the fallback runs it.
    let g: Vec<f32> = first
        .rows
        .iter()
        .map(|s| (log_mass(s) / inv_tau as f64) as f32)
        .collect();
    let mut exact = vec![LogSumExp::default(); nc];
    let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
    let columns = Sweep::Columns { row_shift: &g };
    let computed = TileSource::Compute;
    lse_sweep(rows, cols, computed, columns, inv_tau, &mut [], &mut exact);
    for (j, (w, e)) in first.cols.iter().zip(&exact).enumerate() {
        assert!(w.sum >= MIN_COLUMN_MASS, "column {j} mass {}", w.sum);
        assert!(
            (w.value() - e.value()).abs() < 1e-4,
            "column {j}: {} vs {}",
            w.value(),
            e.value()
        );
    }

    // A second iteration with new target shifts, bounded as
    // `bank::sinkhorn` bounds it: last LSE plus the largest fall of f.
    let f2: Vec<f32> = f
        .iter()
        .zip(pseudo_random(nc, 16))
        .map(|(&v, d)| v + 0.05 * d)
        .collect();
    let bounds: Vec<Vec<f32>> = first
        .strips
        .iter()
        .enumerate()
        .map(|(strip, states)| {
            let columns = strip * TILE_COLS..((strip + 1) * TILE_COLS).min(nc);
            let fall = columns
                .map(|j| (f[j] - f2[j]) * inv_tau)
                .fold(f32::NEG_INFINITY, f32::max);
            states.iter().map(|s| s.value() as f32 + fall).collect()
        })
        .collect();
    let bounded = iterate_four_ways(tables, &mut cache, &f2, Some(&bounds), inv_tau, &log_mass);
    let unbounded = iterate_four_ways(tables, &mut cache, &f2, None, inv_tau, &log_mass);
    let mut shifted_above_max = 0;
    for (strip, (b, u)) in bounded.strips.iter().zip(&unbounded.strips).enumerate() {
        for (row, (b, u)) in b.iter().zip(u).enumerate() {
            assert!(
                b.max >= u.max - 1e-4,
                "strip {strip} row {row}: bound below max"
            );
            shifted_above_max += usize::from(b.max > u.max);
        }
    }
    assert!(shifted_above_max > 0, "the bounds were used");
    for (r, (b, u)) in bounded.rows.iter().zip(&unbounded.rows).enumerate() {
        let (b, u) = (b.value(), u.value());
        assert!(
            (b - u).abs() < 1e-5 * u.abs().max(1.0),
            "row {r}: {b} vs {u}"
        );
    }
    for (j, (b, u)) in bounded.cols.iter().zip(&unbounded.cols).enumerate() {
        let (b, u) = (b.value(), u.value());
        assert!(
            (b - u).abs() < 1e-5 * u.abs().max(1.0),
            "column {j}: {b} vs {u}"
        );
    }

    // A bound far above the max (its exps would sum below
    // MIN_BOUNDED_SUM) is dropped for the exact max: the same bits.
    let loose: Vec<Vec<f32>> = bounds
        .iter()
        .map(|b| b.iter().map(|v| v + 60.0).collect())
        .collect();
    let redone = iterate_four_ways(tables, &mut cache, &f2, Some(&loose), inv_tau, &log_mass);
    assert_eq!(redone.rows, unbounded.rows);
    assert_eq!(redone.strips, unbounded.strips);
}

/// The three sweeps computed by the slab kernel (recomputed, and filling
/// the cache) give the bits of the same sweeps over the `gemm` crate's
/// whole tiles: the cache cell for cell, the row and strip states, both
/// column updates. Rows cross tile and slab edges, columns a strip edge
/// and a partial vector, the dimension a depth block. On a CPU without
/// AVX-512 both sides are the crate's.
#[test]
#[allow(clippy::print_stderr)] // a skipped comparison says so
fn sweeps_from_slabs_are_those_of_whole_tiles() {
    if SlabTiles::new().is_none() {
        eprintln!("no AVX-512 here: both sides are the crate's tiles");
    }
    let dim = 513;
    let (nr, nc) = (2 * TILE_ROWS + GROUP_ROWS + 37, TILE_COLS + 203);
    let a = pseudo_random(nr * dim, 7);
    let b = pseudo_random(nc * dim, 8);
    let f = pseudo_random(nc, 9);
    let g = pseudo_random(nr, 10);
    let inv_tau = 20.0f32;
    let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));

    // The crate's whole tiles, laid out as `TileSource::Fill` lays a cache.
    let mut whole = vec![0f32; nr * nc];
    for c0 in (0..nc).step_by(TILE_COLS) {
        let width = TILE_COLS.min(nc - c0);
        let strip = &mut whole[c0 * nr..(c0 + width) * nr];
        for r0 in (0..nr).step_by(TILE_ROWS) {
            let r1 = (r0 + TILE_ROWS).min(nr);
            similarity_tile(
                &mut strip[r0 * width..r1 * width],
                width,
                &a[r0 * dim..r1 * dim],
                r1 - r0,
                &b[c0 * dim..(c0 + width) * dim],
                width,
                dim,
            );
        }
    }

    let row_sweep = Sweep::Rows {
        col_shift: &f,
        row_bound: None,
    };
    let mut filled = vec![f32::NAN; nr * nc];
    let mut by_row = vec![LogSumExp::default(); nr];
    let fill = TileSource::Fill(&mut filled);
    let strips = lse_sweep(rows, cols, fill, row_sweep, inv_tau, &mut by_row, &mut []);
    let mut by_row_whole = vec![LogSumExp::default(); nr];
    let cached = TileSource::Cached(&whole);
    let strips_whole = lse_sweep(
        rows,
        cols,
        cached,
        row_sweep,
        inv_tau,
        &mut by_row_whole,
        &mut [],
    );
    if let Some(cell) = (0..nr * nc).find(|&c| filled[c].to_bits() != whole[c].to_bits()) {
        panic!("cache cell {cell}: {} vs {}", filled[cell], whole[cell]);
    }
    assert_same_states(&by_row, &by_row_whole, "rows");
    assert_eq!(strips.len(), 2);
    for (strip, whole) in strips.iter().zip(&strips_whole) {
        assert_same_states(strip, whole, "a strip's rows");
    }

    let shifts: Vec<Vec<f32>> = strips
        .iter()
        .map(|strip| strip.iter().map(|s| s.max as f32).collect())
        .collect();
    let masses: Vec<f64> = g.iter().map(|&x| x as f64).collect();
    let weights = RowWeight::per_strip(shifts.iter().map(Vec::as_slice), &masses);
    let weight_slices: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
    let column_sweeps = [
        ("exact", Sweep::Columns { row_shift: &g }),
        (
            "weighted",
            Sweep::WeightedColumns {
                col_shift: &f,
                weights: &weight_slices,
            },
        ),
    ];
    for (name, sweep) in column_sweeps {
        let mut by_col = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Compute,
            sweep,
            inv_tau,
            &mut [],
            &mut by_col,
        );
        let mut by_col_whole = vec![LogSumExp::default(); nc];
        let cached = TileSource::Cached(&whole);
        lse_sweep(
            rows,
            cols,
            cached,
            sweep,
            inv_tau,
            &mut [],
            &mut by_col_whole,
        );
        assert_same_states(&by_col, &by_col_whole, name);
    }
}

/// Panics at the first state whose bits differ.
fn assert_same_states(got: &[LogSumExp], expected: &[LogSumExp], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: counts");
    let same = |a: &LogSumExp, b: &LogSumExp| {
        a.max.to_bits() == b.max.to_bits() && a.sum.to_bits() == b.sum.to_bits()
    };
    if let Some(i) = (0..got.len()).find(|&i| !same(&got[i], &expected[i])) {
        panic!("{what}, state {i}: {:?} vs {:?}", got[i], expected[i]);
    }
}
