//! The similarity tile: S = A·Bᵀ for row-major embedding blocks, by the `gemm`
//! crate (AVX-512 kernels chosen at run time through its `x86-v4` feature), or
//! by a system BLAS the process chose once with [`use_blas`] (the command line's
//! `HUBNORM_BLAS`).
//!
//! Every tile element has one summation order whatever the tile's shape
//! ([`tile_score`]); the few shapes the crate sums otherwise are computed
//! here (`examples/small_tiles.rs` times them against the crate's kernels).
//!
//! Before touching this, run `cargo bench --bench kernel` and compare
//! `similarity_tile/gemm` against `similarity_tile/naive` and the machine
//! peak in DESIGN.md.

use std::path::Path;
use std::sync::OnceLock;

pub mod blas;
#[cfg(target_arch = "x86_64")]
mod slabs;

use self::blas::{Blas, BlasError};
#[cfg(target_arch = "x86_64")]
pub use self::slabs::SlabTiles;

/// The BLAS every tile uses, when one was chosen; otherwise the `gemm` crate.
static BLAS: OnceLock<Blas> = OnceLock::new();

/// Makes every later similarity tile of this process use `cblas_sgemm` from the
/// shared library at `path` (see [`blas()`]). Once per process: a second
/// call, even with the same path, is refused, because tiles already computed
/// would not match later ones bit for bit.
pub fn use_blas(path: &Path) -> Result<(), BlasError> {
    let already = |current: &Blas| BlasError::AlreadyInUse {
        path: path.to_path_buf(),
        current: current.path().to_path_buf(),
    };
    // Checked before loading: a library that is already in use may refuse
    // the set-up calls that `Blas::load` makes (MKL's mode is set once).
    if let Some(current) = BLAS.get() {
        return Err(already(current));
    }
    let blas = Blas::load(path)?;
    BLAS.set(blas)
        .map_err(|_| already(BLAS.get().expect("set by the thread that won")))
}

/// The BLAS chosen with [`use_blas`], if any.
pub fn blas() -> Option<&'static Blas> {
    BLAS.get()
}

/// Which GEMM's bits the tiles have: `gemm crate` or `blas:<path>`. Recorded
/// in the outputs' metadata, since the last bits of a score depend on it.
/// `gemm crate` also where [`SlabTiles`] computed them: with the crate's
/// bits.
pub fn backend_name() -> String {
    match BLAS.get() {
        Some(blas) => format!("blas:{}", blas.path().display()),
        None => "gemm crate".into(),
    }
}

/// Writes `out[i * ld_out + j] = ⟨a_i, b_j⟩` for the `m` rows of `a` and the
/// `n` rows of `b`, both row-major with `dim` columns. Single-threaded: the
/// passes parallelise over tiles, which keeps results independent of the thread
/// count.
///
/// # Panics
/// When a slice is shorter than its shape says (`a.len() < m * dim`,
/// `b.len() < n * dim`, `out.len() < (m - 1) * ld_out + n`) or `ld_out < n`.
pub fn similarity_tile(
    out: &mut [f32],
    ld_out: usize,
    a: &[f32],
    m: usize,
    b: &[f32],
    n: usize,
    dim: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ld_out >= n,
        "output stride {ld_out} is smaller than the tile width {n}"
    );
    assert!(
        a.len() >= m * dim && b.len() >= n * dim,
        "input slices shorter than their shapes"
    );
    assert!(
        out.len() >= (m - 1) * ld_out + n,
        "output slice shorter than its shape"
    );
    if dim == 0 {
        for i in 0..m {
            out[i * ld_out..i * ld_out + n].fill(0.0);
        }
        return;
    }
    if let Some(blas) = BLAS.get() {
        if blas.tile(out, ld_out, a, m, b, n, dim) {
            return;
        }
    }
    // Shapes the crate sums in another order (its small-matrix kernels,
    // its depth block for small tiles): the same chains, computed here.
    if let Some(scorer) = TileScorer::new(dim) {
        if !crate_sums_in_chains(m, n, dim, scorer.kc) {
            scorer.tile(out, ld_out, a, m, b, n);
            return;
        }
    }
    // SAFETY: the asserts above guarantee that every index the strides describe
    // lies inside the slices; `out` is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            dim,
            out.as_mut_ptr(),
            1,               // dst column stride
            ld_out as isize, // dst row stride
            false,           // do not read dst
            a.as_ptr(),
            1,            // lhs column stride (over dim)
            dim as isize, // lhs row stride
            b.as_ptr(),
            dim as isize, // rhs column stride: column j of Bᵀ is row j of B
            1,            // rhs row stride (over dim)
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The bits [`similarity_tile`] writes for rows `q` and `g` (of any
/// `dim = q.len()`), computed for this one pair: what a screened search
/// re-scores its candidates with, so that they come out exactly as the
/// full tile would have them. `None` where the tiles take a path whose
/// summation order this does not reproduce: a system BLAS, or a CPU
/// without FMA (the `gemm` crate's scalar kernel).
///
/// Every element of a tile, whatever the tile's shape, is a chain of fused
/// multiply-adds from +0 over each depth block of `depth_block`
/// dimensions, in order, the blocks' sums added to the element in order:
/// what the `gemm` crate (0.19) computes with its AVX-512 or, without
/// AVX-512F, its AVX2/FMA microkernel for tiles beyond 64 × 64. The shapes
/// it sums otherwise (one row or column, at most 256 elements, `dim` ≤ 2,
/// and at most 64 × 64 where its depth block is then another) are computed
/// by `TileScorer::tile` instead, so a pair's score does not depend on
/// the batch, chunk or shard it was computed in.
/// `tests::tile_scores_are_the_tiles_bits` holds this to the crate's output,
/// `tests::tile_elements_do_not_depend_on_the_tile_shape` to every shape.
pub fn tile_score(q: &[f32], g: &[f32]) -> Option<f32> {
    let mut out = [0f32];
    TileScorer::new(q.len())?.scores(&[(q, g)], &mut out);
    Some(out[0])
}

/// [`tile_score`] for many elements: the depth blocks worked out once, and
/// several elements computed together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileScorer {
    dim: usize,
    kc: usize,
}

