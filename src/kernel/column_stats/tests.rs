//! Pass 1's statistics against direct sums, and the slab kernel's
//! against whole tiles, bit for bit.

use super::*;

fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

#[test]
fn strips_cover_the_columns_in_balanced_blocks() {
    for (columns, threads) in [
        (100_000, 2),
        (25_000, 2),
        (1_000_000, 2),
        (7_777, 3),
        (100, 2),
        (1, 2),
        (5_000, 1),
    ] {
        let bounds = strip_bounds(columns, threads);
        let strips = bounds.len() - 1;
        assert_eq!((bounds[0], bounds[strips]), (0, columns));
        for w in bounds.windows(2) {
            assert!(
                w[0] < w[1] && w[1] - w[0] <= BANK_TILE_COLS,
                "{columns}: {w:?}"
            );
            assert_eq!(w[0] % FOLD_COLUMNS, 0);
        }
        if columns >= threads * FOLD_COLUMNS * 8 {
            assert_eq!(
                strips % threads,
                0,
                "{columns} columns on {threads} threads"
            );
        }
    }
    // 49 strips of 2048 columns before; now an even count.
    assert_eq!(strip_bounds(100_000, 2).len() - 1, 224);
}

#[test]
fn column_lse_bits_do_not_depend_on_the_fold_block() {
    // Of 147 columns, 128..144 are folded as one vector and 144..147 one
    // by one (the tail after two 64-column blocks); starting the columns
    // at 19 puts them all in full blocks.
    let (nr, nc, dim) = (GROUP_ROWS + 9, 147, 7);
    let a = pseudo_random(nr * dim, 3);
    let b = pseudo_random(nc * dim, 4);
    let betas = [20.0f32];
    let mut all = vec![LogSumExp::default(); nc];
    column_log_sum_exp(Rows::new(&a, dim), Rows::new(&b, dim), &betas, &mut all).unwrap();
    let mut shifted = vec![LogSumExp::default(); nc - 19];
    let b_from_19 = &b[19 * dim..];
    column_log_sum_exp(
        Rows::new(&a, dim),
        Rows::new(b_from_19, dim),
        &betas,
        &mut shifted,
    )
    .unwrap();
    assert_eq!(&all[19..], &shifted[..]);
}

#[test]
fn column_lse_matches_direct_sum_across_tile_edges() {
    let dim = 5;
    let (nr, nc) = (BANK_TILE_ROWS + 3, 2 * BANK_TILE_COLS + 17);
    let a = pseudo_random(nr * dim, 1);
    let b = pseudo_random(nc * dim, 2);
    let betas = [1.0f32, 20.0];
    let mut states = vec![LogSumExp::default(); nc * 2];
    column_log_sum_exp(Rows::new(&a, dim), Rows::new(&b, dim), &betas, &mut states).unwrap();
    for j in [0, 1, 63, 64, 383, 384, 447, 448, 511, 512, nc - 1] {
        for (bi, &beta) in betas.iter().enumerate() {
            let mut direct = LogSumExp::default();
            for i in 0..nr {
                let s: f64 = (0..dim)
                    .map(|d| a[i * dim + d] as f64 * b[j * dim + d] as f64)
                    .sum();
                direct.push(beta as f64 * s);
            }
            let got = states[j * 2 + bi].value();
            assert!(
                (got - direct.value()).abs() < 1e-5,
                "col {j} β {beta}: {got} vs {}",
                direct.value()
            );
        }
    }
}

