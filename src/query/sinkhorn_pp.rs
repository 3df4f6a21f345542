//! The single-query Sinkhorn protocol (METHODS.md, `sinkhorn-pp`, after
//! Yakovlev et al. 2023).
//!
//! Each test query q is stacked with a fixed, seeded pseudo-test set of
//! m − 1 bank queries; T log-domain Sinkhorn iterations (row update, then
//! column update, uniform marginals) run on the m × n matrix s/τ, and the
//! gallery is ranked by q's row of the plan, i.e. by s(q, g) − f(g) with f
//! the column potential of *that* stack. Every query pays O(T·m·n): an
//! evaluation protocol for small galleries, refused above a size limit;
//! `sn` with a bank is the deployable approximation.

use rayon::prelude::*;

use crate::error::{HubnormError, Result};
use crate::kernel::gemm::similarity_tile;
use crate::kernel::{stack_column_potential, Candidate, Positives, QueryState};
use crate::method::SingleQuerySetup;
use crate::options::human_bytes;
use crate::source::EmbeddingTable;

/// Most exp evaluations a run may ask of the protocol (2·T·m·n per query):
/// about a minute or two on two cores.
pub const MAX_EXP_EVALUATIONS: f64 = 1.5e11;

/// Refuses a protocol run above [`MAX_EXP_EVALUATIONS`]: `queries` test
/// queries, each on an `m` × `n` stack for `iterations` iterations.
pub fn check_protocol_cost(queries: u64, m: usize, n: usize, iterations: usize) -> Result<()> {
    let evaluations = 2.0 * iterations as f64 * m as f64 * n as f64 * queries as f64;
    if evaluations > MAX_EXP_EVALUATIONS {
        return Err(HubnormError::Usage(format!(
            "sinkhorn-pp runs {iterations} Sinkhorn iterations on a {m} × {n} matrix for every one of the {queries} queries: {evaluations:.2e} exp evaluations, above the protocol's limit of {MAX_EXP_EVALUATIONS:.1e}. It is an evaluation protocol for small galleries; use --method sn (the same normalisation with a bank, computed once) or fewer queries or pseudo-queries"
        )));
    }
    Ok(())
}

/// The protocol's fixed inputs: the gallery and the pseudo-test set's
/// similarities with it, both in memory.
#[derive(Debug, Clone)]
pub struct SingleQuerySinkhorn {
    /// Queries whose similarities are computed in one GEMM.
    group: usize,
    tau: f64,
    iterations: usize,
    dim: usize,
    /// Gallery rows, row-major n × dim.
    gallery: Vec<f32>,
    n: usize,
    /// s(p, g) for the m − 1 pseudo-test queries, row-major (m − 1) × n.
    pseudo: Vec<f32>,
}

impl SingleQuerySinkhorn {
    /// Reads the gallery and a sample of `setup.pseudo_queries` bank rows
    /// drawn with `seed`, after checking the cost for `queries` test
    /// queries and the memory (`budget` bytes).
    pub fn prepare(
        gallery: &EmbeddingTable,
        bank: &EmbeddingTable,
        queries: u64,
        setup: SingleQuerySetup,
        seed: u64,
        budget: usize,
    ) -> Result<Self> {
        let SingleQuerySetup {
            pseudo_queries,
            tau,
            iterations,
        } = setup;
        let n = gallery.rows as usize;
        let m = pseudo_queries.min(bank.rows as usize) + 1;
        check_protocol_cost(queries, m, n, iterations)?;
        let threads = rayon::current_num_threads().max(1);
        // Gallery, pseudo-test similarities, a group of query rows and per
        // worker f, the column sums and the scores.
        let group = ((budget / 8).min(16 << 20) / (n.max(1) * 4)).clamp(1, 512);
        let needed = (n * gallery.dim + (m - 1) * n + group * n) * 4 + threads * 4 * n * 4;
        if needed > budget / 2 {
            return Err(HubnormError::Budget(format!(
                "sinkhorn-pp holds the gallery and the pseudo-test similarities in memory: {} needed, more than half of --memory-limit {}; raise the limit or use --method sn",
                human_bytes(needed as u64),
                human_bytes(budget as u64)
            )));
        }
        let read_all = |table: &EmbeddingTable| -> Result<Vec<f32>> {
            let mut data = Vec::with_capacity(table.rows as usize * table.dim);
            let mut blocks = table.blocks(4096);
            while let Some(block) = blocks.next_block()? {
                data.extend_from_slice(&block.data);
            }
            Ok(data)
        };
        let gallery_data = read_all(gallery)?;
        let sample = bank.sampled((m - 1) as u64, seed)?;
        let pseudo_embeddings = read_all(&sample)?;
        let dim = gallery.dim;
        let mut pseudo = vec![0f32; (m - 1) * n];
        pseudo
            .par_chunks_mut(n)
            .zip(pseudo_embeddings.par_chunks(dim.max(1)))
            .for_each(|(row, p)| similarity_tile(row, n, p, 1, &gallery_data, n, dim));
        Ok(SingleQuerySinkhorn {
            group,
            tau,
            iterations,
            dim,
            gallery: gallery_data,
            n,
            pseudo,
        })
    }

    /// The search state of every query of a block (row-major `queries`):
    /// its top-`k` by s(q, g) − f_q(g), and the full-gallery rank counts of
    /// its best positive.
    pub fn search_block(
        &self,
        queries: &[f32],
        positives: &Positives,
        k: usize,
    ) -> Vec<QueryState> {
        let dim = self.dim.max(1);
        let rows = queries.len() / dim;
        // Similarities of a group of queries in one GEMM (one call per query
        // would repack the whole gallery every time).
        let group = self.group;
        let mut states = Vec::with_capacity(rows);
        let mut raw = vec![0f32; group * self.n];
        for start in (0..rows).step_by(group) {
            let count = group.min(rows - start);
            let raw = &mut raw[..count * self.n];
            similarity_tile(
                raw,
                self.n,
                &queries[start * dim..(start + count) * dim],
                count,
                &self.gallery,
                self.n,
                self.dim,
            );
            let group_states: Vec<QueryState> = raw
                .par_chunks(self.n.max(1))
                .enumerate()
                .map(|(i, row)| self.search_one(row, positives.of(start + i), k))
                .collect();
            states.extend(group_states);
        }
        states
    }

    fn search_one(&self, raw: &[f32], positives: &[u32], k: usize) -> QueryState {
        let f = self.potentials(raw);
        let scores: Vec<f32> = raw.iter().zip(&f).map(|(&s, &fv)| s - fv).collect();
        let target = positives
            .iter()
            .map(|&p| scores[p as usize])
            .fold(None, |best: Option<f32>, v| {
                Some(best.map_or(v, |b| b.max(v)))
            });
        let mut state = QueryState::new(k, target);
        for (j, (&v, &s)) in scores.iter().zip(raw).enumerate() {
            if let Some(t) = target {
                if !positives.contains(&(j as u32)) {
                    state.greater += (v > t) as u64;
                    state.equal += (v == t) as u64;
                }
            }
            if v > state.top.threshold() {
                state.top.push(Candidate {
                    score: v,
                    raw: s,
                    row: j as u32,
                });
            }
        }
        state
    }

    /// The column potential f after T iterations on [q's row; pseudo rows].
    fn potentials(&self, query_row: &[f32]) -> Vec<f32> {
        stack_column_potential(query_row, &self.pseudo, self.tau as f32, self.iterations)
    }
}