impl TileScorer {
    /// Elements one batch of [`TileScorer::scores`] computes side by side.
    pub const BATCH: usize = CHAINS;

    /// The scorer of `dim`-dimensional rows, or `None` where [`tile_score`]
    /// gives `None`.
    pub fn new(dim: usize) -> Option<TileScorer> {
        reproducible().then(|| TileScorer {
            dim,
            kc: depth_block(dim),
        })
    }

    /// The tile's elements of the (query row, gallery row) pairs `items`:
    /// `out[l]` for `items[l]`. The pairs' chains run interleaved, so a
    /// batch of them costs about one chain's latency.
    ///
    /// # Panics
    /// When a row's length is not the scorer's dimension, or `out` is
    /// shorter than `items`.
    pub fn scores(&self, items: &[(&[f32], &[f32])], out: &mut [f32]) {
        assert!(
            items
                .iter()
                .all(|(q, g)| q.len() == self.dim && g.len() == self.dim),
            "rows of another dimension"
        );
        assert!(out.len() >= items.len(), "one output per item");
        for (items, out) in items.chunks(CHAINS).zip(out.chunks_mut(CHAINS)) {
            #[cfg(target_arch = "x86_64")]
            if super::dispatch::has_avx512() {
                // SAFETY: the features were detected; the rows' lengths were checked.
                unsafe { transposed_chains::chains(items, self.kc, out) };
                continue;
            }
            interleaved_chains(items, self.kc, out);
        }
    }

    /// A whole tile as [`similarity_tile`] has it: `out[i · ld + j]` for
    /// the `m` rows of `a` and the `n` rows of `b`, [`CHAINS`] elements at
    /// a time in row-major order (so a one-column tile fills every lane).
    fn tile(&self, out: &mut [f32], ld: usize, a: &[f32], m: usize, b: &[f32], n: usize) {
        let dim = self.dim;
        let cell = |c: usize| (c / n, c % n);
        let mut items: [(&[f32], &[f32]); CHAINS] = [(&[], &[]); CHAINS];
        let mut values = [0f32; CHAINS];
        let cells = m * n;
        for first in (0..cells).step_by(CHAINS) {
            let count = CHAINS.min(cells - first);
            for (l, item) in items[..count].iter_mut().enumerate() {
                let (i, j) = cell(first + l);
                *item = (&a[i * dim..(i + 1) * dim], &b[j * dim..(j + 1) * dim]);
            }
            self.scores(&items[..count], &mut values);
            for (l, &value) in values[..count].iter().enumerate() {
                let (i, j) = cell(first + l);
                out[i * ld + j] = value;
            }
        }
    }
}

/// Chains [`TileScorer::scores`] runs side by side (one per AVX-512 lane).
const CHAINS: usize = 16;

