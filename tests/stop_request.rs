//! A stop request (Ctrl-C, SIGTERM) ends pass 1's kernel between its tiles,
//! not after the whole bank block, and the call says so: partial states are
//! never taken for finished ones (a checkpoint would keep them). A file of
//! its own, since the request is process-wide.

mod common;

use hubnorm::kernel::{column_statistics, ColumnStates, ColumnStatsRequest, Rows};
use hubnorm::HubnormError;

/// The states a call may change.
fn folded(states: &ColumnStates) -> (Vec<hubnorm::kernel::LogSumExp>, Vec<Vec<f32>>) {
    let tops = states.top.iter().map(|t| t.sorted()).collect();
    (states.lse.clone(), tops)
}

#[test]
fn a_stop_request_ends_pass_1_tiles_with_interrupted() {
    // Several strips on any thread count, several row tiles per strip.
    let (dim, bank_rows, gallery_rows) = (32, 1100, 5000);
    let mut rng = common::rng(1);
    let bank = common::random_table(&mut rng, "b", bank_rows, dim).data;
    let gallery = common::random_table(&mut rng, "g", gallery_rows, dim).data;
    let (bank, gallery) = (Rows::new(&bank, dim), Rows::new(&gallery, dim));
    let request = ColumnStatsRequest {
        betas: &[20.0],
        column_top_k: 5,
        ..ColumnStatsRequest::default()
    };
    let fresh = ColumnStates::new(gallery_rows, &request, bank_rows);
    let mut states = fresh.clone();

    hubnorm::cancel::request();
    let stopped = column_statistics(bank, gallery, 0, 0, &request, &mut states);
    hubnorm::cancel::reset();
    assert!(
        matches!(stopped, Err(HubnormError::Interrupted(_))),
        "{stopped:?}"
    );
    assert!(
        folded(&states) == folded(&fresh),
        "a tile was folded after the stop request"
    );

    column_statistics(bank, gallery, 0, 0, &request, &mut states).unwrap();
    assert!(folded(&states) != folded(&fresh), "the call folded nothing");
}