/// Every statistic pass 1 folds comes out bit for bit as from the
/// `gemm` crate's whole tiles folded in one piece: the slab kernel's
/// row groups, depth blocks and row offsets (tile and group edges
/// crossed by the rows, a last partial vector of columns) change
/// nothing. On a CPU without AVX-512 both sides are the crate's.
#[test]
#[allow(clippy::print_stderr)] // a skipped test says so
fn statistics_from_slabs_are_those_of_whole_tiles() {
    if SlabTiles::new().is_none() {
        eprintln!("no AVX-512 here: both sides are the crate's tiles");
    }
    let (nr, nc, dim) = (BANK_TILE_ROWS + 2 * GROUP_ROWS + 37, 203, 513);
    let (first_row, first_col) = (4096, 77);
    let a = pseudo_random(nr * dim, 5);
    let b = pseudo_random(nc * dim, 6);
    let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
    let request = ColumnStatsRequest {
        betas: &[1.0, 20.0],
        column_top_k: 5,
        column_top_rows: 3,
        keep_all: true,
        row_top_k: 4,
        ..ColumnStatsRequest::default()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut got = ColumnStates::new(nc, &request, nr);
    let got_rows = pool
        .install(|| column_statistics(rows, cols, first_row, first_col, &request, &mut got))
        .unwrap();

    let mut expected = ColumnStates::new(nc, &request, nr);
    let strip = StripStates {
        lse: &mut expected.lse,
        top: &mut expected.top,
        top_rows: &mut expected.top_rows,
        all: &mut expected.all,
    };
    let mut folds = StripFolds::new(nr, nc, (first_row, first_col), &request, strip);
    let mut buffer = TileBuffer::new(BANK_TILE_ROWS, nc);
    let ld = buffer.stride;
    for r0 in (0..nr).step_by(BANK_TILE_ROWS) {
        let r1 = (r0 + BANK_TILE_ROWS).min(nr);
        let tile = &mut buffer.cells_mut()[..(r1 - r0) * ld];
        let block = &a[r0 * dim..r1 * dim];
        similarity_tile(tile, ld, block, r1 - r0, &b, nc, dim);
        folds.fold(tile, ld, r0);
    }
    let expected_rows = folds.finish().expect("row tops asked for");

    let bits = |states: &[LogSumExp]| {
        let bits = |s: &LogSumExp| (s.max.to_bits(), s.sum.to_bits());
        states.iter().map(bits).collect::<Vec<_>>()
    };
    assert_eq!(bits(&got.lse), bits(&expected.lse));
    let all_bits = |all: &[Vec<f32>]| {
        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        all.iter().map(bits).collect::<Vec<_>>()
    };
    assert_eq!(all_bits(&got.all), all_bits(&expected.all));
    assert_eq!(got.top, expected.top);
    assert_eq!(got.top_rows, expected.top_rows);
    assert_eq!(got_rows, expected_rows);
}

/// A top-1 list given `row_best`'s column ends as one offered every column
/// in order (`scan_row`): the first of equal maxima (within a lane, across
/// lanes and vectors, in the tail past the last full vector), NaN never
/// kept, −0 and +0 equal, a list already holding an entry below, between
/// or above the row's values.
#[test]
fn row_best_keeps_what_the_scan_of_a_top_1_list_keeps() {
    let mut rows: Vec<Vec<f32>> = [
        (0, 1),
        (1, 2),
        (15, 3),
        (16, 4),
        (17, 5),
        (512, 6),
        (531, 7),
    ]
    .iter()
    .map(|&(n, seed)| pseudo_random(n, seed))
    .collect();
    // Few distinct values: maxima repeat in many lanes and vectors.
    for (n, seed) in [(200, 8), (37, 9), (512, 10), (64, 11), (19, 12)] {
        let coarse = pseudo_random(n, seed)
            .iter()
            .map(|x| (x * 4.0).round() / 4.0)
            .collect();
        rows.push(coarse);
    }
    let mut special = vec![0.0f32; 70];
    (special[3], special[20], special[40], special[66]) = (f32::NAN, -0.0, f32::NAN, 0.5);
    special[68] = 0.5;
    rows.extend([special, vec![f32::NAN; 40], vec![-0.0; 33]]);
    let bits = |top: &TopK| -> Vec<(u32, u32, u32)> {
        let entries = top.sorted().into_iter();
        entries
            .map(|c| (c.score.to_bits(), c.raw.to_bits(), c.row))
            .collect()
    };
    let mut compared = 0;
    for row in &rows {
        for kept in [None, Some(-1.0f32), Some(0.2), Some(0.0), Some(10.0)] {
            let fresh = || {
                let mut state = QueryState::new(1, None);
                if let Some(score) = kept {
                    state.top.push(Candidate {
                        score,
                        raw: score,
                        row: 9_999,
                    });
                }
                state
            };
            let mut scanned = fresh();
            scan_row(row, &vec![0.0; row.len()], 100, &mut scanned);
            let mut best = fresh();
            if let Some((j, score)) = row_best(row, best.top.threshold()) {
                let row = 100 + j as u32;
                best.top.push(Candidate {
                    score,
                    raw: score,
                    row,
                });
            }
            assert_eq!(
                bits(&best.top),
                bits(&scanned.top),
                "{row:?}, kept {kept:?}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, rows.len() * 5);
}