mod chain_bodies {
    use super::CHAINS;

    /// Up to [`CHAINS`] tile elements: for each pair of rows, fused
    /// multiply-adds from +0 over each depth block of `kc`, the blocks'
    /// sums added in order (short batches repeat their last pair).
    #[inline(always)]
    pub fn interleaved_chains(items: &[(&[f32], &[f32])], kc: usize, out: &mut [f32]) {
        let dim = items[0].0.len();
        let rows: [(&[f32], &[f32]); CHAINS] = std::array::from_fn(|l| {
            let (q, g) = items[l.min(items.len() - 1)];
            (&q[..dim], &g[..dim])
        });
        let mut element = [0f32; CHAINS];
        let mut start = 0;
        while start < dim {
            let end = (start + kc).min(dim);
            let mut sum = [0f32; CHAINS];
            for k in start..end {
                for l in 0..CHAINS {
                    sum[l] = rows[l].0[k].mul_add(rows[l].1[k], sum[l]);
                }
            }
            for l in 0..CHAINS {
                element[l] = if start == 0 {
                    sum[l]
                } else {
                    element[l] + sum[l]
                };
            }
            start = end;
        }
        let count = items.len();
        out[..count].copy_from_slice(&element[..count]);
    }
}

/// [`chain_bodies::interleaved_chains`] on AVX-512 without gathering:
/// 16 values of each of the 16 rows on each side are loaded as vectors and
/// transposed in registers, so that lane `l` of the `k`-th vector holds
/// pair `l`'s `k`-th value; then one fused multiply-add per dimension serves
/// all 16 chains, in the same order with the same roundings.
#[cfg(target_arch = "x86_64")]
mod transposed_chains {
    use super::CHAINS;
    use std::arch::x86_64::*;

    const LANES: usize = 16;
    const _: () = assert!(CHAINS == LANES);

    /// # Safety
    /// AVX-512F must be available; every row holds the first row's length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn chains(items: &[(&[f32], &[f32])], kc: usize, out: &mut [f32]) {
        let dim = items[0].0.len();
        let (q, g): ([*const f32; LANES], [*const f32; LANES]) = {
            let row = |l: usize| items[l.min(items.len() - 1)];
            (
                std::array::from_fn(|l| row(l).0.as_ptr()),
                std::array::from_fn(|l| row(l).1.as_ptr()),
            )
        };
        let q_shared = q.iter().all(|&row| row == q[0]);
        let g_shared = g.iter().all(|&row| row == g[0]);
        let mut element = _mm512_setzero_ps();
        let mut start = 0;
        while start < dim {
            let end = (start + kc).min(dim);
            let mut sum = _mm512_setzero_ps();
            let mut k = start;
            while k < end {
                let count = (end - k).min(LANES);
                let mask: __mmask16 = if count == LANES { !0 } else { (1 << count) - 1 };
                if q_shared {
                    // One query row for every pair (a one-row tile, a
                    // row's candidates): its values broadcast, not
                    // transposed; the same products in the same order.
                    let gt = transposed(&g, k, mask);
                    for (step, &gt) in gt.iter().enumerate().take(count) {
                        sum = _mm512_fmadd_ps(_mm512_set1_ps(*q[0].add(k + step)), gt, sum);
                    }
                } else if g_shared {
                    let qt = transposed(&q, k, mask);
                    for (step, &qt) in qt.iter().enumerate().take(count) {
                        sum = _mm512_fmadd_ps(qt, _mm512_set1_ps(*g[0].add(k + step)), sum);
                    }
                } else {
                    let qt = transposed(&q, k, mask);
                    let gt = transposed(&g, k, mask);
                    for step in 0..count {
                        sum = _mm512_fmadd_ps(qt[step], gt[step], sum);
                    }
                }
                k += count;
            }
            element = if start == 0 {
                sum
            } else {
                _mm512_add_ps(element, sum)
            };
            start = end;
        }
        let mut lanes = [0f32; LANES];
        _mm512_storeu_ps(lanes.as_mut_ptr(), element);
        let count = items.len();
        out[..count].copy_from_slice(&lanes[..count]);
    }

    /// Vectors `t` with lane `l` of `t[j]` = `rows[l][k + j]`, for the `j`
    /// in `mask` (0 elsewhere).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transposed(rows: &[*const f32; LANES], k: usize, mask: __mmask16) -> [__m512; LANES] {
        let r: [__m512; LANES] =
            std::array::from_fn(|l| _mm512_maskz_loadu_ps(mask, rows[l].add(k)));
        // Within each 128-bit lane: pairs of rows, then fours.
        let t: [__m512; LANES] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4i + j]: in 128-bit lane L, element 4L + j of rows 4i..4i + 3.
        let u: [__m512d; LANES] = std::array::from_fn(|n| {
            let (i, j) = (n / 4, n % 4);
            let a = _mm512_castps_pd(t[4 * i + j / 2]);
            let b = _mm512_castps_pd(t[4 * i + 2 + j / 2]);
            if j % 2 == 0 {
                _mm512_unpacklo_pd(a, b)
            } else {
                _mm512_unpackhi_pd(a, b)
            }
        });
        let u: [__m512; LANES] = std::array::from_fn(|n| _mm512_castpd_ps(u[n]));
        // Across the 128-bit lanes: element 4L + j gathers lane L of
        // u[j], u[4 + j], u[8 + j], u[12 + j].
        let mut out = [_mm512_setzero_ps(); LANES];
        for j in 0..4 {
            let even01 = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let odd01 = _mm512_shuffle_f32x4::<0xdd>(u[j], u[4 + j]);
            let even23 = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let odd23 = _mm512_shuffle_f32x4::<0xdd>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_f32x4::<0x88>(even01, even23);
            out[8 + j] = _mm512_shuffle_f32x4::<0xdd>(even01, even23);
            out[4 + j] = _mm512_shuffle_f32x4::<0x88>(odd01, odd23);
            out[12 + j] = _mm512_shuffle_f32x4::<0xdd>(odd01, odd23);
        }
        out
    }
}

super::dispatch::dispatched! {
    fn interleaved_chains(items: &[(&[f32], &[f32])], kc: usize, out: &mut [f32])
        = chain_bodies::interleaved_chains;
}

/// Stands in for the AVX-512 slab kernel where there is none.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Debug)]
pub enum SlabTiles {}

#[cfg(not(target_arch = "x86_64"))]
impl SlabTiles {
    /// Always `None`: no slab kernel on this architecture.
    pub fn new() -> Option<SlabTiles> {
        None
    }

    /// Never called: no value exists.
    pub fn pack_columns(&mut self, _cols: &[f32], _n: usize, _dim: usize) {
        match *self {}
    }

    /// Never called: no value exists.
    pub fn slab(&self, _out: &mut [f32], _ld: usize, _rows: &[f32], _m: usize, _kc: usize) {
        match *self {}
    }
}

/// The depth block with which [`SlabTiles::slab`] reproduces the elements
/// of tiles of `dim`-dimensional rows as [`similarity_tile`] computes them,
/// or `None` where it does not ([`reproducible`]) or `dim` is 0.
pub fn slab_depth(dim: usize) -> Option<usize> {
    (reproducible() && dim > 0).then(|| depth_block(dim))
}

/// Whether [`tile_score`] reproduces the elements of every tile in this
/// process: no system BLAS, and a CPU with one of the crate's FMA
/// microkernels.
pub fn reproducible() -> bool {
    BLAS.get().is_none() && Microkernel::of_this_cpu().is_some()
}

/// Whether the `gemm` crate computes an `m × n` tile of `dim`-dimensional
/// rows as [`tile_score`] does, with depth block `kc` ([`depth_block`]).
/// Its other routes: the matrix-vector kernels for one row or column,
/// horizontal dot products for tiles of at most 16 × 16 elements, outer
/// products for `dim` ≤ 2, and for tiles of at most 64 × 64 the depth
/// block `min(dim, 512)`.
fn crate_sums_in_chains(m: usize, n: usize, dim: usize, kc: usize) -> bool {
    dim > 2 && m > 1 && n > 1 && m * n > 256 && (m > 64 || n > 64 || dim.min(512) == kc)
}

/// The `gemm` crate's f32 microkernels whose summation order [`TileScorer`]
/// reproduces; the crate picks one at run time as this does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Microkernel {
    /// 4 × 16 rows by 6 columns (its `x86-v4` feature, on with ours).
    Avx512,
    /// 2 × 8 rows by 6 columns.
    Fma,
}

impl Microkernel {
    fn of_this_cpu() -> Option<Microkernel> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Some(Microkernel::Avx512);
            }
            if std::arch::is_x86_feature_detected!("fma") {
                return Some(Microkernel::Fma);
            }
        }
        None
    }

    /// Rows and columns of the microkernel's block of the destination.
    fn shape(self) -> (usize, usize) {
        match self {
            Microkernel::Avx512 => (64, 6),
            Microkernel::Fma => (16, 6),
        }
    }
}

/// The depth block of every tile element's chain: the `gemm` crate's for
/// tiles beyond 64 × 64, which depends on the depth, the microkernel and
/// the caches only (not on the tile's rows and columns).
fn depth_block(dim: usize) -> usize {
    let (mr, nr) = Microkernel::of_this_cpu()
        .expect("asked only where reproducible")
        .shape();
    let beyond_small = 65;
    gemm_common::cache::kernel_params(
        beyond_small,
        beyond_small,
        dim,
        mr,
        nr,
        std::mem::size_of::<f32>(),
    )
    .kc
}

/// The textbook triple loop, kept as the baseline the benchmark compares with
/// and as a reference in tests. Never used on the hot path.
pub fn naive_similarity_tile(
    out: &mut [f32],
    ld_out: usize,
    a: &[f32],
    m: usize,
    b: &[f32],
    n: usize,
    dim: usize,
) {
    for i in 0..m {
        let ai = &a[i * dim..(i + 1) * dim];
        for j in 0..n {
            let bj = &b[j * dim..(j + 1) * dim];
            out[i * ld_out + j] = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_with_padding() {
        let (m, n, dim, ld) = (7, 5, 13, 9);
        let a: Vec<f32> = (0..m * dim)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..n * dim)
            .map(|i| ((i * 53 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let mut fast = vec![f32::NAN; m * ld];
        let mut slow = vec![f32::NAN; m * ld];
        similarity_tile(&mut fast, ld, &a, m, &b, n, dim);
        naive_similarity_tile(&mut slow, ld, &a, m, &b, n, dim);
        for i in 0..m {
            for j in 0..n {
                let (x, y) = (fast[i * ld + j], slow[i * ld + j]);
                assert!((x - y).abs() < 1e-5, "({i},{j}): {x} vs {y}");
            }
            // Padding beyond the tile width is left alone.
            assert!(fast[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan()));
        }
    }

    /// Seeded values of both signs and of magnitudes from 1e-20 to 1.5
    /// (tiny ones make products round and underflow).
    pub(super) fn mixed_magnitudes(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * [1.0f32, 1e-3, 1e-20, 3.0][(state % 4) as usize]
        }
    }

    /// Every element of tiles of the search's shape and of edge shapes, at
    /// dimensions on both sides of the depth blocks, equals `tile_score`'s
    /// bits; values span magnitudes (tiny ones make products round and
    /// underflow) and signs, so that a different order would show.
    #[test]
    #[allow(clippy::print_stderr)] // a skipped test says so
    fn tile_scores_are_the_tiles_bits() {
        if Microkernel::of_this_cpu().is_none() {
            eprintln!("SKIPPED: no FMA here: the gemm crate takes its scalar kernel");
            return;
        }
        let mut next = mixed_magnitudes(0x9e37_79b9_7f4a_7c15);
        let shapes = [
            (512, 2048),
            (100, 37),
            (65, 65),
            (64, 64),
            (2, 200),
            (17, 300),
        ];
        let mut checked = 0;
        for &(m, n) in &shapes {
            for dim in [3, 384, 511, 513, 768, 1000, 1537, 4096] {
                // The shapes the crate sums otherwise are computed with
                // `tile_score`'s chains: nothing to compare there.
                if !crate_sums_in_chains(m, n, dim, depth_block(dim)) {
                    continue;
                }
                let a: Vec<f32> = (0..m * dim).map(|_| next()).collect();
                let b: Vec<f32> = (0..n * dim).map(|_| next()).collect();
                let mut out = vec![0.0f32; m * n];
                similarity_tile(&mut out, n, &a, m, &b, n, dim);
                for i in (0..m).step_by(7) {
                    for j in (0..n).step_by(5) {
                        let q = &a[i * dim..(i + 1) * dim];
                        let g = &b[j * dim..(j + 1) * dim];
                        let expected = out[i * n + j];
                        let got = tile_score(q, g).expect("a microkernel tile");
                        assert_eq!(
                            got.to_bits(),
                            expected.to_bits(),
                            "{m}×{n} tile, dim {dim}, element ({i}, {j}): {got} vs {expected}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    /// Tiles cut from a larger one in the shapes the `gemm` crate sums in
    /// other orders (one row, one column, one element, at most 256
    /// elements, at most 64 × 64 at depths beyond 512) and in shapes it
    /// sums in chains have the larger tile's bits, element for element: a
    /// pair's score does not depend on the batch, chunk or shard holding it.
    #[test]
    #[allow(clippy::print_stderr)] // a skipped test says so
    fn tile_elements_do_not_depend_on_the_tile_shape() {
        if !reproducible() {
            eprintln!("SKIPPED: no FMA here: the gemm crate takes its scalar kernel");
            return;
        }
        let mut next = mixed_magnitudes(0x6a09_e667_f3bc_c908);
        let (m, n) = (130, 150);
        // (first row, rows, first column, columns) of each cut.
        let cuts = [
            (7, 1, 0, 150),
            (0, 130, 9, 1),
            (3, 1, 4, 1),
            (10, 16, 20, 16),
            (1, 2, 5, 100),
            (60, 64, 80, 64),
            (64, 65, 3, 3),
            (2, 17, 101, 15),
            (0, 130, 0, 150),
        ];
        let mut checked = 0;
        for dim in [1, 2, 3, 384, 513, 768, 1537] {
            let a: Vec<f32> = (0..m * dim).map(|_| next()).collect();
            let b: Vec<f32> = (0..n * dim).map(|_| next()).collect();
            let mut whole = vec![0.0f32; m * n];
            similarity_tile(&mut whole, n, &a, m, &b, n, dim);
            for &(r0, rows, c0, cols) in &cuts {
                let ld = cols + 3;
                let mut cut = vec![f32::NAN; rows * ld];
                let a_cut = &a[r0 * dim..(r0 + rows) * dim];
                let b_cut = &b[c0 * dim..(c0 + cols) * dim];
                similarity_tile(&mut cut, ld, a_cut, rows, b_cut, cols, dim);
                for i in 0..rows {
                    for j in 0..cols {
                        let (got, expected) = (cut[i * ld + j], whole[(r0 + i) * n + c0 + j]);
                        assert_eq!(
                            got.to_bits(),
                            expected.to_bits(),
                            "{rows}×{cols} cut at ({r0}, {c0}), dim {dim}, element ({i}, {j}): \
                             {got} vs {expected}"
                        );
                        checked += 1;
                    }
                    assert!(cut[i * ld + cols..(i + 1) * ld].iter().all(|v| v.is_nan()));
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    /// The AVX-512 chains (rows transposed in registers, or a shared row
    /// broadcast) give the portable chains' bits for every batch length,
    /// depth block and dimension, including dimensions and blocks that end
    /// mid-vector.
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::print_stderr)] // a skipped test says so
    fn transposed_chains_are_the_portable_chains() {
        if !crate::kernel::dispatch::has_avx512() {
            eprintln!("SKIPPED: no AVX-512 here");
            return;
        }
        let mut next = mixed_magnitudes(0x2545_f491_4f6c_dd1d);
        for dim in [1, 3, 16, 17, 31, 384, 513, 768] {
            let rows: Vec<Vec<f32>> = (0..2 * CHAINS)
                .map(|_| (0..dim).map(|_| next()).collect())
                .collect();
            for kc in [1, 5, 16, 40, 256, dim] {
                // Pairs of distinct rows, and pairs sharing their query
                // row or their gallery row (broadcast, not transposed).
                type RowsOf = fn(usize) -> (usize, usize);
                let pairings: [(&str, RowsOf); 3] = [
                    ("distinct", |l| (l, CHAINS + l)),
                    ("one query row", |l| (3, CHAINS + l)),
                    ("one gallery row", |l| (l, CHAINS + 5)),
                ];
                for (pairing, rows_of) in pairings {
                    for count in [1, 7, CHAINS] {
                        let items: Vec<(&[f32], &[f32])> = (0..count)
                            .map(|l| {
                                let (q, g) = rows_of(l);
                                (rows[q].as_slice(), rows[g].as_slice())
                            })
                            .collect();
                        let (mut fast, mut portable) = ([f32::NAN; CHAINS], [f32::NAN; CHAINS]);
                        // SAFETY: AVX-512F was detected; the rows have one length.
                        unsafe { transposed_chains::chains(&items, kc, &mut fast) };
                        chain_bodies::interleaved_chains(&items, kc, &mut portable);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&fast),
                            bits(&portable),
                            "dim {dim}, kc {kc}, {count} pairs, {pairing}"
                        );
                    }
                }
            }
        }
    }
}
